"""The fused kernels (`info_nce(..., implementation="pallas")`, interpreted on CPU) against the
XLA engine and a NumPy reference: values and gradients (embeddings and the map's parameters),
ragged N and D, masks, extra negatives, every mapping with scalar parameters, bfloat16 inputs;
the Triton family (GPUs, what a CPU runs) and the Mosaic family (TPUs, forced here)."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfcl_jax import losses, mappings, schedules
from tfcl_jax.losses import _kernel_tpu, _kernel_triton, _pallas

# 37 rows in blocks of 16 (ragged, padded inside); D = 70 in chunks of 64 (two chunks, the
# second padded with zeros).
N, D, BANK = 37, 70, 19
SCHEDULE = schedules.linear(tau_start=0.5, tau_end=0.1, steps=10)

MAPPINGS = {
    "tau": mappings.temperature(0.2),
    "free": mappings.temperature_free(),
    "learnable": mappings.learnable_temperature(tau=0.3),
    "learnable_capped": mappings.learnable_temperature(tau=0.001, max_scale=100.0),
    "dynamic": mappings.dynamic_temperature(0.1, 0.2),
    "annealed": mappings.annealed_temperature(SCHEDULE).bind(step=3.0),  # a float leaf
}
MODES = {
    "cross": dict(negatives="cross"),
    "symmetric": dict(negatives="cross", symmetric=True),
    "all": dict(negatives="all"),
    "all-masked": dict(negatives="all", masked=True),
    "cross-masked-bank": dict(negatives="cross", masked=True, bank=True),
    "symmetric-bank": dict(negatives="cross", symmetric=True, bank=True),
    "all-bank": dict(negatives="all", bank=True),
}


def _views(dtype=jnp.float32):
  z1 = jax.random.normal(jax.random.key(0), (N, D))
  z2 = z1 + 0.8 * jax.random.normal(jax.random.key(1), (N, D))
  bank = jax.random.normal(jax.random.key(2), (BANK, D))
  return z1.astype(dtype), z2.astype(dtype), (jnp.arange(N) % 5) != 2, bank.astype(dtype)


def _kwargs(mode, where, bank):
  mode = dict(mode)
  if mode.pop("masked", False):
    mode["where"] = where
  if mode.pop("bank", False):
    mode["extra_negatives"] = bank
    mode["extra_where"] = jnp.arange(BANK) % 4 != 1
  return mode


def _grad(mode, where, bank):
  def loss(a, b, mapping, implementation):
    return losses.info_nce(a, b, mapping=mapping, block_size=16, implementation=implementation,
                           **_kwargs(mode, where, bank))

  return jax.value_and_grad(loss, argnums=(0, 1, 2))


# Every mapping on the two hardest modes (masked NT-Xent; the two-tower loss with a bank),
# every mode under the learnable map (its parameter's gradient takes every path).
CASES = ([(name, "all-masked") for name in MAPPINGS]
         + [(name, "symmetric-bank") for name in MAPPINGS if name != "learnable"]
         + [("learnable", mode) for mode in MODES if mode != "all-masked"])


@pytest.mark.parametrize("name, mode", CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_pallas_equals_xla_values_and_gradients(name, mode):
  z1, z2, where, bank = _views()
  grad = _grad(MODES[mode], where, bank)
  expected, got = (jax.jit(grad, static_argnums=3)(z1, z2, MAPPINGS[name], implementation)
                   for implementation in ("xla", "pallas"))
  chex.assert_trees_all_close(got, expected, atol=1e-5, rtol=1e-5)


# The TPU kernels (blocks of 128 rows: 37 rows padded to one block, 150 to two).
TPU_CASES = ([(name, "all-masked", N) for name in ("free", "learnable_capped", "annealed")]
             + [("learnable", mode, 150) for mode in ("cross", "symmetric-bank", "all-bank")]
             + [("dynamic", "cross-masked-bank", 150)])


@pytest.mark.parametrize("name, mode, rows", TPU_CASES,
                         ids=[f"{n}-{m}-{r}" for n, m, r in TPU_CASES])
def test_tpu_kernels_equal_xla_values_and_gradients(name, mode, rows, monkeypatch):
  monkeypatch.setattr(_pallas, "pallas_reduce",
                      functools.partial(_pallas.pallas_reduce, family="mosaic_tpu"))
  z1 = jax.random.normal(jax.random.key(0), (rows, D))
  z2 = z1 + 0.8 * jax.random.normal(jax.random.key(1), (rows, D))
  where = (jnp.arange(rows) % 5) != 2
  _, _, _, bank = _views()
  grad = _grad(MODES[mode], where, bank)
  expected, got = (jax.jit(grad, static_argnums=3)(z1, z2, MAPPINGS[name], implementation)
                   for implementation in ("xla", "pallas"))
  chex.assert_trees_all_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_traced_temperature_closed_over_by_the_map_gets_its_gradient():
  # A schedule evaluated outside the loss: the map closes over a traced tau.
  z1, z2, _, _ = _views()

  def loss(tau, implementation):
    return losses.info_nce(z1, z2, mapping=mappings.temperature(tau), negatives="all",
                           block_size=16, implementation=implementation)

  expected, got = (jax.jit(jax.value_and_grad(loss), static_argnums=1)(0.3, implementation)
                   for implementation in ("xla", "pallas"))
  chex.assert_trees_all_close(got, expected, atol=1e-5, rtol=1e-5)


def test_bfloat16_inputs_are_computed_in_float32_like_the_xla_engine():
  z1, z2, where, bank = _views(jnp.bfloat16)
  grad = jax.jit(_grad(MODES["symmetric"], where, bank), static_argnums=3)
  expected, got = (grad(z1, z2, MAPPINGS["free"], implementation)
                   for implementation in ("xla", "pallas"))
  assert got[0].dtype == jnp.float32 and got[1][0].dtype == jnp.bfloat16
  chex.assert_trees_all_close(got, expected, atol=1e-2, rtol=1e-2)  # bfloat16 gradients
  z1_32, z2_32 = z1.astype(jnp.float32), z2.astype(jnp.float32)
  np.testing.assert_allclose(got[0], grad(z1_32, z2_32, MAPPINGS["free"], "xla")[0], rtol=1e-5)


def test_pallas_equals_numpy_nt_xent():
  z1, z2, _, _ = _views()
  u = np.concatenate([z1, z2]).astype(np.float64)
  u /= np.linalg.norm(u, axis=1, keepdims=True)
  logits = np.log1p(u @ u.T) - np.log1p(-np.clip(u @ u.T, -1, 1 - 1e-12))  # 2 artanh
  np.fill_diagonal(logits, -np.inf)
  positive = (np.arange(2 * N) + N) % (2 * N)
  lse = np.log(np.exp(logits).sum(axis=1))
  expected = np.mean(lse - logits[np.arange(2 * N), positive])
  got = losses.info_nce(z1, z2, negatives="all", implementation="pallas", block_size=16)
  np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_tiles_are_powers_of_two_on_gpus_and_lane_multiples_on_tpus():
  for rows, dim, block_size in [(37, 70, 16), (1000, 128, None), (4096, 768, None),
                                (2**17, 256, 1000), (5, 3, None)]:
    tiles = _kernel_triton.tiles(rows, rows, dim, block_size)
    assert tiles.block & (tiles.block - 1) == 0 and tiles.block_d & (tiles.block_d - 1) == 0
    assert min(tiles.block, tiles.block_d) >= _kernel_triton.SMALLEST_BLOCK
    assert tiles.padded_dim(dim) % tiles.block_d == 0 and tiles.padded_dim(dim) >= dim
    if block_size is not None:
      assert tiles.block <= max(block_size, _kernel_triton.SMALLEST_BLOCK)
    tpu = _kernel_tpu.tiles(rows, rows, dim, block_size)
    assert tpu.block % 128 == 0 and tpu.padded_dim(dim) == dim


def test_bad_implementation_block_size_and_unsupported_mapping():
  z1, z2, _, _ = _views()
  with pytest.raises(ValueError, match="implementation"):
    losses.info_nce(z1, z2, implementation="triton")
  with pytest.raises(ValueError, match="block_size must be >= 16"):
    losses.info_nce(z1, z2, implementation="pallas", block_size=8)
  vector_params = mappings.Mapping("vec", lambda c, p, s: c * p["w"][0], {"w": jnp.ones(2)})
  with pytest.raises(ValueError, match="params are scalars"):
    losses.info_nce(z1, z2, mapping=vector_params, implementation="pallas")
  table = jnp.array([2.0, 0.5])
  closes_over_array = mappings.Mapping("table", lambda c, p, s: c * table[0] + table[1])
  with pytest.raises(ValueError, match="closes over scalars only"):
    jax.jit(lambda a, b: losses.info_nce(a, b, mapping=closes_over_array, block_size=16,
                                         implementation="pallas"))(z1, z2)
