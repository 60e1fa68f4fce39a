"""Evaluation of frozen representations: weighted kNN top-1 (Table 2's metric), linear probe,
and label-free scores (RankMe, α-ReQ, LiDAR, alignment, uniformity, view-to-view retrieval)."""

from tfcl_jax.evaluation import knn, label_free
from tfcl_jax.evaluation.knn import knn_predict, knn_top1

__all__ = ["knn", "knn_predict", "knn_top1", "label_free"]
