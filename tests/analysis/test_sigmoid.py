"""Sigmoid-loss gradient scales: closed forms against autodiff through `losses.sigmoid_loss`."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.marks import widest
from tfcl_jax import mappings
from tfcl_jax.analysis import sigmoid

GRID = np.linspace(-0.95, 0.95, 39)
# Many candidates; two (Eq. 4's case) and a batch in between in the heavy run.
COUNTS = widest(2, 16, 64, quick=(64,))


@pytest.fixture(autouse=True)
def _x64():
  with jax.enable_x64(True):
    yield


@pytest.mark.parametrize("N", COUNTS)
def test_closed_forms_equal_autodiff(N):
  for tau in (0.1, 0.25, 1.0):
    for b in (0.0, -2.0):
      autodiff = sigmoid.sigmoid_gradient_scale(mappings.temperature(tau), GRID, N, bias=b)
      np.testing.assert_allclose(autodiff, sigmoid.sigmoid_gradient_scale_tau(GRID, tau, N, b=b),
                                 rtol=1e-9)
  for b in (0.0, 1.5, -10.0):
    autodiff = sigmoid.sigmoid_gradient_scale(mappings.temperature_free(), GRID, N, bias=b)
    np.testing.assert_allclose(autodiff, sigmoid.sigmoid_gradient_scale_free(GRID, N, b=b),
                               rtol=1e-9)
  doubled = sigmoid.sigmoid_gradient_scale(lambda c: 2 * mappings.temperature_free()(c), GRID, N)
  np.testing.assert_allclose(doubled, sigmoid.sigmoid_gradient_scale_free(GRID, N, k=2.0),
                             rtol=1e-9)
  t = np.array([0.0, np.log(10.0), 3.0])[:, None]
  for b in (0.0, -10.0):
    dt, db = sigmoid.sigmoid_parameter_gradients(GRID[None, :], t, N, bias=b)
    np.testing.assert_allclose(jnp.abs(dt), sigmoid.sigmoid_gradient_t(GRID[None, :], t, N, b=b),
                               rtol=1e-9, atol=1e-300)
    np.testing.assert_allclose(db, sigmoid.sigmoid_gradient_b(GRID[None, :], t, N, b=b),
                               rtol=1e-9, atol=1e-15)


def test_what_the_closed_forms_say():
  C = np.array([0.0, 0.5, 1.0])
  # Free mapping, b = 0: N / (1 + C): never vanishing, N / 2 at the optimum.
  np.testing.assert_allclose(sigmoid.sigmoid_gradient_scale_free(C, 8), 8 / (1 + C), rtol=1e-12)
  # Best bias at C = 1: b = -log(N - 1)/2 leaves sqrt(N - 1); k = 2 leaves 0.
  best = -0.5 * np.log(7.0)
  np.testing.assert_allclose(sigmoid.sigmoid_gradient_scale_free(1.0, 8, b=best), np.sqrt(7.0))
  assert float(sigmoid.sigmoid_gradient_scale_free(1.0, 8, k=2.0)) == 0.0
  # Division by tau at the optimum: N sigma(-1/tau)/tau, growing with N (Eq. 7's trade-off).
  scale = sigmoid.sigmoid_gradient_scale_tau(1.0, 0.5, np.array([2, 16]))
  np.testing.assert_allclose(scale, np.array([2, 16]) / (1 + np.exp(2.0)) / 0.5, rtol=1e-12)
  # Eq. 10's analogue: t gets no gradient at C = 0 whatever the bias.
  assert float(sigmoid.sigmoid_gradient_t(0.0, 1.0, 16, b=-10.0)) == 0.0
  chex.assert_tree_all_finite(sigmoid.sigmoid_gradient_scale_free(np.array([-0.999, 1.0]), 4))
