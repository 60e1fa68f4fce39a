"""Geometry metrics (alignment, uniformity, tolerance) against NumPy references written here."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from tfcl_jax.analysis import geometry


def _unit(z):
  z = np.asarray(z, np.float64)
  return z / np.linalg.norm(z, axis=-1, keepdims=True)


def _alignment_ref(z1, z2, alpha):
  return np.mean(np.linalg.norm(_unit(z1) - _unit(z2), axis=-1) ** alpha)


def _uniformity_ref(z, t):
  u = _unit(z)
  n = len(u)
  terms = [np.exp(-t * np.sum((u[i] - u[j]) ** 2)) for i in range(n) for j in range(n) if i != j]
  return np.log(np.mean(terms))


def _tolerance_ref(z, labels):
  u = _unit(z)
  n = len(u)
  values = [u[i] @ u[j] for i in range(n) for j in range(n) if i != j and labels[i] == labels[j]]
  return np.mean(values)


class GeometryTest(chex.TestCase, parameterized.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(0)
    self.z1 = rng.normal(size=(12, 5)).astype(np.float32)
    self.z2 = (self.z1 + 0.3 * rng.normal(size=(12, 5))).astype(np.float32)
    self.labels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 3, 4])

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(0.5, 1.0, 2.0, 3.0)
  def test_alignment_matches_numpy(self, alpha):
    fn = self.variant(lambda a, b: geometry.alignment(a, b, alpha=alpha))
    np.testing.assert_allclose(fn(self.z1, self.z2), _alignment_ref(self.z1, self.z2, alpha),
                               rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(0.5, 2.0, 10.0)
  def test_uniformity_matches_numpy(self, t):
    fn = self.variant(lambda z: geometry.uniformity(z, t=t))
    np.testing.assert_allclose(fn(self.z1), _uniformity_ref(self.z1, t), rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_tolerance_matches_numpy(self):
    fn = self.variant(geometry.tolerance)
    np.testing.assert_allclose(fn(self.z1, self.labels), _tolerance_ref(self.z1, self.labels),
                               rtol=1e-5)

  def test_uniformity_finite_where_every_term_underflows(self):
    # Antipodal points with t = 100: exp(-400) underflows float32, the log of it does not.
    z = jnp.array([[1.0, 0.0], [-1.0, 0.0]])
    np.testing.assert_allclose(geometry.uniformity(z, t=100.0), -400.0, rtol=1e-6)

  def test_invariants(self):
    # Identical views are perfectly aligned; collapsed points are maximally non-uniform (0).
    self.assertLess(float(geometry.alignment(self.z1, 3.0 * self.z1)), 1e-12)
    collapsed = jnp.ones((6, 3))
    self.assertAlmostEqual(float(geometry.uniformity(collapsed)), 0.0, places=5)
    self.assertAlmostEqual(float(geometry.tolerance(collapsed, jnp.zeros(6, jnp.int32))), 1.0,
                           places=5)

  def test_alignment_gradient_finite_at_zero_distance(self):
    grad = jax.grad(lambda z: geometry.alignment(z, self.z1, alpha=1.0))(jnp.asarray(self.z1))
    chex.assert_tree_all_finite(grad)

  def test_bad_input(self):
    with pytest.raises(ValueError, match="z1 and z2"):
      geometry.alignment(self.z1, self.z2[:3])
    with pytest.raises(ValueError, match="alpha"):
      geometry.alignment(self.z1, self.z2, alpha=0.0)
    with pytest.raises(TypeError, match="z1"):
      geometry.alignment(np.ones((3, 2), np.int32), self.z2)
    with pytest.raises(ValueError, match="N >= 2"):
      geometry.uniformity(self.z1[:1])
    with pytest.raises(ValueError, match="t must"):
      geometry.uniformity(self.z1, t=-1.0)
    with pytest.raises(ValueError, match="z must have rank 2"):
      geometry.uniformity(self.z1[0])
    with pytest.raises(TypeError, match="labels"):
      geometry.tolerance(self.z1, self.labels.astype(np.float32))
    with pytest.raises(ValueError, match="labels must have shape"):
      geometry.tolerance(self.z1, self.labels[:3])
    with pytest.raises(ValueError, match="same-label pair"):
      geometry.tolerance(self.z1[:3], np.arange(3))
