"""Contrastive losses with a pluggable similarity-to-logit mapping, on one tiled engine.

InfoNCE / NT-Xent and CLIP's two-tower loss (Section 2, Eq. 1; Eq. 11-12 with the default
temperature-free mapping), with extra negatives from a queue; SigLIP's sigmoid loss; the same
losses across devices; the supervised contrastive loss; the softmax over raw dot products;
`batch_scale`, the scale a batch-scaled mapping (`mappings.calibrated_free` ...) takes on a batch.
`from_spec` reads a loss spec (docs/specs.md) into a `Loss`, a loss family (`InfoNCELoss`,
`SigmoidLoss`, `DotProductLoss`) with its mapping and its parameters; each family registers its
spec forms in `SPECS`. Every cosine loss runs the tiled engine: dense logits are its one-tile
case, chosen automatically where they are faster.

Derivatives: each tiled loss's gradient is a custom VJP that recomputes the tiles backward.
Reverse mode (`jax.grad`, `jax.vjp`, `jax.jacrev`) and second derivatives work: `jax.hessian`,
Hessian-vector products `jax.jvp(jax.grad(f), (x,), (v,))` (forward over reverse) and
`jax.jacrev(jax.jacrev(f))`. Forward mode (`jax.jvp`, `jax.jacfwd`, `jax.linearize`) is refused
at the loss with a `TypeError` naming these; `implementation="pallas"` has first derivatives only.
The dense `supervised_info_nce(form="ntxent")` and `dot_product_softmax` take forward mode too.
"""

from tfcl_jax.losses import queue
from tfcl_jax.losses._batch_scale import batch_scale, supervised_batch_scale
from tfcl_jax.losses._dot import DotProductLoss, dot_product_softmax
from tfcl_jax.losses._engine._arguments import check_block_size
from tfcl_jax.losses._engine._blocks import auto_block_size, balanced_tile
from tfcl_jax.losses._engine._devices import STRATEGIES
from tfcl_jax.losses._engine._layout import l2_normalize, norm_floor
from tfcl_jax.losses._family import Evaluation
from tfcl_jax.losses._info_nce import InfoNCELoss, info_nce, info_nce_on_mesh, sharded_info_nce
from tfcl_jax.losses._sigmoid import (
    SigmoidLoss,
    sharded_sigmoid_loss,
    sigmoid_bias_init,
    sigmoid_loss,
    sigmoid_loss_on_mesh,
)
from tfcl_jax.losses._supervised import supervised_info_nce
from tfcl_jax.losses.spec import (
    SPECS,
    LogQ,
    Loss,
    as_loss,
    canonical_spec,
    from_spec,
    num_candidates,
)

__all__ = [
    "SPECS",
    "DotProductLoss",
    "Evaluation",
    "InfoNCELoss",
    "LogQ",
    "Loss",
    "STRATEGIES",
    "SigmoidLoss",
    "as_loss",
    "auto_block_size",
    "balanced_tile",
    "batch_scale",
    "canonical_spec",
    "check_block_size",
    "dot_product_softmax",
    "from_spec",
    "info_nce",
    "info_nce_on_mesh",
    "l2_normalize",
    "norm_floor",
    "num_candidates",
    "queue",
    "sharded_info_nce",
    "sharded_sigmoid_loss",
    "sigmoid_bias_init",
    "sigmoid_loss",
    "sigmoid_loss_on_mesh",
    "supervised_batch_scale",
    "supervised_info_nce",
]
