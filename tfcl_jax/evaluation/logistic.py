r"""Linear evaluation of frozen embeddings: multinomial logistic regression trained with Adam.

`fit_logistic_regression` is the general probe (also SimCLR's linear probe); `lr_evaluate` is
PyGCL's `LREvaluator` protocol (GRACE, Table 3): random split, test F1 at the best validation F1.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tfcl_jax import _checks


class LinearClassifier(NamedTuple):
  """`logits = features @ weight + bias`; `weight: [D, C]`, `bias: [C]`."""

  weight: jax.Array
  bias: jax.Array


def init_linear(key: jax.Array, num_features: int, num_classes: int) -> LinearClassifier:
  """PyTorch `nn.Linear` with Xavier-uniform weights (PyGCL's `LRModel`), bias U(+-1/sqrt(D))."""
  weight_key, bias_key = jax.random.split(key)
  limit = np.sqrt(6.0 / (num_features + num_classes))
  bound = 1.0 / np.sqrt(num_features)
  return LinearClassifier(
      weight=jax.random.uniform(
          weight_key, (num_features, num_classes), jnp.float32, -limit, limit),
      bias=jax.random.uniform(bias_key, (num_classes,), jnp.float32, -bound, bound),
  )


def predict(classifier: LinearClassifier, features: jax.typing.ArrayLike) -> jax.Array:
  """`[N] int32` argmax class of `features @ weight + bias`."""
  return jnp.argmax(jnp.asarray(features) @ classifier.weight + classifier.bias, axis=-1)


def _check_inputs(features, labels, num_classes):
  features = _checks.float_matrix(features, name="features")
  labels = jnp.asarray(labels)
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise TypeError(f"labels must have an integer dtype, got {labels.dtype}.")
  if labels.shape != (features.shape[0],):
    raise ValueError(f"labels must have shape [N] = ({features.shape[0]},), got {labels.shape}.")
  if not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
    raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}.")
  if _checks.is_concrete(labels) and labels.size and (
      int(labels.min()) < 0 or int(labels.max()) >= num_classes):
    raise ValueError(f"labels must lie in [0, num_classes = {num_classes}), got "
                     f"[{int(labels.min())}, {int(labels.max())}].")
  return features.astype(jnp.float32), labels.astype(jnp.int32)


def _check_indices(indices, n: int, *, name: str) -> jax.Array:
  indices = jnp.asarray(indices)
  if indices.ndim != 1 or not jnp.issubdtype(indices.dtype, jnp.integer) or indices.size == 0:
    raise ValueError(f"{name} must be a non-empty 1-D integer index array, got "
                     f"shape {indices.shape} dtype {indices.dtype}.")
  if _checks.is_concrete(indices) and (int(indices.min()) < 0 or int(indices.max()) >= n):
    raise ValueError(f"{name} must index rows in [0, {n}).")
  return indices


def _optimizer(learning_rate: float, weight_decay: float) -> optax.GradientTransformation:
  # PyTorch Adam's weight_decay is an L2 term added to the gradient before the moments.
  return optax.chain(optax.add_decayed_weights(weight_decay), optax.adam(learning_rate))


def _loss(classifier: LinearClassifier, features, labels) -> jax.Array:
  logits = features @ classifier.weight + classifier.bias
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def fit_logistic_regression(
    features: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_classes: int,
    train_indices: jax.typing.ArrayLike,
    key: jax.Array,
    epochs: int = 5000,
    learning_rate: float = 0.01,
    weight_decay: float = 0.0,
) -> LinearClassifier:
  r"""Multinomial logistic regression, full-batch Adam, one jitted `lax.scan`.

  Minimises `mean_i CE(features[i] @ W + b, labels[i]) + weight_decay / 2 * (|W|^2 + |b|^2)`
  over `train_indices` (PyTorch `Adam(weight_decay=...)` semantics). With `weight_decay > 0`
  the problem is strictly convex, and the optimum is scikit-learn's
  `LogisticRegression(C=1 / (weight_decay * n_train))` up to its unpenalised intercept.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.evaluation import logistic
    >>> x = jnp.array([[0.0, 1.0], [0.1, 0.9], [1.0, 0.0], [0.9, 0.2]])
    >>> y = jnp.array([0, 0, 1, 1])
    >>> clf = logistic.fit_logistic_regression(x, y, num_classes=2, train_indices=jnp.arange(4),
    ...                                        key=jax.random.key(0), epochs=200)
    >>> logistic.predict(clf, x).tolist()
    [0, 0, 1, 1]

  Args:
    features: `[N, D]` float features (frozen embeddings).
    labels: `[N]` int labels in `[0, num_classes)`.
    num_classes: number of classes `C`.
    train_indices: `[M]` int rows to train on.
    key: PRNG key for the initialisation.
    epochs: full-batch Adam steps.
    learning_rate: Adam learning rate.
    weight_decay: L2 coefficient added to the gradient (0 in PyGCL).

  Returns:
    The trained `LinearClassifier`.
  """
  features, labels = _check_inputs(features, labels, num_classes)
  train_indices = _check_indices(train_indices, features.shape[0], name="train_indices")
  _check_schedule(epochs=epochs, learning_rate=learning_rate, weight_decay=weight_decay)
  classifier, _ = _fit_jit(features[train_indices], labels[train_indices], key, num_classes,
                           epochs, learning_rate, weight_decay, None, epochs)
  return classifier


def _check_schedule(*, epochs, learning_rate, weight_decay, eval_every_epochs=1):
  _checks.positive_int(epochs, name="epochs")
  if (_checks.positive_int(eval_every_epochs, name="eval_every_epochs")
      and epochs % eval_every_epochs):
    raise ValueError(f"eval_every_epochs must be an int >= 1 dividing epochs = {epochs}, "
                     f"got {eval_every_epochs!r}.")
  _checks.positive_scalar(learning_rate, name="learning_rate")
  if not weight_decay >= 0:
    raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}.")


def _fit_impl(train_x, train_y, key, num_classes, epochs, learning_rate, weight_decay, evaluate,
              eval_every_epochs):
  """Adam for `epochs` steps; stacks `evaluate(classifier)` every `eval_every_epochs` steps."""
  optimizer = _optimizer(learning_rate, weight_decay)
  classifier = init_linear(key, train_x.shape[1], num_classes)
  grad_fn = jax.grad(_loss)

  def step(carry, _):
    classifier, opt_state = carry
    updates, opt_state = optimizer.update(grad_fn(classifier, train_x, train_y), opt_state,
                                          classifier)
    return (optax.apply_updates(classifier, updates), opt_state), None

  def chunk(carry, _):
    carry, _ = jax.lax.scan(step, carry, None, length=eval_every_epochs)
    return carry, (None if evaluate is None else evaluate(carry[0]))

  carry = (classifier, optimizer.init(classifier))
  (classifier, _), history = jax.lax.scan(chunk, carry, None, length=epochs // eval_every_epochs)
  return classifier, history


_fit_jit = jax.jit(_fit_impl, static_argnums=(3, 4, 5, 6, 7, 8))


def f1_scores(labels: jax.typing.ArrayLike, predictions: jax.typing.ArrayLike, *,
              num_classes: int) -> tuple[jax.Array, jax.Array]:
  r"""Micro- and macro-averaged F1 of single-label predictions (scikit-learn's `f1_score`).

  Micro-F1 is the accuracy. Macro-F1 averages `2 TP / (2 TP + FP + FN)` over the classes
  present in `labels` or `predictions` (scikit-learn's default label set).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.evaluation import logistic
    >>> micro, macro = logistic.f1_scores(jnp.array([0, 0, 1, 2]), jnp.array([0, 1, 1, 2]),
    ...                                   num_classes=4)
    >>> round(float(micro), 4), round(float(macro), 4)
    (0.75, 0.7778)

  Returns:
    `(micro, macro)` float32 scalars in `[0, 1]`.
  """
  labels = jnp.asarray(labels)
  predictions = jnp.asarray(predictions)
  true_one_hot = jax.nn.one_hot(labels, num_classes)
  pred_one_hot = jax.nn.one_hot(predictions, num_classes)
  true_positive = jnp.sum(true_one_hot * pred_one_hot, axis=0)
  support = jnp.sum(true_one_hot, axis=0)
  predicted = jnp.sum(pred_one_hot, axis=0)
  present = (support + predicted) > 0
  per_class = 2 * true_positive / jnp.maximum(support + predicted, 1)
  macro = jnp.sum(jnp.where(present, per_class, 0.0)) / jnp.maximum(jnp.sum(present), 1)
  micro = jnp.mean((labels == predictions).astype(jnp.float32))
  return micro, macro


def random_split(num_nodes: int, *, key: jax.Array, train_fraction: float = 0.1,
                 val_fraction: float = 0.1) -> tuple[jax.Array, jax.Array, jax.Array]:
  """A random permutation cut into train / validation / test index arrays.

  Sizes `int(N * train_fraction)`, `int(N * val_fraction)`, the rest. PyGCL's
  `get_split(train_ratio=0.1, test_ratio=0.8)` actually gives 10% train / 80% validation / 10%
  test (its slicing): pass `val_fraction=0.8` to get that.

  Examples:
    >>> import jax
    >>> from tfcl_jax.evaluation import logistic
    >>> [len(i) for i in logistic.random_split(100, key=jax.random.key(0))]
    [10, 10, 80]
  """
  train_size, val_size = int(num_nodes * train_fraction), int(num_nodes * val_fraction)
  if train_size < 1 or val_size < 1 or train_size + val_size >= num_nodes:
    raise ValueError(f"train_fraction={train_fraction}, val_fraction={val_fraction} must leave "
                     f"non-empty train, validation and test sets of {num_nodes} nodes.")
  order = jax.random.permutation(key, num_nodes)
  return order[:train_size], order[train_size:train_size + val_size], order[train_size + val_size:]


def lr_evaluate(
    embeddings: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    key: jax.Array,
    num_classes: int | None = None,
    train_fraction: float = 0.1,
    val_fraction: float = 0.1,
    epochs: int = 5000,
    learning_rate: float = 0.01,
    weight_decay: float = 0.0,
    eval_every_epochs: int = 20,
) -> dict[str, float]:
  r"""PyGCL's `LREvaluator`: test micro/macro-F1 at the best validation micro-F1.

  Splits the nodes at random (`random_split`), trains `fit_logistic_regression` with Adam
  (lr 0.01, no weight decay, 5000 epochs) and every `eval_every_epochs` epochs scores validation
  and test; returns the test scores of the first evaluation with the highest validation micro-F1.
  All of it runs in one jitted scan (about a second for CiteSeer on CPU).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.evaluation import logistic
    >>> labels = jnp.arange(60) % 3
    >>> embeddings = jax.nn.one_hot(labels, 3) + 0.1 * jax.random.normal(jax.random.key(1), (60, 3))
    >>> logistic.lr_evaluate(embeddings, labels, key=jax.random.key(0), train_fraction=0.2,
    ...                      val_fraction=0.2, epochs=200)["f1_micro"]
    1.0

  Args:
    embeddings: `[N, D]` frozen float embeddings.
    labels: `[N]` int labels.
    key: PRNG key; split and initialisation derive from it.
    num_classes: default `labels.max() + 1`.
    train_fraction, val_fraction: split fractions; the test set is the rest.
    epochs, learning_rate, weight_decay: the Adam fit.
    eval_every_epochs: epochs between evaluations (PyGCL's `test_interval`); must divide
      `epochs`.

  Returns:
    `{"f1_micro", "f1_macro", "val_f1_micro", "best_epoch"}` (F1 in `[0, 1]`).

  References:
    Zhu et al., An Empirical Study of Graph Contrastive Learning (PyGCL), NeurIPS 2021
    Datasets and Benchmarks; Kim & Kim, arXiv 2501.17683, Table 3.
  """
  num_classes = int(np.max(labels)) + 1 if num_classes is None else num_classes
  embeddings, labels = _check_inputs(embeddings, labels, num_classes)
  _check_schedule(epochs=epochs, learning_rate=learning_rate, weight_decay=weight_decay,
                  eval_every_epochs=eval_every_epochs)
  split_key, init_key = jax.random.split(key)
  train, val, test = random_split(embeddings.shape[0], key=split_key,
                                  train_fraction=train_fraction, val_fraction=val_fraction)
  val_micro, test_micro, test_macro = _evaluate_jit(
      embeddings, labels, train, val, test, init_key, num_classes, epochs, learning_rate,
      weight_decay, eval_every_epochs)
  # First maximum, as PyGCL's strict `val_micro > best_val_micro`.
  best = int(np.argmax(np.asarray(val_micro)))
  return {
      "f1_micro": float(test_micro[best]),
      "f1_macro": float(test_macro[best]),
      "val_f1_micro": float(val_micro[best]),
      "best_epoch": (best + 1) * eval_every_epochs,
  }


def _evaluate_impl(embeddings, labels, train, val, test, key, num_classes, epochs, learning_rate,
                   weight_decay, eval_every_epochs):

  def evaluate(classifier):
    val_micro, _ = f1_scores(labels[val], predict(classifier, embeddings[val]),
                             num_classes=num_classes)
    test_micro, test_macro = f1_scores(labels[test], predict(classifier, embeddings[test]),
                                       num_classes=num_classes)
    return val_micro, test_micro, test_macro

  _, history = _fit_impl(embeddings[train], labels[train], key, num_classes, epochs,
                         learning_rate, weight_decay, evaluate, eval_every_epochs)
  return history


_evaluate_jit = jax.jit(_evaluate_impl, static_argnums=(6, 7, 8, 9, 10))
