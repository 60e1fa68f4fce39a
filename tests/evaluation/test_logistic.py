"""The JAX logistic-regression probe and PyGCL's LREvaluator protocol, against scikit-learn."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfcl_jax.evaluation import logistic

sklearn_linear = pytest.importorskip("sklearn.linear_model")
sklearn_metrics = pytest.importorskip("sklearn.metrics")


def _blobs(seed, n=300, d=8, classes=4, spread=1.5):
  rng = np.random.default_rng(seed)
  centres = rng.normal(size=(classes, d)) * spread
  labels = rng.integers(0, classes, n)
  return (centres[labels] + rng.normal(size=(n, d))).astype(np.float32), labels.astype(np.int32)


def _softmax(logits):
  logits = logits - logits.max(axis=1, keepdims=True)
  return np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)


def test_fit_matches_sklearn_optimum():
  """With L2 (weight and bias) the optimum is unique: sklearn finds it with L-BFGS, we with Adam."""
  features, labels = _blobs(0)
  train = np.arange(200)
  weight_decay = 0.01
  clf = logistic.fit_logistic_regression(
      features, labels, num_classes=4, train_indices=train, key=jax.random.key(0), epochs=3000,
      weight_decay=weight_decay)
  # sklearn: 0.5 |w|^2 + C sum CE; ours: mean CE + wd/2 |w|^2 -> C = 1 / (wd n). A constant
  # column stands in for our (penalised) bias.
  augmented = np.concatenate([features, np.ones((len(features), 1), np.float32)], axis=1)
  reference = sklearn_linear.LogisticRegression(
      C=1.0 / (weight_decay * len(train)), fit_intercept=False, tol=1e-10, max_iter=10_000)
  reference.fit(augmented[train], labels[train])
  ours = _softmax(np.asarray(features @ clf.weight + clf.bias))
  np.testing.assert_allclose(ours, reference.predict_proba(augmented), atol=2e-3)
  np.testing.assert_array_equal(np.asarray(logistic.predict(clf, features)),
                                reference.predict(augmented))


@pytest.mark.parametrize("seed", [0, 1])
def test_f1_scores_match_sklearn(seed):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 5, 200)
  predictions = np.where(rng.random(200) < 0.6, labels, rng.integers(0, 6, 200))
  predictions[predictions == 4] = 5  # class 4 never predicted, class 5 never true
  micro, macro = logistic.f1_scores(labels, predictions, num_classes=6)
  np.testing.assert_allclose(micro, sklearn_metrics.f1_score(labels, predictions, average="micro"),
                             rtol=1e-6)
  np.testing.assert_allclose(macro, sklearn_metrics.f1_score(labels, predictions, average="macro"),
                             rtol=1e-6)


def test_lr_evaluate_close_to_sklearn_on_same_split():
  """PyGCL protocol vs sklearn's unregularised fit on the same train split: same test accuracy."""
  features, labels = _blobs(1, n=600, spread=0.7)
  key = jax.random.key(3)
  result = logistic.lr_evaluate(features, labels, key=key, epochs=400)
  train, _, test = (np.asarray(i) for i in logistic.random_split(
      len(labels), key=jax.random.split(key)[0]))
  reference = sklearn_linear.LogisticRegression(C=1e4, max_iter=10_000).fit(
      features[train], labels[train])
  sklearn_micro = sklearn_metrics.f1_score(labels[test], reference.predict(features[test]),
                                           average="micro")
  assert abs(result["f1_micro"] - sklearn_micro) < 0.05, (result, sklearn_micro)
  assert set(result) == {"f1_micro", "f1_macro", "val_f1_micro", "best_epoch"}
  assert result["best_epoch"] % 20 == 0


def test_random_split_partitions():
  train, val, test = (np.asarray(i) for i in logistic.random_split(3327, key=jax.random.key(0)))
  assert (len(train), len(val), len(test)) == (332, 332, 2663)
  np.testing.assert_array_equal(np.sort(np.concatenate([train, val, test])), np.arange(3327))


def test_bad_inputs():
  features, labels = _blobs(0, n=20)
  with pytest.raises(ValueError, match="labels"):
    logistic.fit_logistic_regression(features, labels + 4, num_classes=4,
                                     train_indices=np.arange(5), key=jax.random.key(0))
  with pytest.raises(TypeError, match="features"):
    logistic.lr_evaluate(labels[:, None], labels, key=jax.random.key(0))
  with pytest.raises(ValueError, match="eval_every_epochs"):
    logistic.lr_evaluate(features, labels, key=jax.random.key(0), epochs=50, eval_every_epochs=20)
  with pytest.raises(ValueError, match="train_indices"):
    logistic.fit_logistic_regression(features, labels, num_classes=4,
                                     train_indices=jnp.arange(25), key=jax.random.key(0))
