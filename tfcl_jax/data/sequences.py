"""Chronological item sequences and the leave-one-out split of sequential recommendation.

Each user's interactions, sorted by time (ties keep file order), form one sequence
`s_0 … s_{n-1}`. As in RecBole's sequential datasets (which DCRec's reference code builds on):

- every rating is an interaction (implicit feedback; `min_rating` keeps only ratings ≥ it);
- the last item is the test target, the second last the validation target, and every earlier
  position `t ≥ 1` is a training target with the items before it as input (prefix
  augmentation, DCRec's `sequential_augmentation`);
- an input is the last `max_length` (50) items before its target, left-aligned and padded with
  0 on the right; items are numbered 1 … `num_items` (0 is padding), users 0 … `num_users − 1`,
  both in the order of their ids in the file.

Sequences are stored once, flat; a split holds only where each example ends, so ML-20M's 20 M
training examples cost 20 M indices, not 20 M × 50 items. `SequenceSplit.inputs` builds the
`[B, max_length]` windows of a batch.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfcl_jax import _checks
from tfcl_jax.data import movielens

MIN_INTERACTIONS = 3  #: one input item, the validation target, the test target


@dataclasses.dataclass(frozen=True)
class SequenceSplit:
  """The examples of one split: example `m` predicts `targets[m]` from the `lengths[m]` items
  before it in its user's sequence.

  Attributes:
    items: `[R] int32` every user's chronological items, users one after another (shared by
      the three splits of a `SequenceData`).
    users: `[M] int32` user of each example.
    ends: `[M] int64` position of each target in `items`; its input is
      `items[ends - lengths : ends]`.
    lengths: `[M] int32` input length, `1 … max_length`.
    max_length: width of `inputs`.
  """

  items: np.ndarray
  users: np.ndarray
  ends: np.ndarray
  lengths: np.ndarray
  max_length: int

  def __len__(self) -> int:
    return int(self.users.shape[0])

  @property
  def targets(self) -> np.ndarray:
    """`[M] int32` the item each example predicts."""
    return self.items[self.ends]

  def inputs(self, index=None) -> np.ndarray:
    """`[B, max_length] int32` input windows of the examples `index` (all by default):
    oldest item first, 0 after the last item."""
    ends = self.ends if index is None else self.ends[index]
    lengths = self.lengths if index is None else self.lengths[index]
    offsets = np.arange(self.max_length)
    positions = (ends - lengths)[:, None] + offsets[None, :]
    valid = offsets[None, :] < lengths[:, None]
    return np.where(valid, self.items[np.where(valid, positions, 0)], 0).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class SequenceData:
  """A ratings file as leave-one-out sequences.

  Attributes:
    train, valid, test: the three splits (valid and test: one example per user).
    num_users, num_items: counts after filtering (item ids run 1 … num_items).
    user_ids: `[num_users]` the file's id of each user index.
    item_ids: `[num_items + 1]` the file's id of each item index (`item_ids[0] = -1`: padding).
    user_offsets: `[num_users + 1] int64` user `u`'s whole sequence is
      `train.items[user_offsets[u] : user_offsets[u + 1]]`.
  """

  train: SequenceSplit
  valid: SequenceSplit
  test: SequenceSplit
  num_users: int
  num_items: int
  user_ids: np.ndarray
  item_ids: np.ndarray
  user_offsets: np.ndarray

  def user_items(self, user: int) -> np.ndarray:
    """Every item of `user`'s sequence, in time order (targets of all three splits included)."""
    return self.train.items[self.user_offsets[user]:self.user_offsets[user + 1]]

  def item_counts(self) -> np.ndarray:
    """`[num_items + 1] int64` interactions per item over all sequences (index 0: 0)."""
    return np.bincount(self.train.items, minlength=self.num_items + 1)


def build_sequences(ratings: movielens.Ratings, *, max_length: int = 50,
                    min_user_interactions: int | None = None,
                    min_rating: float | None = None) -> SequenceData:
  """Leave-one-out sequences of `ratings` (see the module docstring).

  Examples:
    >>> import numpy as np
    >>> from tfcl_jax.data import movielens, sequences
    >>> ratings = movielens.Ratings(
    ...     user=np.array([7, 7, 7, 7, 9, 9, 9]), item=np.array([5, 6, 5, 8, 6, 8, 5]),
    ...     rating=np.ones(7, np.float32), timestamp=np.array([1, 2, 3, 4, 1, 2, 3]),
    ...     source="example")
    >>> data = sequences.build_sequences(ratings, max_length=2)
    >>> data.test.inputs().tolist(), data.test.targets.tolist()   # items renumbered 1..3
    ([[2, 1], [2, 3]], [3, 1])
    >>> data.train.inputs().tolist(), data.train.targets.tolist()
    ([[1, 0]], [2])

  Args:
    ratings: from `movielens.read_ratings`.
    max_length: the input window (RecBole's `MAX_ITEM_LIST_LENGTH`, 50 in DCRec).
    min_user_interactions: drop users with fewer interactions (after `min_rating`); at least
      3. `None` keeps every user and raises if one has fewer than 3.
    min_rating: keep only ratings ≥ this; `None` keeps all (implicit feedback, as DCRec).

  Raises:
    ValueError: a user with fewer than 3 interactions (naming the user and the option),
      `min_user_interactions` below 3, or no interaction left.
  """
  max_length = _checks.positive_int(max_length, name="max_length")
  if min_user_interactions is not None:
    min_user_interactions = _checks.positive_int(min_user_interactions,
                                                 name="min_user_interactions")
    if min_user_interactions < MIN_INTERACTIONS:
      raise ValueError(f"min_user_interactions must be >= {MIN_INTERACTIONS} (one input item, "
                       f"the validation and the test target), got {min_user_interactions}.")
  keep = np.ones(len(ratings), bool)
  if min_rating is not None:
    keep &= ratings.rating >= min_rating
  user, item, time = ratings.user[keep], ratings.item[keep], ratings.timestamp[keep]
  if min_user_interactions is not None:
    ids, counts = np.unique(user, return_counts=True)
    kept_users = ids[counts >= min_user_interactions]
    inside = np.isin(user, kept_users)
    user, item, time = user[inside], item[inside], time[inside]
  if user.size == 0:
    raise ValueError(f"{ratings.source}: no interaction left after min_rating={min_rating} and "
                     f"min_user_interactions={min_user_interactions}.")
  user_ids, user_index = np.unique(user, return_inverse=True)
  item_ids, item_index = np.unique(item, return_inverse=True)
  counts = np.bincount(user_index, minlength=user_ids.size)
  short = np.flatnonzero(counts < MIN_INTERACTIONS)
  if short.size:
    raise ValueError(
        f"{ratings.source}: user {user_ids[short[0]]} has {counts[short[0]]} interaction(s) and "
        f"leave-one-out needs {MIN_INTERACTIONS} ({short.size} user(s) in all); pass "
        f"min_user_interactions={MIN_INTERACTIONS} to drop them.")
  order = np.lexsort((np.arange(user.size), time, user_index))  # by user, time, file order
  items = (item_index[order] + 1).astype(np.int32)
  offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
  position = np.arange(items.size) - np.repeat(offsets[:-1], counts)  # index within the user
  users_flat = np.repeat(np.arange(user_ids.size, dtype=np.int32), counts)
  remaining = np.repeat(counts, counts) - position  # 1 at the last item

  def split(mask):
    ends = np.flatnonzero(mask).astype(np.int64)
    return SequenceSplit(items=items, users=users_flat[ends], ends=ends,
                         lengths=np.minimum(position[ends], max_length).astype(np.int32),
                         max_length=max_length)

  return SequenceData(
      train=split((position >= 1) & (remaining >= 3)), valid=split(remaining == 2),
      test=split(remaining == 1), num_users=int(user_ids.size), num_items=int(item_ids.size),
      user_ids=user_ids, item_ids=np.concatenate([[-1], item_ids]), user_offsets=offsets)
