"""(user, item) interaction pairs for two-tower retrieval: splits, batches, item frequencies.

Ratings (`tfcl_jax.data.movielens.read_ratings`) become pairs of row indices into the users'
and items' tables (`index`); every rating is an interaction (implicit feedback). Two splits:

- `random_split`: a fixed fraction of the pairs for training, drawn by one seeded permutation
  (TensorFlow Recommenders' retrieval tutorial: 80,000 of MovieLens-100K's 100,000 ratings,
  shuffled with seed 42);
- `leave_last_out`: each user's latest interaction (by timestamp, then file order) is held out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np


@dataclasses.dataclass(frozen=True)
class Pairs:
  """`user [M]` and `item [M]` int32 row indices, in the split's order."""

  user: np.ndarray
  item: np.ndarray

  def __len__(self) -> int:
    return int(self.user.shape[0])


@dataclasses.dataclass(frozen=True)
class Interactions:
  """All interactions as pairs, with the ids each row index stands for."""

  pairs: Pairs
  timestamp: np.ndarray  # [M] int64
  user_ids: np.ndarray  # [U] the ids of user rows 0..U-1
  item_ids: np.ndarray  # [I] the ids of item rows 0..I-1

  @property
  def num_users(self) -> int:
    return int(self.user_ids.shape[0])

  @property
  def num_items(self) -> int:
    return int(self.item_ids.shape[0])


def index(ratings, *, item_ids: np.ndarray | None = None) -> Interactions:
  """The ratings as row-index pairs: users in sorted id order; items in the order of
  `item_ids` (e.g. the movies file's, so that every movie is a candidate, rated or not) or,
  by default, the rated items in sorted id order.

  Raises:
    ValueError: a rated item that `item_ids` does not list.
  """
  user_ids = np.unique(ratings.user)
  item_ids = np.unique(ratings.item) if item_ids is None else np.asarray(item_ids, np.int64)
  order = np.argsort(item_ids, kind="stable")
  position = np.searchsorted(item_ids[order], ratings.item)
  position = np.minimum(position, len(item_ids) - 1)
  known = item_ids[order][position] == ratings.item
  if not np.all(known):
    missing = np.unique(ratings.item[~known])
    raise ValueError(f"{missing.size} rated item(s) missing from the items table, e.g. "
                     f"{missing[:5].tolist()}.")
  users = np.searchsorted(user_ids, ratings.user).astype(np.int32)
  items = order[position].astype(np.int32)
  return Interactions(Pairs(users, items), np.asarray(ratings.timestamp, np.int64), user_ids,
                      item_ids)


def random_split(data: Interactions, *, train_fraction: float = 0.8, seed: int = 42
                 ) -> tuple[Pairs, Pairs]:
  """`(train, test)`: the first `round(train_fraction * M)` pairs of one seeded permutation
  (`numpy.random.default_rng(seed)`) and the rest.

  Examples:
    >>> import numpy as np
    >>> from tfcl_jax.data import interactions
    >>> pairs = interactions.Pairs(np.arange(10, dtype=np.int32), np.arange(10, dtype=np.int32))
    >>> data = interactions.Interactions(pairs, np.arange(10), np.arange(10), np.arange(10))
    >>> train, test = interactions.random_split(data, train_fraction=0.8, seed=42)
    >>> len(train), len(test), sorted(np.concatenate([train.user, test.user]).tolist()) == list(
    ...     range(10))
    (8, 2, True)
  """
  if not 0.0 < train_fraction < 1.0:
    raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction!r}.")
  order = np.random.default_rng(seed).permutation(len(data.pairs))
  cut = int(round(train_fraction * len(order)))
  if cut == 0 or cut == len(order):
    raise ValueError(f"train_fraction={train_fraction} leaves an empty split of "
                     f"{len(order)} interactions.")
  take = lambda rows: Pairs(data.pairs.user[rows], data.pairs.item[rows])  # noqa: E731
  return take(order[:cut]), take(order[cut:])


def leave_last_out(data: Interactions) -> tuple[Pairs, Pairs]:
  """`(train, test)`: each user's latest interaction (by timestamp, ties by file order) is
  the user's one test pair; users with a single interaction keep it for training.

  Examples:
    >>> import numpy as np
    >>> from tfcl_jax.data import interactions
    >>> pairs = interactions.Pairs(np.array([0, 0, 1, 0], np.int32), np.array([5, 6, 7, 8],
    ...                            np.int32))
    >>> data = interactions.Interactions(pairs, np.array([3, 9, 1, 4]), np.arange(2),
    ...                                  np.arange(9))
    >>> train, test = interactions.leave_last_out(data)
    >>> test.user.tolist(), test.item.tolist(), sorted(train.item.tolist())
    ([0], [6], [5, 7, 8])
  """
  users, stamps = data.pairs.user, data.timestamp
  # Sort by (user, timestamp, position): the last row of each user's run is its latest.
  order = np.lexsort((np.arange(len(users)), stamps, users))
  last = np.r_[users[order][1:] != users[order][:-1], True]
  count = np.bincount(users, minlength=data.num_users)
  held = order[last & (count[users[order]] > 1)]
  is_test = np.zeros(len(users), bool)
  is_test[held] = True
  take = lambda mask: Pairs(users[mask], data.pairs.item[mask])  # noqa: E731
  return take(~is_test), take(is_test)


def seen(pairs: Pairs, *, num_users: int, num_items: int) -> np.ndarray:
  """`[U, I] bool`: the items each user has in `pairs` (to leave out of its ranking)."""
  out = np.zeros((num_users, num_items), bool)
  out[pairs.user, pairs.item] = True
  return out


def log_item_frequency(pairs: Pairs, *, num_items: int) -> np.ndarray:
  """`[I] float32` `log q_j`, `q_j` the share of the pairs whose item is `j` (the probability
  that a uniformly drawn training pair brings item `j` into a batch, up to the batch size,
  a constant that cancels in the softmax); `log(0.5 / M)` for items never seen."""
  return _log_share(pairs.item, num_items, len(pairs))


def log_user_frequency(pairs: Pairs, *, num_users: int) -> np.ndarray:
  """`[U] float32` `log q_u`, as `log_item_frequency` for the users: the users' logQ correction
  when they are the candidates (CLIP's loss, movie -> user)."""
  return _log_share(pairs.user, num_users, len(pairs))


def _log_share(ids: np.ndarray, num: int, total: int) -> np.ndarray:
  counts = np.bincount(ids, minlength=num).astype(np.float64)
  return np.log(np.maximum(counts, 0.5) / total).astype(np.float32)


def batches(pairs: Pairs, *, batch_size: int, seed: int, start: int, num_steps: int,
            reshuffle: bool = False) -> Iterator[dict[str, np.ndarray]]:
  """Batches for steps `start + 1 … num_steps`: `{"user", "item": [batch_size] int32,
  "valid": [batch_size] bool}`.

  An epoch visits the pairs in one permutation of `default_rng(seed)` (the same every epoch,
  as the tutorial's shuffled-then-cached dataset; `reshuffle=True`: a fresh one per epoch,
  `default_rng((seed, epoch))`), in `ceil(M / batch_size)` batches; the last is padded with
  invalid rows (`valid` False) so every step has one shape.
  """
  per_epoch = -(-len(pairs) // batch_size)
  for step in range(start, num_steps):
    epoch, position = divmod(step, per_epoch)
    rng = np.random.default_rng((seed, epoch) if reshuffle else seed)
    rows = rng.permutation(len(pairs))[position * batch_size:(position + 1) * batch_size]
    pad = batch_size - rows.size
    valid = np.r_[np.ones(rows.size, bool), np.zeros(pad, bool)]
    rows = np.r_[rows, np.zeros(pad, rows.dtype)]
    yield {"user": pairs.user[rows], "item": pairs.item[rows], "valid": valid}
