"""Closed forms (Eq. 3-13) against NumPy references and info_nce; autodiff gradient scales
against the closed forms in float64; the hardness view against NumPy."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfcl_jax import analysis, losses, mappings

TAUS = np.array([0.1, 0.25, 0.5, 1.0])
NS = (2, 4, 8, 16)
CS = np.linspace(0.01, 0.99, 33)
TS = np.linspace(-3.0, 3.0, 13)
# info_nce's softplus row loss gives the positive sigmoid(lse_negatives - positive), not
# p_positive - 1, so autodiff keeps its relative accuracy even where the scale is ~1e-8.
RTOL, ATOL = 1e-9, 0.0


def _ref_loss(logits):
  """-log softmax(logits)[0] = log(1 + sum_j exp(l_j - l_0)), NumPy float64 (Eq. 2, 5, 8)."""
  logits = np.asarray(logits, np.float64)
  return np.log1p(np.sum(np.exp(logits[1:] - logits[0])))


def _pattern(C, n):
  return np.array([C] + [-C] * (n - 1))


def _embeddings(cosines):
  """Anchor and candidates with the given cosines, built here (not by the code under test)."""
  n = len(cosines)
  anchor = np.zeros(n + 1)
  anchor[0] = 1.0
  z2 = np.zeros((n, n + 1))
  z2[:, 0] = cosines
  z2[np.arange(n), np.arange(n) + 1] = np.sqrt(1.0 - np.square(cosines))
  return np.concatenate([anchor[None], z2[1:]]), z2


@jax.jit
def _row0_losses(z1, z2, tau, t):
  """info_nce's row-0 loss for cos/tau, exp(t) cos and the free mapping: one compile per N."""
  row0 = lambda mapping: losses.info_nce(z1, z2, mapping=mapping, reduction="none")[0]
  return (row0(mappings.temperature(tau)), row0(mappings.learnable_temperature(t=t)),
          row0(mappings.temperature_free()))


class ClosedFormLossTest(chex.TestCase):

  def test_losses_match_numpy_and_info_nce(self):
    with jax.enable_x64(True):
      for C in (0.05, 0.3, 0.7, 0.95):
        for n, tau, t in zip(NS, TAUS, (-3.0, 0.0, 1.0, 2.5), strict=True):
          for tau_n in TAUS:  # Eq. 3 (N = 2) and Eq. 6 over the tau grid
            ref = _ref_loss(_pattern(C, n) / tau_n)
            np.testing.assert_allclose(analysis.eq6(C, tau_n, n), ref, rtol=1e-12)
            if n == 2:
              np.testing.assert_allclose(analysis.eq3(C, tau_n), ref, rtol=1e-12)
          ref_eq9 = _ref_loss(_pattern(C, 2) * np.exp(t))
          np.testing.assert_allclose(analysis.eq9(C, t), ref_eq9, rtol=1e-12)
          # Eq. 12 as printed: -log((1+C)^2 / ((1+C)^2 + (N-1)(1-C)^2)).
          ref_eq12 = -np.log((1 + C) ** 2 / ((1 + C) ** 2 + (n - 1) * (1 - C) ** 2))
          np.testing.assert_allclose(analysis.eq12(C, n), ref_eq12, rtol=1e-12)
          # The same values from the library's info_nce at the pattern.
          got_tau, _, got_free = _row0_losses(*_embeddings(_pattern(C, n)), tau, t)
          np.testing.assert_allclose(got_tau, analysis.eq6(C, tau, n), rtol=1e-12)
          np.testing.assert_allclose(got_free, ref_eq12, rtol=1e-12)
          _, got_learnable, _ = _row0_losses(*_embeddings(_pattern(C, 2)), tau, t)
          np.testing.assert_allclose(got_learnable, ref_eq9, rtol=1e-12)

  def test_closed_form_gradients_match_numpy_derivative(self):
    # Central differences of the NumPy losses: independent of the closed-form algebra.
    h = 1e-6
    for C in (0.2, 0.6):
      for tau in TAUS:
        for n in NS:
          loss = lambda c, n=n, tau=tau: _ref_loss(_pattern(c, n) / tau)
          slope = (loss(C + h) - loss(C - h)) / (2 * h)
          np.testing.assert_allclose(analysis.eq7(C, tau, n), abs(slope), rtol=1e-6)
      for n in NS:
        free = lambda c, n=n: _ref_loss(2 * np.arctanh(_pattern(c, n)))
        np.testing.assert_allclose(analysis.eq13(C, n), abs((free(C + h) - free(C - h)) / (2 * h)),
                                   rtol=1e-6)
      t = 0.7
      loss = lambda t_value, C=C: _ref_loss(_pattern(C, 2) * np.exp(t_value))
      slope = (loss(t + h) - loss(t - h)) / (2 * h)
      np.testing.assert_allclose(analysis.eq10(C, t), abs(slope), rtol=1e-6)

  def test_identities_and_limits(self):
    with jax.enable_x64(True):
      C = np.linspace(-0.99, 1.0, 41)
      for tau in TAUS:
        np.testing.assert_allclose(analysis.eq3(C, tau), analysis.eq6(C, tau, 2), rtol=1e-15)
        np.testing.assert_allclose(analysis.eq4(C, tau), analysis.eq7(C, tau, 2), rtol=1e-15)
      for n in NS:
        self.assertEqual(float(analysis.eq13(1.0, n)), 0.0)
        self.assertEqual(float(analysis.eq12(1.0, n)), 0.0)
        near_one = analysis.eq13(1.0 - np.logspace(-3, -12, 10), n)
        self.assertTrue(np.all(np.diff(np.asarray(near_one)) < 0))  # decreasing toward 0
        self.assertLess(float(near_one[-1]), 1e-10)
      self.assertTrue(np.all(np.asarray(analysis.eq10(0.0, TS)) == 0.0))
      # Finite where the naive forms overflow or cancel.
      chex.assert_tree_all_finite(
          [analysis.eq3(-1.0, 1e-3), analysis.eq4(-1.0, 1e-3), analysis.eq12(-1 + 1e-15, 16),
           analysis.eq13(-1 + 1e-15, 16), analysis.eq10(-1.0, 8.0)])

  def test_broadcasting(self):
    grid = analysis.eq7(jnp.asarray(CS, jnp.float32)[:, None, None], TAUS[None, :, None],
                        np.array(NS)[None, None, :])
    chex.assert_shape(grid, (len(CS), len(TAUS), len(NS)))
    chex.assert_type(grid, jnp.float32)

  def test_softmax_ceiling(self):
    # Example 3.1: the values the paper quotes, sigma(2) = 0.88 and sigma(20) = 0.99...
    np.testing.assert_allclose(analysis.softmax_ceiling(1.0), 1 / (1 + np.exp(-2.0)), rtol=1e-6)
    np.testing.assert_allclose(analysis.softmax_ceiling(0.1), 1 / (1 + np.exp(-20.0)), rtol=1e-6)
    for tau in TAUS:
      np.testing.assert_allclose(analysis.optimum_probability(mappings.temperature(tau)),
                                 1 / (1 + np.exp(-2 / tau)), rtol=1e-6)
    free = float(analysis.optimum_probability(mappings.temperature_free()))
    self.assertGreater(free, 1 / (1 + np.exp(-2 * mappings.max_free_logit("float32"))) - 1e-7)
    with jax.enable_x64(True):
      # Example 3.1's deviation from one: 2e-9 for tau = 0.1; below float64 resolution when free.
      np.testing.assert_allclose(1 - analysis.softmax_ceiling(0.1), 1 / (1 + np.exp(20.0)),
                                 rtol=1e-6)
      self.assertEqual(float(analysis.optimum_probability(mappings.temperature_free())), 1.0)
    for n in NS:
      np.testing.assert_allclose(
          analysis.optimum_probability(mappings.temperature(0.5), N=n),
          np.exp(2.0) / (np.exp(2.0) + (n - 1) * np.exp(-2.0)), rtol=1e-6)


class AutodiffGradientScaleTest(chex.TestCase):

  # Jitted only: eager, the vmapped loss runs op by op for every N (30 s); the eager path of the
  # same functions is test_eq10's and test_gradient_scale_takes_a_spec_string_and_matches_eq4's.
  @chex.variants(with_jit=True)
  def test_eq4_eq7_eq13(self):
    def scales(c, taus):
      """Eq. 7 over the tau grid and Eq. 13 for every N: one program (compiles dominate)."""
      return {n: (jax.vmap(lambda tau, n=n: analysis.gradient_scale(
          mappings.temperature(tau), c, n))(taus),
                  analysis.gradient_scale(mappings.temperature_free(), c, n)) for n in NS}

    with jax.enable_x64(True):
      results = self.variant(scales)(jnp.asarray(CS), jnp.asarray(TAUS))
      for n, (by_tau, free) in results.items():
        chex.assert_type([by_tau, free], jnp.float64)
        chex.assert_shape(by_tau, (len(TAUS), len(CS)))
        # Eq. 7 (Eq. 4 at N = 2) and Eq. 13, written here.
        want = (2 / TAUS[:, None]) * (n - 1) / ((n - 1) + np.exp(2 * CS[None, :] / TAUS[:, None]))
        np.testing.assert_allclose(by_tau, want, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(by_tau, analysis.eq7(CS[None, :], TAUS[:, None], n), rtol=RTOL,
                                   atol=ATOL)
        if n == 2:
          np.testing.assert_allclose(by_tau, analysis.eq4(CS[None, :], TAUS[:, None]), rtol=RTOL,
                                     atol=ATOL)
        want = 4 * (n - 1) * (1 - CS) / ((1 + CS) * (n * (1 - CS) ** 2 + 4 * CS))
        np.testing.assert_allclose(free, want, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(free, analysis.eq13(CS, n), rtol=RTOL, atol=ATOL)

  @chex.variants(with_jit=True, without_jit=True)
  def test_eq10(self):
    with jax.enable_x64(True):
      C = np.concatenate([[0.0], CS])
      got = self.variant(analysis.temperature_gradient_scale)(
          jnp.asarray(C)[:, None], jnp.asarray(TS)[None, :])
      chex.assert_shape(got, (len(C), len(TS)))
      scale = np.exp(TS)[None, :]
      want = 2 * C[:, None] * scale / (1 + np.exp(2 * C[:, None] * scale))
      np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
      np.testing.assert_allclose(got, analysis.eq10(C[:, None], TS[None, :]), rtol=RTOL, atol=ATOL)
      self.assertTrue(np.all(np.asarray(got[0]) == 0.0))  # Eq. 10 is 0 at C = 0 for every t

  def test_float32_default(self):
    got = analysis.gradient_scale(mappings.temperature(0.5), jnp.asarray(CS, jnp.float32), 4)
    chex.assert_type(got, jnp.float32)
    chex.assert_shape(got, CS.shape)
    np.testing.assert_allclose(got, analysis.eq7(CS, 0.5, 4), rtol=1e-4)

  def test_float32_keeps_relative_accuracy_near_the_optimum(self):
    # info_nce's softplus row loss gives the positive sigmoid(lse_negatives - positive), not
    # p_positive - 1 (which rounds to 0 once 1 - p < eps and halves the scale at tau = 0.1).
    # The float32 values of C, in float64: the closed forms at the C the loss really sees.
    c = np.array([0.5, 0.8, 0.9, 0.99, 0.999], np.float32).astype(np.float64)
    eq7 = 1 * (2 / 0.1) / (1 + np.exp(2 * c / 0.1))  # N = 2, tau = 0.1, in float64
    eq13 = 4 * 15 * (1 - c) / ((1 + c) * (16 * (1 - c) ** 2 + 4 * c))  # N = 16
    for mapping, n, closed in ((mappings.temperature(0.1), 2, eq7),
                               (mappings.temperature_free(), 16, eq13)):
      got = analysis.gradient_scale(mapping, jnp.asarray(c, jnp.float32), n)
      chex.assert_type(got, jnp.float32)
      np.testing.assert_allclose(np.asarray(got, np.float64), closed, rtol=5e-6)


class HardnessTest(chex.TestCase):

  def test_weights_and_gradients_match_numpy(self):
    rng = np.random.default_rng(0)
    positive = rng.uniform(-0.9, 0.9, size=(3,))
    negatives = rng.uniform(-0.9, 0.9, size=(3, 5))
    free_logit = lambda s: np.log((1 + s) / (1 - s))
    free_slope = lambda s: 2 / (1 - s * s)
    for mapping, f, slope in ((mappings.temperature(0.2), lambda s: s / 0.2, lambda s: 5.0 + 0 * s),
                              (mappings.temperature_free(), free_logit, free_slope)):
      logits = f(np.concatenate([positive[:, None], negatives], axis=1))
      probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
      weights = analysis.negative_weights(mapping, positive, negatives)
      chex.assert_shape(weights, (3, 5))
      np.testing.assert_allclose(weights, probs[:, 1:], rtol=1e-5)
      # With the positive's probability (computed here) they sum to 1.
      np.testing.assert_allclose(np.sum(weights, axis=1) + probs[:, 0], 1.0, rtol=1e-6)
      grads = analysis.negative_gradients(mapping, positive, negatives)
      np.testing.assert_allclose(grads, probs[:, 1:] * slope(negatives), rtol=1e-4)

  def test_harder_negatives_weigh_more(self):
    negatives = np.linspace(-0.9, 0.9, 7)
    for spec in ("tau=0.1", "tau=1", "free", "dynamic=0.1:0.2"):
      weights = np.asarray(analysis.negative_weights(mappings.from_spec(spec), 0.5, negatives))
      self.assertTrue(np.all(np.diff(weights) > 0), spec)


class BadInputTest(chex.TestCase):

  def test_bad_inputs(self):
    free = mappings.temperature_free()
    with pytest.raises(ValueError, match="N must be >= 2"):
      analysis.eq7(0.5, 0.1, 1)
    with pytest.raises(ValueError, match="N must be >= 2"):
      analysis.gradient_scale(free, 0.5, 1)
    with pytest.raises(TypeError, match="N must be a Python int"):
      analysis.gradient_scale(free, 0.5, 2.0)
    with pytest.raises(TypeError, match="N .* must be an integer"):
      analysis.eq13(0.5, 2.5)
    with pytest.raises(ValueError, match="tau must be finite and > 0"):
      analysis.eq4(0.5, 0.0)
    with pytest.raises(ValueError, match="tau must be finite and > 0"):
      analysis.eq6(0.5, np.array([0.1, -1.0]), 4)
    with pytest.raises(ValueError, match="C must lie in"):
      analysis.eq4(1.5, 0.1)
    with pytest.raises(ValueError, match="C must lie in"):
      analysis.eq13(-1.0, 4)
    with pytest.raises(ValueError, match=r"C must lie in \(-1, 1\)"):
      analysis.gradient_scale(free, jnp.array([0.5, 1.0]), 2)
    with pytest.raises(ValueError, match="C must lie in"):
      analysis.temperature_gradient_scale(-1.0, 0.0)
    with pytest.raises(TypeError, match="C must be a float"):
      analysis.eq3(1, 0.5)
    with pytest.raises(TypeError, match="C must be a float"):
      analysis.gradient_scale(free, jnp.array([0, 1]), 2)
    with pytest.raises(TypeError, match="tau must be a real number"):
      analysis.eq3(0.5, "0.1")
    with pytest.raises(ValueError, match="t must be finite"):
      analysis.eq10(0.5, np.inf)
    with pytest.raises(TypeError, match="mapping must be a callable"):
      analysis.gradient_scale(0.1, 0.5, 2)
    with pytest.raises(ValueError, match="Invalid mapping spec 'fre'"):
      analysis.gradient_scale("fre", 0.5, 2)
    with pytest.raises(ValueError, match="cos_negatives must have a last axis"):
      analysis.negative_weights(free, 0.5, 0.2)
    with pytest.raises(ValueError, match="cos_negatives must lie in"):
      analysis.negative_gradients(free, 0.5, [0.2, 1.0])


def test_gradient_scale_takes_a_spec_string_and_matches_eq4():
  for C in (-0.5, 0.2, 0.7):
    np.testing.assert_allclose(analysis.gradient_scale("tau=0.5", jnp.array(C), 2),
                               analysis.eq4(C, 0.5), rtol=1e-5)
