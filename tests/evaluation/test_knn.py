"""Weighted kNN (Wu et al. 2018) against a NumPy reference written here."""

from __future__ import annotations

import numpy as np
import pytest

from tfcl_jax.evaluation import knn


def _reference_scores(query, bank, labels, *, num_classes, k, tau):
  query = query / np.linalg.norm(query, axis=1, keepdims=True)
  bank = bank / np.linalg.norm(bank, axis=1, keepdims=True)
  scores = np.zeros((len(query), num_classes))
  for i, q in enumerate(query):
    similarity = bank @ q
    for j in np.argsort(-similarity)[:k]:
      scores[i, labels[j]] += np.exp(similarity[j] / tau)
  return scores


@pytest.mark.parametrize("k,num_queries", [(1, 7), (5, 13), (200, 40)])
def test_knn_scores_match_numpy_reference(k, num_queries):
  rng = np.random.default_rng(k)
  bank = rng.normal(size=(60, 5)).astype(np.float32)
  labels = rng.integers(0, 4, 60).astype(np.int32)
  query = rng.normal(size=(num_queries, 5)).astype(np.float32)
  expected = _reference_scores(query, bank, labels, num_classes=4, k=min(k, 60), tau=0.1)
  scores = knn.knn_predict(query, bank, labels, num_classes=4, k=k, tau=0.1, chunk_size=8)
  np.testing.assert_allclose(scores, expected, rtol=1e-4)
  test_labels = rng.integers(0, 4, num_queries)
  accuracy = knn.knn_top1(bank, labels, query, test_labels, num_classes=4, k=k)
  assert accuracy == pytest.approx(np.mean(expected.argmax(1) == test_labels))


def test_knn_separable_clusters_are_classified_perfectly():
  rng = np.random.default_rng(0)
  centers = np.eye(3, 8) * 10
  labels = np.repeat(np.arange(3), 20).astype(np.int32)
  bank = centers[labels] + rng.normal(size=(60, 8))
  assert knn.knn_top1(bank, labels, bank, labels, num_classes=3, k=10) == 1.0


def test_knn_bad_inputs():
  bank = np.zeros((4, 3), np.float32)
  with pytest.raises(ValueError, match="same feature size"):
    knn.knn_predict(np.zeros((2, 2), np.float32), bank, np.zeros(4, np.int32), num_classes=2)
  with pytest.raises(TypeError, match="bank_labels must have an integer dtype"):
    knn.knn_predict(bank, bank, np.zeros(4, np.float32), num_classes=2)
  with pytest.raises(ValueError, match="bank_labels must have shape"):
    knn.knn_predict(bank, bank, np.zeros(3, np.int32), num_classes=2)
  with pytest.raises(ValueError, match="k must be an int >= 1"):
    knn.knn_predict(bank, bank, np.zeros(4, np.int32), num_classes=2, k=0)
