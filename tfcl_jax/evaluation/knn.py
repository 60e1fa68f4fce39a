r"""Weighted kNN classification on frozen features (Wu et al. 2018's kNN monitor, as in LightlySSL).

The evaluation of the paper's image experiment (Section 5.1, Table 2: kNN top-1 accuracy).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfcl_jax import _checks, losses
from tfcl_jax.evaluation import chunks


def knn_predict(
    query: jax.typing.ArrayLike,
    bank: jax.typing.ArrayLike,
    bank_labels: jax.typing.ArrayLike,
    *,
    num_classes: int,
    k: int = 200,
    tau: float = 0.1,
    chunk_size: int = 1024,
) -> jax.Array:
  r"""Weighted-kNN class scores of each query.

  With cosine similarities `s_ij` between L2-normalised query `i` and bank item `j`, and
  `N_k(i)` the `k` most similar bank items,

  .. math:: \text{score}_{ic} = \sum_{j \in N_k(i)} e^{s_{ij} / \tau}\, [y_j = c]

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.evaluation import knn
    >>> bank = jnp.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    >>> knn.knn_predict(jnp.array([[1.0, 0.05]]), bank, jnp.array([0, 0, 1]),
    ...                 num_classes=2, k=2).argmax(-1).tolist()
    [0]

  Args:
    query: `[Q, D]` float features.
    bank: `[M, D]` float features of the labelled set.
    bank_labels: `[M]` int labels in `[0, num_classes)`.
    num_classes: number of classes.
    k: neighbours (capped at `M`).
    tau: temperature of the vote weights (0.1 in Wu et al. 2018).
    chunk_size: queries per chunk (memory `chunk_size x M`).

  Returns:
    `[Q, num_classes]` float32 scores.

  References:
    Wu et al., Unsupervised Feature Learning via Non-Parametric Instance Discrimination, CVPR 2018.
  """
  query = _checks.float_matrix(query, name="query")
  bank = _checks.float_matrix(bank, name="bank")
  bank_labels = jnp.asarray(bank_labels)
  if query.shape[1] != bank.shape[1]:
    raise ValueError(
        f"query and bank must have the same feature size, got {query.shape} and {bank.shape}.")
  if not jnp.issubdtype(bank_labels.dtype, jnp.integer):
    raise TypeError(f"bank_labels must have an integer dtype, got {bank_labels.dtype}.")
  if bank_labels.shape != (bank.shape[0],):
    raise ValueError(f"bank_labels must have shape [M] = ({bank.shape[0]},), "
                     f"got {bank_labels.shape}.")
  _checks.positive_int(k, name="k")
  _checks.positive_scalar(tau, name="tau")
  _checks.positive_int(chunk_size, name="chunk_size")
  return _knn_scores(query, bank, bank_labels, num_classes=num_classes,
                     k=min(k, bank.shape[0]), tau=float(tau), chunk_size=chunk_size)


@jax.jit(static_argnames=("num_classes", "k", "tau", "chunk_size"))
def _knn_scores(query, bank, bank_labels, *, num_classes, k, tau, chunk_size):
  bank = losses.l2_normalize(bank.astype(jnp.float32))
  one_hot = jax.nn.one_hot(bank_labels, num_classes, dtype=jnp.float32)

  def scores(chunk):
    similarity = losses.l2_normalize(chunk.astype(jnp.float32)) @ bank.T
    top_similarity, top_index = jax.lax.top_k(similarity, k)
    weights = jnp.exp(top_similarity / tau)
    return jnp.einsum("qk,qkc->qc", weights, one_hot[top_index])

  return chunks.map_chunks(scores, query, chunk_size=chunk_size)


def knn_top1(
    train_features: jax.typing.ArrayLike,
    train_labels: jax.typing.ArrayLike,
    test_features: jax.typing.ArrayLike,
    test_labels: jax.typing.ArrayLike,
    *,
    num_classes: int,
    k: int = 200,
    tau: float = 0.1,
) -> float:
  """Top-1 accuracy of weighted kNN (`knn_predict`) of the test set against the train bank.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.evaluation import knn
    >>> train = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    >>> knn.knn_top1(train, jnp.array([0, 1]), train, jnp.array([0, 1]), num_classes=2, k=1)
    1.0
  """
  test_labels = jnp.asarray(test_labels)
  scores = knn_predict(test_features, train_features, train_labels, num_classes=num_classes,
                       k=k, tau=tau)
  if test_labels.shape != (scores.shape[0],):
    raise ValueError(f"test_labels must have shape [Q] = ({scores.shape[0]},), "
                     f"got {test_labels.shape}.")
  return float(jnp.mean(jnp.argmax(scores, axis=-1) == test_labels))
