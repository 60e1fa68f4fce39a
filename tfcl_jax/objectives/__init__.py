"""The paper's Section 5 objectives as `loss_fn` functions for `training.make_train_step`.

`simclr` (Section 5.1, Table 2), `grace` (5.2, Table 3) and `msc` (5.3, Table 4): each draws two
views, encodes them with one network (`views.encode_two_views`) and compares them with a
contrastive loss under any mapping (Eq. 1 with `tau`, Eq. 11 temperature-free).
"""

from tfcl_jax.objectives import grace, msc, simclr, views
from tfcl_jax.objectives.grace import GraphBatch, make_grace_loss
from tfcl_jax.objectives.msc import make_msc_loss
from tfcl_jax.objectives.simclr import embed, make_feature_fn, make_simclr_loss
from tfcl_jax.objectives.views import cosine_diagnostics, encode_two_views

__all__ = [
    "GraphBatch", "cosine_diagnostics", "embed", "encode_two_views", "grace", "make_feature_fn",
    "make_grace_loss", "make_msc_loss", "make_simclr_loss", "msc", "simclr", "views",
]
