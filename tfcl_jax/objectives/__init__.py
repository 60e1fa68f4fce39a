"""The paper's Section 5 objectives as `loss_fn` functions for `training.make_train_step`.

`simclr` (Section 5.1, Table 2), `grace` (5.2, Table 3), `msc` (5.3, Table 4), `dcrec` (Table 6)
and `retrieval` (two-tower retrieval): each encodes two views of its data and compares them with
a loss (`losses.Loss`: InfoNCE under any mapping, Eq. 1 with `tau` or Eq. 11 temperature-free,
or another family), whose trainable scalars are the train state's `params["loss"]`. Each calls
`Loss.evaluate` and logs what the loss reports (`Evaluation.metrics`: a scale solved from each
batch as `loss/scale`).
"""

from tfcl_jax.objectives import dcrec, grace, msc, retrieval, simclr, views
from tfcl_jax.objectives.dcrec import make_dcrec_loss
from tfcl_jax.objectives.grace import GraphBatch, make_grace_loss
from tfcl_jax.objectives.msc import make_msc_loss
from tfcl_jax.objectives.retrieval import make_retrieval_loss
from tfcl_jax.objectives.simclr import embed, make_feature_fn, make_simclr_loss
from tfcl_jax.objectives.views import (
    AugmentFn,
    cosine_diagnostics,
    encode_two_views,
)

__all__ = [
    "AugmentFn", "GraphBatch", "cosine_diagnostics", "dcrec", "embed", "encode_two_views", "grace",
    "make_dcrec_loss", "make_feature_fn", "make_grace_loss", "make_msc_loss",
    "make_retrieval_loss", "make_simclr_loss", "msc", "retrieval", "simclr",
    "views",
]
