"""The FIFO queue of extra negatives against a Python deque, under jit, with masks."""

import collections

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfcl_jax import losses
from tfcl_jax.losses import queue


def test_push_matches_a_python_deque_under_jit_with_masks():
  size, dim = 5, 2
  rng = np.random.default_rng(0)
  reference = collections.deque(maxlen=size)
  push = jax.jit(queue.push)
  state = queue.init(size, dim)
  for step in range(6):
    batch = rng.normal(size=(3, dim)).astype(np.float32)
    keep = rng.random(3) > 0.3
    state = push(state, batch, where=keep)
    reference.extend(batch[keep])
    stored = np.asarray(state.vectors)[np.asarray(state.valid)]
    # Same multiset of rows as the deque (slot order is the ring's, not the deque's).
    got = sorted(map(tuple, stored.round(6)))
    assert got == sorted(map(tuple, np.asarray(reference).round(6))), step
  assert push._cache_size() == 1


def test_queue_feeds_info_nce_and_takes_no_gradient():
  z1 = jax.random.normal(jax.random.key(0), (4, 3))
  z2 = z1 + 0.1
  state = queue.push(queue.init(6, 3), 2.0 * z1)

  def loss(a):
    q = queue.push(state, a)  # pushed rows are stop_gradient'ed
    return losses.info_nce(a, z2, extra_negatives=q.vectors, extra_where=q.valid)

  value, grad = jax.jit(jax.value_and_grad(loss))(z1)
  filled = losses.info_nce(z1, z2, extra_negatives=jnp.concatenate([z1[2:], z1, z1[:0]]))
  # Slots: z1[2:], then z1 wraps round. Rows of one direction at cosines near 1, where the free
  # mapping's slope 2 / (1 - c^2) turns a float32 rounding of c into ~1e-5 of a logit: two
  # compiled programs agree to a few ulp of that.
  np.testing.assert_allclose(value, filled, rtol=1e-5)
  chex.assert_tree_all_finite(grad)


def test_bad_arguments():
  with pytest.raises(ValueError, match="size"):
    queue.init(0, 3)
  state = queue.init(2, 3)
  with pytest.raises(ValueError, match=r"z must have shape \[B, 3\] with B <= 2"):
    queue.push(state, jnp.ones((3, 3)))
  with pytest.raises(ValueError, match="where"):
    queue.push(state, jnp.ones((2, 3)), where=jnp.ones(2))
