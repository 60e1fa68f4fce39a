"""A first-in-first-out queue of past embeddings: extra negatives a train step carries.

MoCo's queue, LightlySSL's `memory_bank_size`, pytorch-metric-learning's `CrossBatchMemory`,
as a pure pytree state: `init` once, `push` each step, and pass `queue.vectors` and
`queue.valid` to `info_nce(..., extra_negatives=..., extra_where=...)`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tfcl_jax import _checks


class Queue(NamedTuple):
  """`vectors: [K, D]` stored embeddings, `valid: [K] bool` filled slots, `head: []` int32 the
  next slot to write (the oldest entry once the queue is full)."""

  vectors: jax.Array
  valid: jax.Array
  head: jax.Array


def init(size: int, dim: int, *, dtype=jnp.float32) -> Queue:
  """An empty queue of `size` slots for `dim`-dimensional embeddings.

  Examples:
    >>> from tfcl_jax.losses import queue
    >>> q = queue.init(4, 2)
    >>> q.vectors.shape, q.valid.tolist()
    ((4, 2), [False, False, False, False])
  """
  size, dim = _checks.positive_int(size, name="size"), _checks.positive_int(dim, name="dim")
  return Queue(jnp.zeros((size, dim), dtype), jnp.zeros((size,), bool), jnp.zeros((), jnp.int32))


def push(queue: Queue, z: jax.typing.ArrayLike, *, where: jax.typing.ArrayLike | None = None
         ) -> Queue:
  """Appends the rows of `z` (those where `where`), overwriting the oldest entries.

  Rows are stored under `stop_gradient`, in `queue.vectors.dtype`. Jittable: the number of
  rows written may be traced (through `where`); their order is kept.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.losses import queue
    >>> q = queue.push(queue.init(3, 1), jnp.array([[1.0], [2.0]]))
    >>> q = queue.push(q, jnp.array([[3.0], [4.0]]))
    >>> q.vectors[:, 0].tolist(), q.valid.tolist(), int(q.head)
    ([4.0, 2.0, 3.0], [True, True, True], 1)

  Args:
    queue: the state from `init` or a previous `push`.
    z: `[B, D]` embeddings, `B <= K`.
    where: optional `[B]` bool: which rows to store (e.g. the valid pairs of a padded batch).

  Returns:
    The new `Queue`.
  """
  z = _checks.float_matrix(z, name="z")
  size, dim = queue.vectors.shape
  if z.shape[1] != dim or z.shape[0] > size:
    raise ValueError(f"z must have shape [B, {dim}] with B <= {size} (the queue's size), got "
                     f"{z.shape}.")
  keep = jnp.ones((z.shape[0],), bool) if where is None else jnp.asarray(where)
  if keep.dtype != jnp.bool_ or keep.shape != (z.shape[0],):
    raise ValueError(f"where must be a bool mask of shape ({z.shape[0]},), got "
                     f"{keep.dtype}{keep.shape}.")
  order = jnp.cumsum(keep) - 1
  # Rows not kept go to slot `size`: out of bounds, dropped by the scatter.
  slots = jnp.where(keep, (queue.head + order) % size, size)
  vectors = queue.vectors.at[slots].set(
      jax.lax.stop_gradient(z).astype(queue.vectors.dtype), mode="drop")
  valid = queue.valid.at[slots].set(True, mode="drop")
  head = (queue.head + jnp.sum(keep, dtype=jnp.int32)) % size
  return Queue(vectors, valid, head)
