"""The fused Pallas kernel (`info_nce(..., implementation="pallas")`, interpreted on CPU)
against the XLA engine and a NumPy reference: values and gradients, ragged N, masks."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfcl_jax import losses, mappings, schedules

N, D = 21, 6  # 21 rows in tiles of 8: ragged, padded inside

MAPPINGS = {
    "tau": mappings.temperature(0.2),
    "free": mappings.temperature_free(),
    "learnable": mappings.learnable_temperature(tau=0.3),
    "dynamic": mappings.dynamic_temperature(0.1, 0.2),
    "annealed": mappings.annealed_temperature(
        schedules.linear(tau_start=0.5, tau_end=0.1, steps=10)).bind(step=3.0),  # a float leaf
}
MODES = [dict(negatives="cross"), dict(negatives="cross", symmetric=True),
         dict(negatives="all"), dict(negatives="all", masked=True)]


def _views():
  z1 = jax.random.normal(jax.random.key(0), (N, D))
  z2 = z1 + 0.8 * jax.random.normal(jax.random.key(1), (N, D))
  return z1, z2, (jnp.arange(N) % 5) != 2


# Every mapping on the hardest mode (masked NT-Xent), every mode under a learnable map.
CASES = ([(name, MODES[-1]) for name in MAPPINGS]
         + [("learnable", mode) for mode in MODES[:-1]])


@pytest.mark.parametrize("name, mode", CASES,
                         ids=[f"{n}-" + "-".join(f"{k}={v}" for k, v in m.items())
                              for n, m in CASES])
def test_pallas_equals_xla_values_and_gradients(name, mode):
  z1, z2, where = _views()
  mode = dict(mode)
  if mode.pop("masked", False):
    mode["where"] = where

  def loss(a, b, mapping, implementation):
    return losses.info_nce(a, b, mapping=mapping, block_size=8, implementation=implementation,
                           **mode)

  grad = jax.value_and_grad(loss, argnums=(0, 1, 2))
  expected = grad(z1, z2, MAPPINGS[name], "xla")
  got = jax.jit(grad, static_argnums=3)(z1, z2, MAPPINGS[name], "pallas")
  chex.assert_trees_all_close(got, expected, atol=1e-5, rtol=1e-5)


def test_pallas_equals_numpy_nt_xent():
  z1, z2, _ = _views()
  u = np.concatenate([z1, z2]).astype(np.float64)
  u /= np.linalg.norm(u, axis=1, keepdims=True)
  logits = np.log1p(u @ u.T) - np.log1p(-np.clip(u @ u.T, -1, 1 - 1e-12))  # 2 artanh
  np.fill_diagonal(logits, -np.inf)
  positive = (np.arange(2 * N) + N) % (2 * N)
  lse = np.log(np.exp(logits).sum(axis=1))
  expected = np.mean(lse - logits[np.arange(2 * N), positive])
  got = losses.info_nce(z1, z2, negatives="all", implementation="pallas", block_size=8)
  np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_bad_implementation_and_unsupported_mapping():
  z1, z2, _ = _views()
  with pytest.raises(ValueError, match="implementation"):
    losses.info_nce(z1, z2, implementation="triton")
  vector_params = mappings.Mapping("vec", lambda c, p, s: c * p["w"][0], {"w": jnp.ones(2)})
  with pytest.raises(ValueError, match="params are scalars"):
    losses.info_nce(z1, z2, mapping=vector_params, implementation="pallas")
