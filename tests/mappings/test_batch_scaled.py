"""The batch-scaled mappings (`calibrated_free`, `perplexity_free`, `accuracy_free`): their scales
against SciPy roots of the exact dense `L'(s)` and `H(s)` (float64, `batch_scaled_reference`) on
random batches, the fixed points of known batches (the paper's pattern, a separable batch, a batch
at chance), the stop-gradient, `bind(scale=)` and the errors."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import brentq

from tests.helpers import batch_scaled_reference as ref
from tests.helpers.marks import widest
from tfcl_jax import analysis, losses, mappings
from tfcl_jax.analysis import sigmoid

N, D = 12, 6
BUILD = {"calibrated": mappings.calibrated_free, "perplexity": mappings.perplexity_free,
         "accuracy": mappings.accuracy_free}
MODES = {"cross": {}, "symmetric": {"symmetric": True}, "all": {"negatives": "all"}}


def _views(seed, noise):
  k1, k2 = jax.random.split(jax.random.key(seed))
  z1 = jax.random.normal(k1, (N, D))
  return z1, z1 + noise * jax.random.normal(k2, (N, D))


@functools.partial(jax.jit, static_argnums=(0,))
def _scales(target, z1, z2):
  """The library's scale in every mode, one program per target."""
  return {mode: losses.batch_scale(z1, z2, mapping=BUILD[target](), **kwargs)
          for mode, kwargs in MODES.items()}


def _reference(target, z1, z2, mode):
  with jax.enable_x64(True):
    z1, z2 = (np.asarray(z, np.float64) for z in (z1, z2))
    return np.asarray(ref.solve(target, ref.dense(z1, z2, mode=mode)))


# The design's tolerance on s (the grid's interpolation and float32; ~1e-4 measured here).
RTOL = {"calibrated": 1e-3, "perplexity": 1e-3, "accuracy": 1e-3}


@pytest.mark.parametrize("target", widest(*sorted(BUILD), quick=("perplexity",)))
def test_solved_scale_matches_the_exact_root_on_random_batches(target):
  """Three batches from near chance to well ranked, three modes each, float32 inputs."""
  for seed, noise in ((0, 0.3), (1, 0.8), (2, 1.5)):
    z1, z2 = _views(seed, noise)
    for mode, got in _scales(target, z1, z2).items():
      want = _reference(target, z1, z2, mode)
      np.testing.assert_allclose(got, want, rtol=RTOL[target], err_msg=f"{mode}, seed {seed}")
      assert np.all((ref.S_MIN <= np.asarray(got)) & (np.asarray(got) <= ref.S_MAX))


def test_perplexity_scale_is_the_root_of_the_pattern_entropy():
  """Example 3.3's pattern [C, -C, ..., -C] for anchor 0: `p = 1 / (1 + (N - 1) e^{-4 s
  artanh C})` and the entropy `-p log p - (1 - p) log((1 - p)/(N - 1)) = log(N) / 2`."""
  n = 9

  def entropy(s, c):  # with x = (N - 1) e^{-4 s artanh C}: log(1 + x) + (1 - p) 4 s artanh C
    x = (n - 1) * np.exp(-4.0 * s * np.arctanh(c))
    return np.log1p(x) + x / (1.0 + x) * 4.0 * s * np.arctanh(c)

  solve = jax.jit(jax.vmap(lambda c: losses.batch_scale(
      *analysis.pattern.pattern_embeddings(analysis.pattern.paper_pattern(c, n)),
      mapping=mappings.perplexity_free())[0]))
  cs = np.array([0.05, 0.2, 0.5, 0.8])
  want = [brentq(lambda s, c=c: entropy(s, c) - 0.5 * np.log(n), 1e-2, 1e2, xtol=1e-14)
          for c in cs]
  np.testing.assert_allclose(solve(jnp.asarray(cs, jnp.float32)), want, rtol=1e-3)


def _orthogonal_batch(n, positive_cos):
  """Anchors `e_i`; candidate `i` is `c e_i + sqrt(1 - c^2) e_n`: positive cosine `c`, every
  negative cosine 0. Every positive ranks first (`c > 0`), by a margin `2 artanh(c)`."""
  eye = np.eye(n + 1)
  z2 = positive_cos * eye[:n] + np.sqrt(1 - positive_cos**2) * eye[n]
  return jnp.asarray(eye[:n], jnp.float32), jnp.asarray(z2, jnp.float32)


def _ring_batch(n):
  """Anchors `e_i`; candidate `j` is `(e_{j+1} - e_{j+2}) / sqrt 2`: each anchor's positive at
  cosine 0, one negative at `+1/sqrt 2`, one at `-1/sqrt 2`, the rest at 0. The positive equals
  its negatives' mean, below the best of them: `L'(s) = E_p[l] - l+ > 0` for every `s > 0`, and
  no positive ranks first (accuracy 0)."""
  eye = np.eye(n)
  z2 = (np.roll(eye, -1, axis=0) - np.roll(eye, -2, axis=0)) / np.sqrt(2)
  return jnp.asarray(eye, jnp.float32), jnp.asarray(z2, jnp.float32)


def test_fixed_points_at_the_bounds():
  jitted = jax.jit(lambda z1, z2, m: losses.batch_scale(z1, z2, mapping=m))

  def scale(z1, z2, m):
    return float(jitted(z1, z2, m))

  s_min, s_max = float(np.float32(ref.S_MIN)), float(np.float32(ref.S_MAX))
  separable = _orthogonal_batch(8, 0.03)  # accuracy 1, a margin of 0.06 nats
  chance = _ring_batch(8)
  calibrated, accuracy = mappings.calibrated_free(), mappings.accuracy_free()
  assert scale(*separable, calibrated) == s_max  # L'(s) < 0 for every s
  assert scale(*chance, calibrated) == s_min  # L'(s) > 0 for every s
  assert scale(*separable, accuracy) == s_max  # the entropy of a = 1 - 1e-6
  assert scale(*chance, accuracy) == s_min  # a = 1/N: the uniform softmax
  # A wide margin reaches accuracy 1's entropy at a finite scale, as the dense root does.
  wide = _orthogonal_batch(8, 0.5)
  np.testing.assert_allclose(scale(*wide, accuracy), _reference("accuracy", *wide, "cross"),
                             rtol=RTOL["accuracy"])


def test_accuracy_entropy_matches_its_definition():
  from tfcl_jax.losses._engine._solves import accuracy_entropy  # noqa: PLC0415

  for a, n in ((0.3, 16.0), (1 / 16, 16.0), (0.0, 16.0), (0.999, 5.0), (1.0, 5.0)):
    np.testing.assert_allclose(accuracy_entropy(jnp.float32(a), jnp.float32(n)),
                               ref.accuracy_target(a, n), rtol=1e-4)
  assert float(accuracy_entropy(jnp.float32(0.0), jnp.float32(16.0))) == pytest.approx(
      np.log(16.0), rel=1e-6)  # chance and below: uniform


def _dense_total_gradient(z1, z2):
  """The gradient of the dense loss with accuracy_free's scale differentiated through: the
  exact root by bisection, then one Newton step on `mean H(s) - mean H*` (its derivative in
  `z` is the implicit function's; the accuracy `a` is piecewise constant)."""

  def loss(a, b):
    d = ref.dense(a, b)
    logits = ref.free(d.cos)

    def mean_entropy(s):
      p = jax.nn.softmax(jnp.where(d.candidate, s * logits, -jnp.inf), axis=1)
      return jnp.mean(-jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), 1))

    positive = jnp.take_along_axis(logits, d.positive[:, None], 1)[:, 0]
    others = jnp.where(jnp.arange(N)[None, :] == d.positive[:, None], -jnp.inf, logits)
    accuracy = jax.lax.stop_gradient(jnp.mean(positive > jnp.max(others, 1)))
    a = jnp.clip(accuracy, 1.0 / N, 1.0 - 1e-6)
    wanted = -a * jnp.log(a) - (1 - a) * jnp.log((1 - a) / (N - 1))
    lo, hi = jnp.log(ref.S_MIN), jnp.log(ref.S_MAX)
    for _ in range(60):
      mid = 0.5 * (lo + hi)
      above = mean_entropy(jnp.exp(mid)) > wanted
      lo, hi = jnp.where(above, mid, lo), jnp.where(above, hi, mid)
    s0 = jax.lax.stop_gradient(jnp.exp(0.5 * (lo + hi)))
    g, slope = jax.jvp(lambda s: mean_entropy(s) - wanted, (s0,), (jnp.ones_like(s0),))
    return ref.info_nce(d, s0 - g / slope, masked=False)

  return jax.grad(loss, argnums=(0, 1))(z1, z2)


def test_the_scale_takes_no_gradient():
  """Unbound, the loss's gradient is the gradient at the solved scale held constant (bound), and
  the dense loss's at that scale; it is not the gradient with the scale differentiated through."""
  z1, z2 = _views(3, 0.8)
  m = mappings.accuracy_free()

  @jax.jit
  def grads(a, b):
    s = losses.batch_scale(a, b, mapping=m)
    unbound = jax.grad(lambda a, b: losses.info_nce(a, b, mapping=m), argnums=(0, 1))(a, b)
    bound = jax.grad(lambda a, b: losses.info_nce(a, b, mapping=m.bind(scale=s)),
                     argnums=(0, 1))(a, b)
    return s, unbound, bound

  s, unbound, bound = grads(z1, z2)
  chex.assert_trees_all_close(unbound, bound, atol=1e-6, rtol=1e-6)
  with jax.enable_x64(True):
    z1_64, z2_64 = (jnp.asarray(z, jnp.float64) for z in (z1, z2))
    held = jax.grad(lambda a, b: ref.info_nce(ref.dense(a, b), float(s), masked=False),
                    argnums=(0, 1))(z1_64, z2_64)
    through = _dense_total_gradient(z1_64, z2_64)
  chex.assert_trees_all_close(unbound, held, atol=1e-5, rtol=1e-4)
  through, held = ([np.asarray(g) for g in grads] for grads in (through, held))  # float64
  difference = max(float(np.max(np.abs(t - h))) for t, h in zip(through, held, strict=True))
  assert difference > 1e-2 * max(float(np.max(np.abs(h))) for h in held)


def test_bind_logit_scale_and_calls_on_cosines():
  cos = jnp.asarray([[-0.5, 0.0, 0.5], [0.1, 0.2, 0.3]])
  free = mappings.temperature_free()(cos)
  for build in (mappings.calibrated_free, mappings.accuracy_free):
    m = build()
    assert mappings.logit_scale(m) is None and m.params == {}
    bound = m.bind(scale=2.5)
    assert bound.spec == m.spec and float(mappings.logit_scale(bound)) == 2.5
    np.testing.assert_allclose(bound(cos), 2.5 * free, rtol=1e-6)
    with pytest.raises(ValueError, match=r"m.bind\(scale=s\)"):
      m(cos)
    with pytest.raises(ValueError, match="must be a scalar"):
      m.bind(scale=jnp.ones(3))
    with pytest.raises(ValueError, match="finite and > 0"):
      m.bind(scale=0.0)
  per_anchor = mappings.perplexity_free().bind(scale=jnp.asarray([1.0, 3.0]))
  np.testing.assert_allclose(per_anchor(cos), jnp.asarray([[1.0], [3.0]]) * free, rtol=1e-6)
  with pytest.raises(ValueError, match="a 1-D array"):
    mappings.perplexity_free().bind(scale=2.0)
  with pytest.raises(ValueError, match="M = 2 anchors"):
    per_anchor(cos[0])
  with pytest.raises(ValueError, match="has none"):
    mappings.temperature_free().bind(scale=2.0)
  with pytest.raises(ValueError, match="has none"):
    mappings.temperature(0.1).bind(scale=2.0)
  # A bound scale is the parameter the losses check under check_finite.
  traced = jax.jit(lambda s: [check.valid for check in
                              mappings.calibrated_free().bind(scale=s).parameter_checks()])
  assert [bool(v) for v in traced(-1.0)] == [False]


def test_the_loss_refuses_what_it_cannot_compute():
  z1, z2 = _views(0, 0.5)
  perplexity = mappings.perplexity_free()
  with pytest.raises(ValueError, match="implementation='xla'"):
    losses.info_nce(z1, z2, mapping=perplexity, implementation="pallas")
  with pytest.raises(ValueError, match=r"shape \(24,\)"):
    losses.info_nce(z1, z2, mapping=perplexity.bind(scale=jnp.ones(N)), symmetric=True)
  with pytest.raises(ValueError, match="relative_bias"):
    losses.sigmoid_loss(z1, z2, mapping=perplexity, relative_bias=0.1)
  with pytest.raises(ValueError, match="batch-scaled"):
    losses.batch_scale(z1, z2, mapping=mappings.temperature_free())
  with pytest.raises(ValueError, match="one per row of z"):
    losses.supervised_batch_scale(z1, jnp.arange(N) % 3, mapping=perplexity.bind(
        scale=jnp.ones(3)))
  for analyse in (analysis.optimum_probability, lambda m: analysis.gradient_scale(m, 0.5, 4),
                  lambda m: sigmoid.sigmoid_gradient_scale(m, 0.5, 4)):
    with pytest.raises(ValueError, match=r"bind\(scale=s\)"):
      analyse(mappings.calibrated_free())


def test_a_bound_scale_in_the_analysis_is_eq13_with_that_scale():
  """Bound, a batch-scaled mapping is `s 2 artanh(c)`: its gradient scale on the pattern is the
  scaled Eq. 13, `4 s / (1 - C^2) (N - 1) r^{2s} / (1 + (N - 1) r^{2s})`."""
  C, n, s = np.array([0.1, 0.5, 0.9]), 6, 2.5
  r = (1 - C) / (1 + C)
  want = 4 * s / (1 - C**2) * (n - 1) * r ** (2 * s) / (1 + (n - 1) * r ** (2 * s))
  got = analysis.gradient_scale(mappings.accuracy_free().bind(scale=s), jnp.asarray(C), n)
  np.testing.assert_allclose(got, want, rtol=1e-5)
