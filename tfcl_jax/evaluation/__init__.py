"""Evaluation of frozen representations: weighted kNN top-1 (Table 2's metric), linear probe."""

from tfcl_jax.evaluation import knn
from tfcl_jax.evaluation.knn import knn_predict, knn_top1

__all__ = ["knn", "knn_predict", "knn_top1"]
