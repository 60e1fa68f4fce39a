"""Top-k ranking metrics of next-item recommendation, as DCRec reports them (Table 6).

DCRec's reference code evaluates with RecBole's `pop100` mode: each test target is ranked
against 100 negatives drawn by item popularity among the items its user never interacted
with, and reports Recall@k and NDCG@k for k = 1, 5, 10. With one relevant item per example
Recall@k equals the hit ratio HR@k (the paper's name):

    rank  = #{negatives scoring >= the target}      (ties count against the target)
    HR@k   = mean over examples of [rank < k]
    NDCG@k = mean over examples of [rank < k] / log2(rank + 2)

Counting ties against the target (the default, `ties="against"`) keeps a model that scores
everything alike at HR@k = 0 instead of 1. `ties="for"` counts only the negatives scoring
strictly higher, `#{negatives scoring > the target}`: TensorFlow Recommenders' rule, whose
`FactorizedTopK` puts the target's score beside the top-k scores and asks `tf.math.in_top_k`,
which counts a target tied at the k-th place as a hit.

Two-tower retrieval ranks each target against every item instead (`rank_all`, exact, not
sampled): HR@k is then TensorFlow Recommenders' top-k categorical accuracy (`FactorizedTopK`:
the same number with `ties="for"` and no `seen`), and Recall@k for one relevant item per example.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks
from tfcl_jax.evaluation.chunks import map_chunks

_TIES = ("against", "for")


def _outranks(ties: str):
  """`(scores, target_score) -> bool`: whether a score is counted above the target's."""
  _checks.one_of(ties, _TIES, name="ties")
  return jnp.greater_equal if ties == "against" else jnp.greater


def target_rank(target_scores, negative_scores, *, ties: str = "against"):
  """`[M] int32` the number of negatives scoring at least as high as each target
  (`ties="for"`: strictly higher).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.evaluation import ranking
    >>> ranking.target_rank(jnp.array([0.9, 0.2]), jnp.array([[0.1, 0.5], [0.3, 0.2]])).tolist()
    [0, 2]
    >>> ranking.target_rank(jnp.array([0.9, 0.2]), jnp.array([[0.1, 0.5], [0.3, 0.2]]),
    ...                     ties="for").tolist()
    [0, 1]

  Args:
    target_scores: `[M]` the score of each example's target.
    negative_scores: `[M, K]` the scores of its K negatives.
    ties: `"against"` (a negative scoring as high as the target ranks above it) or `"for"`
      (it does not: TensorFlow Recommenders' `FactorizedTopK`).
  """
  outranks = _outranks(ties)
  target_scores, negative_scores = jnp.asarray(target_scores), jnp.asarray(negative_scores)
  if target_scores.ndim != 1 or negative_scores.ndim != 2 or (
      negative_scores.shape[0] != target_scores.shape[0]):
    raise ValueError(f"target_scores must be [M] and negative_scores [M, K]; got "
                     f"{target_scores.shape} and {negative_scores.shape}.")
  return jnp.sum(outranks(negative_scores, target_scores[:, None]), axis=1).astype(jnp.int32)


def rank_all(query_embeddings, item_embeddings, queries, targets, *, seen=None,
             ties: str = "against", chunk_size: int = 1024) -> jax.Array:
  """`[M] int32`: per example, the items other than its target that score at least as high,
  against the whole catalogue (exact; ties count against the target unless `ties="for"`).

  Example `m` scores `query_embeddings[queries[m]] . item_embeddings[j]` for every item `j`;
  items with `seen[queries[m], j]` are left out (a user's training items), the target never.
  Pass unit embeddings for cosine scores. Memory: `chunk_size x I` scores at a time.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.evaluation import ranking
    >>> users = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    >>> items = jnp.array([[0.9, 0.1], [0.5, 0.5], [0.1, 0.9]])
    >>> ranking.rank_all(users, items, jnp.array([0, 0, 1]), jnp.array([0, 2, 1])).tolist()
    [0, 2, 1]
    >>> seen = jnp.array([[True, False, False], [False, False, True]])
    >>> ranking.rank_all(users, items, jnp.array([0, 1]), jnp.array([2, 1]), seen=seen).tolist()
    [1, 0]
    >>> tied = jnp.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])   # items 0 and 1 score alike
    >>> ranking.rank_all(users, tied, jnp.array([0, 0]), jnp.array([0, 1])).tolist()
    [1, 1]
    >>> ranking.rank_all(users, tied, jnp.array([0, 0]), jnp.array([0, 1]), ties="for").tolist()
    [0, 0]

  Args:
    query_embeddings: `[U, D]` one row per query (user).
    item_embeddings: `[I, D]` one row per item.
    queries: `[M] int` the query row of each example.
    targets: `[M] int` the item row of each example's target.
    seen: optional `[U, I] bool`, items excluded from each query's ranking.
    ties: `"against"` (an item scoring as high as the target ranks above it) or `"for"`
      (it does not: TensorFlow Recommenders' `FactorizedTopK`, where a target tied at the
      k-th place is a hit at k).
    chunk_size: examples scored at a time.
  """
  outranks = _outranks(ties)
  query_embeddings = jnp.asarray(query_embeddings)
  item_embeddings = jnp.asarray(item_embeddings)
  queries, targets = jnp.asarray(queries), jnp.asarray(targets)
  if (query_embeddings.ndim != 2 or item_embeddings.ndim != 2
      or query_embeddings.shape[1] != item_embeddings.shape[1]):
    raise ValueError(f"query_embeddings [U, D] and item_embeddings [I, D] must share D; got "
                     f"{query_embeddings.shape} and {item_embeddings.shape}.")
  if queries.shape != targets.shape or queries.ndim != 1:
    raise ValueError(f"queries and targets must both be [M]; got {queries.shape} and "
                     f"{targets.shape}.")
  num_items = item_embeddings.shape[0]
  if seen is not None:
    seen = jnp.asarray(seen, bool)
    if seen.shape != (query_embeddings.shape[0], num_items):
      raise ValueError(f"seen must be [U, I] = {(query_embeddings.shape[0], num_items)}, got "
                       f"{seen.shape}.")

  def chunk(example):
    query, target = example[:, 0], example[:, 1]
    scores = query_embeddings[query] @ item_embeddings.T
    target_score = jnp.take_along_axis(scores, target[:, None], axis=1)
    others = jnp.arange(num_items)[None, :] != target[:, None]
    if seen is not None:
      others &= ~seen[query]
    return jnp.sum(others & outranks(scores, target_score), axis=1).astype(jnp.int32)

  examples = jnp.stack([queries.astype(jnp.int32), targets.astype(jnp.int32)], axis=1)
  return map_chunks(chunk, examples, chunk_size=chunk_size)


def hit_ratio_and_ndcg(rank, ks: Sequence[int] = (1, 5, 10)) -> dict[str, jnp.ndarray]:
  """`{"hr@k": …, "ndcg@k": …}` for every k in `ks`, averaged over the examples of `rank`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.evaluation import ranking
    >>> metrics = ranking.hit_ratio_and_ndcg(jnp.array([0, 1, 7]), ks=(1, 5))
    >>> {name: round(float(value), 4) for name, value in metrics.items()}
    {'hr@1': 0.3333, 'ndcg@1': 0.3333, 'hr@5': 0.6667, 'ndcg@5': 0.5436}

  Args:
    rank: `[M]` from `target_rank` (0 = the target beats every negative).
    ks: cut-offs, positive ints.
  """
  rank = jnp.asarray(rank)
  metrics = {}
  for k in ks:
    k = _checks.positive_int(k, name="ks")
    hit = rank < k
    metrics[f"hr@{k}"] = jnp.mean(hit.astype(jnp.float32))
    metrics[f"ndcg@{k}"] = jnp.mean(jnp.where(hit, 1.0 / jnp.log2(rank + 2.0), 0.0))
  return metrics


def sample_popular_negatives(seed: int, *, users: np.ndarray, user_items, item_counts,
                             num_negatives: int = 100) -> np.ndarray:
  """`[M, num_negatives] int32` distinct negatives per example, drawn with probability
  proportional to `item_counts` among the items `users[m]` never interacted with (`pop100`).

  Host-side NumPy: evaluation sets are fixed once per seed, outside the jitted step.

  Examples:
    >>> import numpy as np
    >>> from tfcl_jax.evaluation import ranking
    >>> history = {0: np.array([1, 2]), 1: np.array([3])}
    >>> negatives = ranking.sample_popular_negatives(
    ...     0, users=np.array([0, 1]), user_items=history.__getitem__,
    ...     item_counts=np.array([0, 5, 5, 5, 1, 1]), num_negatives=3)
    >>> sorted(negatives[0].tolist()), sorted(negatives[1].tolist()) in ([1, 2, 4], [1, 2, 5])
    ([3, 4, 5], True)

  Args:
    seed: NumPy seed of the draw.
    users: `[M]` the user of each example.
    user_items: `user -> array of item ids` the user interacted with (`SequenceData.user_items`).
    item_counts: `[num_items + 1]` popularity of each item id (index 0, padding, is never drawn).
    num_negatives: negatives per example (100 in `pop100`).

  Raises:
    ValueError: a user with fewer than `num_negatives` items left to draw from.
  """
  num_negatives = _checks.positive_int(num_negatives, name="num_negatives")
  counts = np.asarray(item_counts, np.float64).copy()
  counts[0] = 0.0
  if counts.min() < 0:
    raise ValueError("item_counts must be >= 0.")
  rng = np.random.default_rng(seed)
  cumulative = np.cumsum(counts)
  out = np.empty((len(users), num_negatives), np.int32)
  for row, user in enumerate(np.asarray(users)):
    used = np.unique(np.asarray(user_items(int(user)), np.int64))
    available = int(np.count_nonzero(counts)) - int(np.count_nonzero(counts[used]))
    if available < num_negatives:
      raise ValueError(f"num_negatives={num_negatives} but user {int(user)} has only "
                       f"{available} items with a non-zero count left to draw from.")
    # Draws by popularity, dropping the user's items and repeats, until enough are distinct:
    # the same distribution as drawing without replacement from the remaining items.
    chosen: list[int] = []
    seen = set(used.tolist())
    while len(chosen) < num_negatives:
      draws = np.searchsorted(cumulative, rng.random(2 * num_negatives) * cumulative[-1],
                              side="right")
      for item in draws.tolist():
        if item not in seen:
          seen.add(item)
          chosen.append(item)
          if len(chosen) == num_negatives:
            break
    out[row] = chosen
  return out
