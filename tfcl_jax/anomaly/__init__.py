"""Anomaly detection with contrastive fine-tuning: MSC (Section 5.3, Table 4 of the paper).

`msc`: the mean-shifted loss, center and frozen-module optimiser (the train-step loss is
`tfcl_jax.objectives.make_msc_loss`); `scores`: kNN score and ROC-AUC;
`weights`: pretrained encoders from checkpoints; `torchvision_resnet`: weight conversion.
"""

from tfcl_jax.anomaly import msc, scores, torchvision_resnet, weights
from tfcl_jax.anomaly.msc import angular_center_loss, center, mean_shift, msc_loss
from tfcl_jax.anomaly.scores import knn_score, roc_auc
from tfcl_jax.anomaly.weights import CheckpointMismatchError, load_variables, save_variables

__all__ = [
    "CheckpointMismatchError", "angular_center_loss", "center", "knn_score", "load_variables",
    "mean_shift", "msc", "msc_loss", "roc_auc", "save_variables", "scores",
    "torchvision_resnet", "weights",
]
