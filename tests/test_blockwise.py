"""Blockwise InfoNCE against the dense loss (values, gradients), edge cases, memory, bad input."""

from __future__ import annotations

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfcl_jax import blockwise, losses, mappings

# Each factory builds the mapping from a differentiable scalar `p`, so one test covers a
# gradient reaching a learnable parameter (`t`) and a closed-over traced value (`tau`).
MAPPINGS = {
    "tau": lambda p: mappings.temperature(0.2),
    "free": lambda p: mappings.temperature_free(),  # the kernels' Eq. 11 fast path
    "free_generic": lambda p: (lambda cos: mappings.temperature_free()(cos)),  # via jax.vjp
    "learnable": lambda p: mappings.learnable_temperature(p),
    "traced_tau": lambda p: mappings.temperature(p),
    "dynamic": lambda p: mappings.dynamic_temperature(0.1, 0.3),
    "annealed": lambda p: mappings.from_spec("anneal=cosine:0.5:0.1:100"),
    "plain_callable": lambda p: (lambda cos: 3.0 * cos),
    # What train steps pass: `Mapping.bind` fixes params and step (tiles must read both).
    "bound_learnable": lambda p: mappings.learnable_temperature(0.0).bind(params={"t": p}),
    "bound_annealed": lambda p: mappings.from_spec("anneal=cosine:0.5:0.1:100").bind(step=37),
}
PARAM = {"learnable": 1.5, "traced_tau": 0.3, "bound_learnable": 1.5}


def _views(n, d, dtype=jnp.float32, seed=0):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  z1 = jax.random.normal(k1, (n, d), dtype)
  z2 = z1 + 0.7 * jax.random.normal(k2, (n, d), dtype)
  where = jax.random.bernoulli(k3, 0.7, (n,)).at[0].set(True)
  return z1, z2, where


def _loss_and_grads(names, cases, block_size):
  """Jitted: loss and gradients (z1, z2, p) for each mapping name and (negatives, masked) case.

  One jitted program per call keeps the compile count (the cost of these tests) small.
  """

  def all_losses(z1, z2, p, where):
    results = {}
    for name in names:
      for negatives, masked in cases:
        def loss(a, b, q, name=name, negatives=negatives, masked=masked):
          return losses.info_nce(a, b, mapping=MAPPINGS[name](q), negatives=negatives,
                                 where=where if masked else None, block_size=block_size)
        q = p * PARAM.get(name, 1.0)
        results[name, negatives, masked] = jax.value_and_grad(loss, argnums=(0, 1, 2))(z1, z2, q)
    return results

  return jax.jit(all_losses)


def test_every_mapping_matches_dense_float32_block_not_dividing_n():
  z1, z2, where = _views(11, 6)
  cases = [("all", True)]
  dense = _loss_and_grads(MAPPINGS, cases, None)(z1, z2, 1.0, where)
  blocked = _loss_and_grads(MAPPINGS, cases, 4)(z1, z2, 1.0, where)
  chex.assert_trees_all_close(blocked, dense, atol=1e-5, rtol=1e-5)
  for name in PARAM:  # the gradient reached the parameter
    assert abs(float(blocked[name, "all", True][1][2])) > 1e-3


def test_both_negative_modes_and_masks_match_dense_float32():
  z1, z2, where = _views(12, 5, seed=1)
  cases = [("cross", False), ("cross", True), ("all", False)]
  dense = _loss_and_grads(["learnable"], cases, None)(z1, z2, 1.0, where)
  for block_size in (3, 64):  # divides N (the other test's does not), larger than N
    blocked = _loss_and_grads(["learnable"], cases, block_size)(z1, z2, 1.0, where)
    chex.assert_trees_all_close(blocked, dense, atol=1e-5, rtol=1e-5)


def test_matches_dense_float64():
  with jax.enable_x64(True):
    z1, z2, where = _views(9, 4, dtype=jnp.float64, seed=2)
    names = ["free", "free_generic", "learnable", "dynamic"]
    cases = [("cross", True), ("all", False)]
    dense = _loss_and_grads(names, cases, None)(z1, z2, 1.0, where)
    blocked = _loss_and_grads(names, cases, 4)(z1, z2, 1.0, where)
    assert blocked["free", "all", False][0].dtype == jnp.float64
    chex.assert_trees_all_close(blocked, dense, atol=1e-10, rtol=1e-10)


def test_per_row_losses_match_numpy_reference():
  z1, z2, _ = _views(7, 3, seed=3)
  u = np.concatenate([np.asarray(losses.l2_normalize(z)) for z in (z1, z2)]).astype(np.float64)
  cos = u @ u.T
  np.fill_diagonal(cos, 0.0)
  logits = np.log1p(cos) - np.log1p(-cos)  # Eq. 11
  np.fill_diagonal(logits, -np.inf)
  lse = np.log(np.sum(np.exp(logits), axis=1))
  expected = lse - logits[np.arange(14), (np.arange(14) + 7) % 14]
  rows = losses.info_nce(z1, z2, negatives="all", reduction="none", block_size=3)
  # float32 against float64: 2 / (1 - c^2) amplifies the cosine's rounding near c = 1.
  np.testing.assert_allclose(rows, expected, rtol=1e-4, atol=1e-4)


def test_equal_logits_give_log_of_candidates():
  z = jnp.ones((10, 4))
  loss = losses.info_nce(z, z, mapping=mappings.temperature_free(), block_size=3)
  np.testing.assert_allclose(loss, math.log(10), rtol=1e-6)


def test_finite_at_the_dense_edge_cases():
  # Identical views (cos = 1), antipodal negatives (cos = -1) and a zero vector.
  base = jnp.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0], [0.0, 2.0]])

  @functools.partial(jax.jit, static_argnums=1)
  def losses_and_grads(z, block_size):
    results = []
    for mapping in (mappings.temperature_free(), mappings.temperature(0.05)):
      for negatives in ("cross", "all"):
        def loss(z, mapping=mapping, negatives=negatives):
          return losses.info_nce(z, z, mapping=mapping, negatives=negatives,
                                 block_size=block_size)
        results.append(jax.value_and_grad(loss)(z))
    return results

  blocked = losses_and_grads(base, 3)
  chex.assert_tree_all_finite(blocked)
  chex.assert_trees_all_close(blocked, losses_and_grads(base, None), atol=1e-5)


def _largest_intermediate(jaxpr) -> int:
  largest = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      largest = max(largest, math.prod(getattr(var.aval, "shape", ())))
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", None)
        if inner is not None:
          largest = max(largest, _largest_intermediate(getattr(inner, "jaxpr", inner)))
  return largest


def test_loss_and_gradient_never_hold_the_logits():
  n, d, block_size = 64, 4, 8
  z1, z2, _ = _views(n, d)

  def loss(a, b, block_size):
    return losses.info_nce(a, b, negatives="all", block_size=block_size)

  dense = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(z1, z2, None)
  blocked = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(z1, z2, block_size)
  assert _largest_intermediate(dense.jaxpr) >= (2 * n) ** 2  # the check sees the logits
  assert _largest_intermediate(blocked.jaxpr) <= max(block_size**2, 2 * n * d)


@pytest.mark.parametrize("block_size", [0, -3])
def test_nonpositive_block_size_raises(block_size):
  z = jnp.ones((4, 2))
  with pytest.raises(ValueError, match="block_size"):
    losses.info_nce(z, z, block_size=block_size)


@pytest.mark.parametrize("block_size", [2.0, True, "4"])
def test_non_int_block_size_raises(block_size):
  z = jnp.ones((4, 2))
  with pytest.raises(TypeError, match="block_size"):
    losses.info_nce(z, z, block_size=block_size)


def test_numpy_integer_block_size_accepted():
  assert blockwise.check_block_size(np.int64(8)) == 8


def test_balanced_tile_bounds_memory_keeps_tile_count_and_pads_under_a_row_per_tile():
  for n in range(1, 200):
    for block_size in range(1, 230, 7):
      tile = blockwise.balanced_tile(block_size, n)
      count = -(-n // block_size)
      assert tile <= block_size
      assert -(-n // tile) == count
      assert count * tile - n < count


def test_bound_free_mapping_keeps_the_fast_path():
  from tfcl_jax import tiles  # noqa: PLC0415

  bound = mappings.temperature_free().bind(params={}, step=3)
  pure = tiles.pure_mapping(bound, tile_shape=(2, 2), like=jnp.zeros((2, 2)))
  assert isinstance(pure.fn, tiles.FreeLogOdds)
