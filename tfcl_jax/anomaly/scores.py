r"""Anomaly scores and their evaluation: the kNN distance score of MSC and ROC-AUC.

Section 5.3 of Kim & Kim (arXiv 2501.17683) reports ROC-AUC (Table 4) of the MSC score
(Reiss & Hoshen 2023): the distance of a test feature to its k = 2 nearest normal training features.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfcl_jax import _checks
from tfcl_jax.evaluation import chunks


def knn_score(
    bank: jax.typing.ArrayLike,
    query: jax.typing.ArrayLike,
    *,
    k: int = 2,
    squared: bool = True,
    chunk_size: int = 1024,
) -> jax.Array:
  r"""Sum of distances of every query to its `k` nearest bank features (higher: more anomalous).

  .. math:: s(q) = \sum_{j \in N_k(q)} \|q - b_j\|_2^p, \quad p = 2 \text{ if squared else } 1

  MSC's reference code uses faiss `IndexFlatL2`, which returns *squared* L2 distances;
  `squared=True` (the default) reproduces it. On L2-normalised features `||q - b||^2 = 2 - 2 cos`,
  so the k = 1 ranking is the same either way; for k >= 2 the two sums can rank differently.
  The features are taken as given (MSC scores normalised, un-shifted features).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.anomaly import scores
    >>> bank = jnp.array([[0.0, 0.0], [1.0, 0.0], [5.0, 0.0]])
    >>> scores.knn_score(bank, jnp.array([[0.0, 0.0], [3.0, 0.0]]), k=2).tolist()
    [1.0, 8.0]

  Args:
    bank: `[M, D]` float features of the normal training examples.
    query: `[Q, D]` float features to score.
    k: neighbours, `1 <= k <= M` (MSC: 2).
    squared: sum squared distances (faiss `IndexFlatL2`, MSC) or distances.
    chunk_size: queries per chunk (memory `chunk_size x M`).

  Returns:
    `[Q]` float32 scores.

  References:
    Reiss & Hoshen, Mean-Shifted Contrastive Loss for Anomaly Detection, AAAI 2023.
  """
  bank = _checks.float_matrix(bank, name="bank")
  query = _checks.float_matrix(query, name="query")
  if bank.shape[1] != query.shape[1]:
    raise ValueError(
        f"bank and query must have the same feature size, got {bank.shape} and {query.shape}.")
  if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= bank.shape[0]:
    raise ValueError(f"k must be an int in [1, M = {bank.shape[0]}], got {k!r}.")
  _checks.positive_int(chunk_size, name="chunk_size")
  return _knn_score(bank, query, k=k, squared=bool(squared), chunk_size=chunk_size)


@jax.jit(static_argnames=("k", "squared", "chunk_size"))
def _knn_score(bank, query, *, k, squared, chunk_size):
  dtype = _checks.compute_dtype(bank.dtype, query.dtype)
  bank, query = bank.astype(dtype), query.astype(dtype)
  bank_sq = jnp.sum(bank * bank, axis=-1)

  def score(chunk):
    # ||q||^2 + ||b||^2 - 2 q.b: one matmul; clipped at 0 against rounding below zero.
    distance = jnp.sum(chunk * chunk, -1, keepdims=True) + bank_sq[None] - 2 * chunk @ bank.T
    distance = jnp.maximum(distance, 0.0)
    nearest = -jax.lax.top_k(-distance, k)[0]
    return jnp.sum(nearest if squared else jnp.sqrt(nearest), axis=-1)

  return chunks.map_chunks(score, query, chunk_size=chunk_size)


def roc_auc(labels: jax.typing.ArrayLike, scores: jax.typing.ArrayLike) -> jax.Array:
  r"""Area under the ROC curve of `scores` for the positives `labels == True` (ties count 1/2).

  The Mann-Whitney form: the probability that a random positive scores above a random negative,

  .. math:: \mathrm{AUC} = \frac{1}{|P|\,|N|} \sum_{i \in P} \sum_{j \in N}
     \left([s_i > s_j] + \tfrac12 [s_i = s_j]\right),

  computed with one sort and two binary searches, `O((|P| + |N|) log |N|)`. Each positive's
  fraction is formed before the mean, so float32 is exact enough for millions of examples.
  In MSC the anomalies are the positives and the normal class the negatives.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.anomaly import scores
    >>> labels = jnp.array([False, False, True, True])
    >>> float(scores.roc_auc(labels, jnp.array([0.1, 0.4, 0.35, 0.8])))
    0.75

  Args:
    labels: `[N]` bool (or 0/1 integer) labels; True = positive (anomalous).
    scores: `[N]` real scores; higher = more positive.

  Returns:
    A float32 scalar in `[0, 1]`.

  Raises:
    ValueError: shapes differ, or (for concrete arrays) one class is absent or a score is NaN,
      where AUC is undefined.
  """
  labels = jnp.asarray(labels)
  scores = jnp.asarray(scores)
  if labels.ndim != 1 or scores.shape != labels.shape:
    raise ValueError(f"labels and scores must have the same shape [N], got {labels.shape} and "
                     f"{scores.shape}.")
  if labels.dtype != jnp.bool_:
    if not jnp.issubdtype(labels.dtype, jnp.integer):
      raise TypeError(f"labels must be bool or 0/1 integers, got dtype {labels.dtype}.")
    if _checks.is_concrete(labels) and not bool(jnp.all((labels == 0) | (labels == 1))):
      raise ValueError("labels must be 0/1 when given as integers.")
    labels = labels == 1
  if jnp.issubdtype(scores.dtype, jnp.complexfloating) or scores.dtype == jnp.bool_:
    raise TypeError(f"scores must be real numbers, got dtype {scores.dtype}.")
  if _checks.is_concrete(scores) and bool(jnp.any(jnp.isnan(scores))):
    raise ValueError("scores contain NaN; ROC-AUC is undefined (check the features).")
  if _checks.is_concrete(labels):
    positives = int(jnp.sum(labels))
    if positives in (0, labels.shape[0]):
      raise ValueError(
          f"roc_auc needs both positive and negative labels, got {positives} positives out of "
          f"{labels.shape[0]}.")
  return _roc_auc(labels, scores)


@jax.jit
def _roc_auc(labels, scores):
  # Negatives are sorted; positives and padding sit at +inf, after every negative.
  dtype = _checks.compute_dtype(scores.dtype)
  negatives = jnp.sort(jnp.where(labels, jnp.inf, scores.astype(dtype)))
  query = scores.astype(dtype)
  below = jnp.searchsorted(negatives, query, side="left")
  up_to = jnp.searchsorted(negatives, query, side="right")
  num_negatives = jnp.sum(~labels)
  # Ties with the +inf padding never arise: a finite query stops before it.
  fraction = (below + 0.5 * (jnp.minimum(up_to, num_negatives) - below)) / num_negatives
  return jnp.sum(jnp.where(labels, fraction, 0.0)) / jnp.sum(labels)
