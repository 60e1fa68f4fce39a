"""The scaled free mappings (`learnable_free`, `n_aware_free`): values and closed forms against
NumPy, free at the start / at N = 2, gradient scales against the closed forms (Eq. 10 and 13 with a
scale), InfoNCE against a dense NumPy reference, the Pallas kernels against the XLA engine,
specs and their errors, finite values and gradients at cos = +-1."""

from __future__ import annotations

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.marks import widest, widest_cases
from tfcl_jax import analysis, losses, mappings

COS = np.array([-0.999, -0.7, -0.2, 0.0, 0.1, 0.5, 0.9, 0.999])
NS = (2, 3, 16, 511)


def _scale(n):
  """s(N) = 1 + log(N - 1) / log 9, written out here."""
  return 1.0 + np.log(n - 1) / np.log(9.0)


def _scaled_free_np(cos, scale):
  cos = np.asarray(cos, np.float64)
  return scale * np.log((1.0 + cos) / (1.0 - cos))


def test_free_scale_matches_its_definition_and_the_pre_registered_values():
  for n in NS + (8192,):
    assert mappings.free_scale(n) == pytest.approx(_scale(n), rel=1e-15)
  assert mappings.free_scale(2) == 1.0
  # (N - 1) 3^(-2 s) = 3^(-2): N - 1 negatives at C = 1/2 leave the positive free's probability.
  for n in NS:
    assert (n - 1) * 3.0 ** (-2 * mappings.free_scale(n)) == pytest.approx(1 / 9, rel=1e-12)
  assert round(mappings.free_scale(511), 1) == 3.8
  assert round(mappings.free_scale(8192), 1) == 5.1


@pytest.mark.parametrize("n", NS)
def test_n_aware_free_values_match_numpy(n):
  with jax.enable_x64(True):
    got = mappings.n_aware_free(num_candidates=n)(jnp.asarray(COS))
  np.testing.assert_allclose(got, _scaled_free_np(COS, _scale(n)), rtol=1e-13)


@pytest.mark.parametrize("t, max_scale", [(0.0, None), (0.7, None), (-1.2, None), (3.0, 10.0)])
def test_learnable_free_values_match_numpy(t, max_scale):
  with jax.enable_x64(True):
    m = mappings.learnable_free(max_scale=max_scale).bind(params={"t": jnp.float64(t)})
    got = m(jnp.asarray(COS))
    logit_scale = float(mappings.logit_scale(m))
  scale = math.exp(t) if max_scale is None else min(math.exp(t), max_scale)
  np.testing.assert_allclose(got, _scaled_free_np(COS, scale), rtol=1e-13)
  assert logit_scale == pytest.approx(scale, rel=1e-12)


@pytest.mark.parametrize("n", (3, 16, 511, 1500))
def test_exp_form_is_the_closed_form_power_of_the_odds(n):
  """((1 + c)/(1 - c))^s exp(-shift) and its derivative 2 s (1 + c)^(s-1) / (1 - c)^(s+1)."""
  s = _scale(n)
  m = mappings.n_aware_free(num_candidates=n)
  for dtype, rtol in ((jnp.float32, 2e-5), (jnp.float64, 1e-12)):
    with jax.enable_x64(dtype == jnp.float64):
      form = m.exp_form(jnp.dtype(dtype))
      assert form is not None
      cos = COS[1:-1]  # inside the clamp
      weight = np.exp(-form.shift) * ((1 + cos) / (1 - cos)) ** s
      grad = np.exp(-form.shift) * 2 * s * (1 + cos) ** (s - 1) / (1 - cos) ** (s + 1)
      np.testing.assert_allclose(form.weight(jnp.asarray(cos, dtype)), weight, rtol=rtol)
      np.testing.assert_allclose(form.weight_grad(jnp.asarray(cos, dtype)), grad, rtol=rtol)
  # s max_free_logit(float32) = 3.84 * 15.25 nats: no shift needed; 4.33 * 15.25 > 60: one.
  assert mappings.n_aware_free(num_candidates=511).exp_form(jnp.dtype(jnp.float32)).shift == 0.0
  assert mappings.n_aware_free(num_candidates=1500).exp_form(jnp.dtype(jnp.float32)).shift > 0.0


def test_exp_form_is_absent_where_one_shift_cannot_hold_the_logits():
  m = mappings.n_aware_free(num_candidates=8192)  # s = 5.1: logits span 156 nats in float32
  assert m.exp_form(jnp.dtype(jnp.float32)) is None
  with jax.enable_x64(True):
    assert m.exp_form(jnp.dtype(jnp.float64)) is not None
  # Learnable mappings take their gradient through the mapping, as learnable_temperature does.
  assert mappings.learnable_free().exp_form(jnp.dtype(jnp.float32)) is None
  assert mappings.learnable_free().log_sigmoid_form(jnp.dtype(jnp.float32)) is None


@pytest.mark.parametrize("n", (3, 511))
def test_log_sigmoid_form_matches_numpy(n):
  """-log sigmoid(y s 2 artanh c) = -log((1 + y c)^s / ((1 + y c)^s + (1 - y c)^s))."""
  s = _scale(n)
  form = mappings.n_aware_free(num_candidates=n).log_sigmoid_form(jnp.dtype(jnp.float64))
  cos = COS[1:-1]
  with jax.enable_x64(True):
    for sign in (1.0, -1.0):
      a, b = (1 + sign * cos) ** s, (1 - sign * cos) ** s
      term = -np.log(a / (a + b))
      # d/dc of log(a + b) - log(a) = -y 2 s / (1 - c^2) * b / (a + b)
      grad = -sign * 2 * s / (1 - cos**2) * b / (a + b)
      signs = jnp.full(cos.shape, sign)
      np.testing.assert_allclose(form.term(jnp.asarray(cos), signs), term, rtol=1e-10)
      np.testing.assert_allclose(form.term_grad(jnp.asarray(cos), signs), grad, rtol=1e-10)


def test_at_the_start_and_at_two_candidates_they_are_free_exactly():
  cos = jnp.asarray(COS, jnp.float32)
  free = mappings.temperature_free()
  np.testing.assert_array_equal(mappings.learnable_free()(cos), free(cos))
  np.testing.assert_array_equal(mappings.learnable_free(max_scale=100.0)(cos), free(cos))
  np.testing.assert_array_equal(mappings.n_aware_free(num_candidates=2)(cos), free(cos))
  z1 = jax.random.normal(jax.random.key(0), (12, 8))
  z2 = z1 + 0.5 * jax.random.normal(jax.random.key(1), (12, 8))
  for negatives in ("cross", "all"):
    free_loss = losses.info_nce(z1, z2, negatives=negatives)
    # N = 2 sums free's own closed form; the learnable mapping takes the running maximum instead.
    n_aware = mappings.n_aware_free(num_candidates=2)
    np.testing.assert_array_equal(losses.info_nce(z1, z2, mapping=n_aware, negatives=negatives),
                                  free_loss)
    at_start = mappings.learnable_free()
    np.testing.assert_allclose(
        losses.info_nce(z1, z2, mapping=at_start.bind(params=at_start.params),
                        negatives=negatives),
        free_loss, rtol=1e-6)


def _grad_scale_c(C, n, s):
  r = (1 - C) / (1 + C)
  return s * (n - 1) * (4 / (1 - C**2)) * r ** (2 * s) / (1 + (n - 1) * r ** (2 * s))


def _grad_scale_t(C, n, s):
  r = (1 - C) / (1 + C)
  return 4 * s * np.arctanh(C) * (n - 1) * r ** (2 * s) / (1 + (n - 1) * r ** (2 * s))


def _pattern_loss_np(C, n, s):
  """-log softmax of s 2 artanh([C, -C, ..., -C]) at 0, from the logits (Eq. 12 with s)."""
  logits = _scaled_free_np(np.array([C] + [-C] * (n - 1)), s)
  return np.log1p(np.sum(np.exp(logits[1:] - logits[0])))


CS = np.linspace(0.0, 0.99, 12)


@pytest.mark.parametrize("n", widest(2, 4, 16, 511, quick=(2, 4, 16)))
def test_n_aware_gradient_scale_matches_its_closed_form(n):
  """Eq. 13 with a scale: |dL/dC| = s (N-1) 4/(1-C^2) r^2s / (1 + (N-1) r^2s)."""
  s = _scale(n)
  # The closed form is the derivative of the pattern's loss (checked by finite differences).
  h = 1e-6
  for C in (0.1, 0.5, 0.9):
    fd = (_pattern_loss_np(C + h, n, s) - _pattern_loss_np(C - h, n, s)) / (2 * h)
    assert abs(fd) == pytest.approx(_grad_scale_c(C, n, s), rel=1e-6)
  with jax.enable_x64(True):
    got = analysis.gradient_scale(mappings.n_aware_free(num_candidates=n), jnp.asarray(CS), n)
  np.testing.assert_allclose(got, _grad_scale_c(CS, n, s), rtol=1e-9)


@pytest.mark.parametrize("t", (0.0, 1.0, -0.5))
def test_learnable_free_gradient_scales_match_their_closed_forms(t):
  """|dL/dC| as n_aware's with s = exp(t); |dL/dt| = 4 s artanh(C) (N-1) r^2s / (1 + ...)."""
  s, n = math.exp(t), 7
  h = 1e-6
  for C in (0.1, 0.5, 0.9):
    fd = (_pattern_loss_np(C, n, math.exp(t + h)) - _pattern_loss_np(C, n, math.exp(t - h))) / (
        2 * h)
    assert abs(fd) == pytest.approx(_grad_scale_t(C, n, s), rel=1e-6)
  with jax.enable_x64(True):
    m = mappings.learnable_free().bind(params={"t": jnp.float64(t)})
    np.testing.assert_allclose(analysis.gradient_scale(m, jnp.asarray(CS), n),
                               _grad_scale_c(CS, n, s), rtol=1e-9)
    z_pattern = jax.vmap(lambda c: analysis.pattern.pattern_embeddings(
        analysis.pattern.paper_pattern(c, n)))

    def row0(t_value, z1, z2):
      bound = m.bind(params={"t": t_value})
      return losses.info_nce(z1, z2, mapping=bound, reduction="none")[0]

    z1, z2 = z_pattern(jnp.asarray(CS))
    got = jax.jit(jax.vmap(jax.grad(row0), (None, 0, 0)))(jnp.float64(t), z1, z2)
  np.testing.assert_allclose(np.abs(got), _grad_scale_t(CS, n, s), rtol=1e-9, atol=1e-15)
  assert float(got[0]) == 0.0  # C = 0: no gradient on t, as Eq. 10


def _info_nce_np(z1, z2, f, negatives):
  """Dense InfoNCE in float64: -f(c_i,i+) + log sum_{j in K_i} exp(f(c_ij)), mean over rows."""
  z1 = np.asarray(z1, np.float64)
  z2 = np.asarray(z2, np.float64)
  z1 /= np.linalg.norm(z1, axis=1, keepdims=True)
  z2 /= np.linalg.norm(z2, axis=1, keepdims=True)
  n = len(z1)
  if negatives == "cross":
    logits = f(np.clip(z1 @ z2.T, -1 + 1e-12, 1 - 1e-12))
    positive = np.arange(n)
  else:
    u = np.concatenate([z1, z2])
    logits = f(np.clip(u @ u.T, -1 + 1e-12, 1 - 1e-12))
    np.fill_diagonal(logits, -np.inf)
    positive = (np.arange(2 * n) + n) % (2 * n)
  top = logits.max(axis=1, keepdims=True)
  lse = top[:, 0] + np.log(np.sum(np.exp(logits - top), axis=1))
  return np.mean(lse - logits[np.arange(len(logits)), positive])


@pytest.mark.parametrize("negatives", ("cross", "all"))
@pytest.mark.parametrize("name", ("n_aware", "learnable_free"))
def test_info_nce_matches_a_dense_numpy_reference(name, negatives):
  rows, dim = 9, 6
  z1 = jax.random.normal(jax.random.key(2), (rows, dim))
  z2 = z1 + 0.7 * jax.random.normal(jax.random.key(3), (rows, dim))
  n = losses.num_candidates(rows, negatives=negatives)
  if name == "n_aware":
    m, s = mappings.n_aware_free(num_candidates=n), _scale(n)
  else:
    m, s = mappings.learnable_free().bind(params={"t": jnp.float32(0.4)}), math.exp(0.4)
  got = losses.info_nce(z1, z2, mapping=m, negatives=negatives)
  want = _info_nce_np(z1, z2, lambda c: _scaled_free_np(c, s), negatives)
  np.testing.assert_allclose(got, want, rtol=2e-5)
  # The loss spec `free_n` fills in the candidate count.
  if name == "n_aware":
    spec = losses.from_spec("free_n", num_candidates=n)
    np.testing.assert_allclose(spec(z1, z2, negatives=negatives), want, rtol=2e-5)


def test_losses_fill_in_free_n_from_their_own_candidates():
  """`mapping="free_n"` scales by the loss's candidates per anchor, counted here by hand:
  cross 9, all 17, cross with a bank of 4 extra negatives 13; the supervised loss 8 (every
  other row); the sigmoid loss 9 (its columns)."""
  rows, dim = 9, 6
  z1 = jax.random.normal(jax.random.key(12), (rows, dim))
  z2 = z1 + 0.7 * jax.random.normal(jax.random.key(13), (rows, dim))
  for negatives, n in (("cross", 9), ("all", 17)):
    want = _info_nce_np(z1, z2, lambda c, n=n: _scaled_free_np(c, _scale(n)), negatives)
    np.testing.assert_allclose(losses.info_nce(z1, z2, mapping="free_n", negatives=negatives),
                               want, rtol=2e-5)
  bank = jax.random.normal(jax.random.key(14), (4, dim))
  np.testing.assert_allclose(
      losses.info_nce(z1, z2, mapping="free_n", extra_negatives=bank),
      losses.info_nce(z1, z2, mapping=mappings.n_aware_free(num_candidates=13),
                      extra_negatives=bank), rtol=1e-6)
  labels = jnp.array([0, 0, 1, 1, 2, 2, 3, 3, 3])
  for form in ("ntxent", "supcon"):
    np.testing.assert_allclose(
        losses.supervised_info_nce(z1, labels, mapping="free_n", form=form),
        losses.supervised_info_nce(z1, labels, form=form,
                                   mapping=mappings.n_aware_free(num_candidates=8)), rtol=1e-6)
  np.testing.assert_allclose(
      losses.sigmoid_loss(z1, z2, mapping="free_n"),
      losses.sigmoid_loss(z1, z2, mapping=mappings.n_aware_free(num_candidates=9)), rtol=1e-6)
  # The count is positional, not the free_n of another batch size.
  assert not np.isclose(losses.info_nce(z1, z2, mapping="free_n"),
                        losses.info_nce(z1, z2, mapping="free_n=17"))


@pytest.mark.parametrize("n", (1999, 8192))
def test_info_nce_with_a_shifted_or_no_closed_form_matches_numpy(n):
  """s(1999) = 4.46: the closed form sums under a shift of 8 nats in float32; s(8192) = 5.1:
  no closed form, the running maximum."""
  z1 = jax.random.normal(jax.random.key(6), (9, 6))
  z2 = z1 + 0.2 * jax.random.normal(jax.random.key(7), (9, 6))
  m = mappings.n_aware_free(num_candidates=n)
  assert (m.exp_form(jnp.dtype(jnp.float32)) is None) == (n == 8192)
  for negatives in ("cross", "all"):
    got = losses.info_nce(z1, z2, mapping=m, negatives=negatives)
    want = _info_nce_np(z1, z2, lambda c: _scaled_free_np(c, _scale(n)), negatives)
    np.testing.assert_allclose(got, want, rtol=2e-5)


def test_n_aware_free_takes_the_closed_form_in_the_engine(monkeypatch):
  """The tiled engine sums exp_form's weights (no mapping call) for free_n: the mapping's fn is
  never traced inside the tiles, and the result matches the running-maximum path."""
  from tfcl_jax.losses._engine import _tiles  # noqa: PLC0415

  m = mappings.n_aware_free(num_candidates=16)
  z1 = jax.random.normal(jax.random.key(4), (16, 8))
  z2 = z1 + 0.5 * jax.random.normal(jax.random.key(5), (16, 8))
  calls = []
  original = _tiles._logits
  monkeypatch.setattr(_tiles, "_logits", lambda *a: calls.append(1) or original(*a))
  fast = jax.value_and_grad(lambda a: losses.info_nce(a, z2, mapping=m, block_size=8))(z1)
  assert not calls
  plain = mappings.as_mapping(lambda c: m(c))  # the same mapping with no closed form
  slow = jax.value_and_grad(lambda a: losses.info_nce(a, z2, mapping=plain, block_size=8))(z1)
  assert calls
  chex.assert_trees_all_close(fast, slow, rtol=2e-5, atol=1e-6)


N, D = 37, 70  # as tests/losses/kernels/test_pallas.py: ragged blocks of 16, two chunks of D


def _pallas_views():
  z1 = jax.random.normal(jax.random.key(0), (N, D))
  z2 = z1 + 0.8 * jax.random.normal(jax.random.key(1), (N, D))
  return z1, z2, (jnp.arange(N) % 5) != 2


PALLAS_MAPS = {
    "free_n": mappings.n_aware_free(num_candidates=2 * N - 1),
    "free_n_shifted": mappings.n_aware_free(num_candidates=1999),  # exp_form with a shift
    "free_n_no_closed_form": mappings.n_aware_free(num_candidates=8192),
    "learnable_free": mappings.learnable_free().bind(params={"t": jnp.float32(0.3)}),
    "learnable_free_capped": mappings.learnable_free(max_scale=2.0).bind(
        params={"t": jnp.float32(1.0)}),
}
PALLAS_MODES = {
    "all-masked": dict(negatives="all", masked=True),
    "symmetric": dict(negatives="cross", symmetric=True),
}


# Each mapping in one mode, alternating (the mapping is code inside the tile;
# tests/losses/kernels/test_pallas.py runs every mode), and free_n and learnable_free in both.
PALLAS_CASES = [(name, list(PALLAS_MODES)[k % 2]) for k, name in enumerate(PALLAS_MAPS)] + [
    ("free_n", "symmetric"), ("learnable_free", "all-masked")]


@pytest.mark.parametrize("name, mode", widest_cases(*PALLAS_CASES, quick=[
    ("free_n", "all-masked"), ("learnable_free", "symmetric")]))
def test_pallas_equals_xla_values_and_gradients(name, mode):
  z1, z2, where = _pallas_views()
  kwargs = dict(PALLAS_MODES[mode])
  if kwargs.pop("masked", False):
    kwargs["where"] = where

  def loss(a, b, mapping, implementation):
    return losses.info_nce(a, b, mapping=mapping, block_size=16, implementation=implementation,
                           **kwargs)

  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)), static_argnums=3)
  expected, got = (grad(z1, z2, PALLAS_MAPS[name], implementation)
                   for implementation in ("xla", "pallas"))
  chex.assert_trees_all_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_kernel_form_of_eq11_matches_numpy_and_stays_out_of_the_xla_path():
  # The fused kernels trace Eq. 11 as log((1 + c) / (1 - c)) with its derivative in closed form
  # (`Mapping.kernel_form`); against float64 NumPy: 2 artanh(c) and 2 / (1 - c^2), and 0 beyond
  # free's clamp from its bounds outwards.
  margin = 8 * float(jnp.finfo(jnp.float32).epsneg)
  cos = np.concatenate([COS, [-1.0, 1.0, -1.0 + 2 * margin, 1.0 - 2 * margin, 1e-4, -3e-6]])
  cos = cos.astype(np.float32).astype(np.float64)  # the inputs as the kernels hold them
  mapping = mappings.learnable_free().bind(params={"t": jnp.float32(math.log(3.0))})
  kernel_form = mapping.kernel_form()

  def logits(c):
    return kernel_form(c)

  value = np.asarray(jax.jit(logits)(jnp.asarray(cos, jnp.float32)), np.float64)
  slope = np.asarray(jax.jit(jax.vmap(jax.grad(logits)))(jnp.asarray(cos, jnp.float32)),
                     np.float64)
  clamped = np.clip(cos, -1.0 + margin, 1.0 - margin)
  np.testing.assert_allclose(value, _scaled_free_np(clamped, 3.0), rtol=2e-6, atol=1e-6)
  inside = np.abs(cos) < 1.0 - margin
  np.testing.assert_allclose(slope[inside], 3.0 * 2.0 / (1.0 - cos[inside] ** 2), rtol=2e-6)
  np.testing.assert_array_equal(slope[~inside], 0.0)
  # The kernels trace the custom derivative; the XLA path (the mapping itself) keeps log1p.
  c = jnp.zeros((4,), jnp.float32)
  kernel = str(jax.make_jaxpr(lambda c: kernel_form(c))(c))
  xla = str(jax.make_jaxpr(lambda c: mapping(c))(c))
  assert "custom_jvp_call" in kernel and "log1p" not in kernel
  assert "log1p" in xla and "custom_jvp_call" not in xla


def test_specs_parse_build_and_round_trip():
  assert losses.canonical_spec(" free_n ") == "free_n"
  assert losses.canonical_spec("clip:free_n") == "clip:free_n"
  assert losses.canonical_spec("sigmoid/free_n/learn_b=prior") == "sigmoid/free_n/learn_b=prior"
  assert losses.canonical_spec("learnable_free=100.0") == "learnable_free=100"
  assert losses.canonical_spec("learnable_free") == "learnable_free"
  assert losses.canonical_spec("free_n=0511") == "free_n=511"
  loss = losses.from_spec("free_n", num_candidates=511)
  assert (loss.spec, type(loss), loss.mapping.spec, loss.params) == (
      "free_n", losses.InfoNCELoss, "free_n=511", {})
  assert float(mappings.logit_scale(loss.mapping)) == pytest.approx(_scale(511))
  clip = losses.from_spec("clip:free_n", num_candidates=64)
  assert clip.symmetric and clip.mapping.spec == "free_n=64"
  for text in ("learnable_free", "learnable_free=100", "free_n=511"):
    m = mappings.from_spec(text)
    assert m.spec == text and mappings.from_spec(m.spec).spec == text
    assert losses.from_spec(text).spec == text
  learnable = losses.from_spec("learnable_free=100")
  assert set(learnable.params) == {"t"} and float(learnable.params["t"]) == 0.0
  assert learnable.mapping.fn.max_scale == 100.0
  assert mappings.learnable_free(max_scale=100).spec == "learnable_free=100"
  assert mappings.learnable_free().spec == "learnable_free"
  assert mappings.n_aware_free(num_candidates=511).spec == "free_n=511"
  # The mapping spec `free_n=N` is the same mapping as the loss's `free_n` with num_candidates=N.
  cos = jnp.asarray(COS, jnp.float32)
  np.testing.assert_array_equal(mappings.from_spec("free_n=511")(cos), loss.mapping(cos))


def test_spec_and_argument_errors():
  with pytest.raises(ValueError, match="num_candidates"):
    losses.from_spec("free_n")
  with pytest.raises(ValueError, match="num_candidates"):
    losses.from_spec("sigmoid/free_n")
  with pytest.raises(ValueError, match=r"n_aware_free\(num_candidates=N\)"):
    mappings.from_spec("free_n")
  with pytest.raises(ValueError, match=r"mapping='free_n'"):
    mappings.as_mapping("free_n")
  with pytest.raises(ValueError, match="num_candidates"):
    mappings.as_mapping("free_n", num_candidates=1)
  with pytest.raises(ValueError, match="Accepted forms"):
    mappings.as_mapping("free_m", num_candidates=9)
  with pytest.raises(ValueError, match="num_candidates"):
    mappings.from_spec("free_n=1")
  with pytest.raises(ValueError, match="max_scale"):
    mappings.from_spec("learnable_free=0")
  with pytest.raises(ValueError, match="Accepted forms"):
    losses.canonical_spec("learnable_free=1:2")
  with pytest.raises(ValueError, match="Accepted forms"):
    losses.canonical_spec("free_n=2.5")
  with pytest.raises(ValueError, match="num_candidates"):
    mappings.n_aware_free(num_candidates=1)
  with pytest.raises(TypeError, match="num_candidates"):
    mappings.n_aware_free(num_candidates=3.0)
  with pytest.raises(TypeError):
    mappings.n_aware_free(511)  # keyword-only  # pyright: ignore[reportCallIssue]
  with pytest.raises(ValueError, match="max_scale"):
    mappings.learnable_free(max_scale=-1.0)
  with pytest.raises(ValueError, match="keys"):
    mappings.learnable_free().bind(params={"tau": 1.0})


def test_a_non_finite_t_is_caught_by_check_finite():
  m = mappings.learnable_free().bind(params={"t": jnp.float32(jnp.nan)})
  assert [(c.name, c.requirement, bool(c.valid)) for c in m.parameter_checks()] == [
      ("t", "finite", False)]
  assert mappings.n_aware_free(num_candidates=5).parameter_checks() == ()
  z = jax.random.normal(jax.random.key(0), (4, 8))
  with pytest.raises(ValueError, match="t must be finite"):
    losses.info_nce(z, z, mapping=m, check_finite=True)


@pytest.mark.parametrize("dtype", widest(jnp.float32, jnp.bfloat16, quick=(jnp.float32,)),
                         ids=("float32", "bfloat16"))
@pytest.mark.parametrize("name", ("free_n", "free_n_no_closed_form", "learnable_free_capped"))
def test_finite_values_and_gradients_at_cos_plus_minus_one(name, dtype):
  m = PALLAS_MAPS[name]
  edges = jnp.asarray([-1.0, -1.0 + 1e-8, 0.0, 1.0 - 1e-8, 1.0], dtype)
  chex.assert_tree_all_finite(m(edges))
  chex.assert_tree_all_finite(jax.vmap(jax.grad(lambda c: m(c)))(edges))
  chex.assert_tree_all_finite(jax.grad(lambda m: jnp.sum(m(edges)))(m))
  # Identical and opposite views: every cosine at +-1, through the losses' closed forms.
  z = jax.random.normal(jax.random.key(0), (6, 8)).astype(dtype)

  @jax.jit
  def values_and_grads(a, b, m):  # every loss in one program
    return [jax.value_and_grad(lambda a, b, m, loss=loss: loss(a, b, mapping=m),
                               argnums=(0, 1, 2))(a, b, m) for loss in (
        functools.partial(losses.info_nce, negatives="cross"),
        functools.partial(losses.info_nce, negatives="all"), losses.sigmoid_loss)]

  for other in (z, -z):
    chex.assert_tree_all_finite(values_and_grads(z, other, m))


@pytest.mark.parametrize("n", widest(2, 511, quick=(2,)))
def test_analysis_closed_forms_match_numpy_and_autodiff(n):
  with jax.enable_x64(True):
    for s in (1.0, _scale(n), 0.6):
      got = analysis.scaled_free_gradient_scale(jnp.asarray(CS), n, s)
      np.testing.assert_allclose(got, _grad_scale_c(CS, n, s), rtol=1e-12)
      bound = mappings.learnable_free().bind(params={"t": jnp.float64(math.log(s))})
      np.testing.assert_allclose(got, analysis.gradient_scale(bound, jnp.asarray(CS), n),
                                 rtol=1e-9)
    np.testing.assert_allclose(
        analysis.scaled_free_gradient_scale(jnp.asarray(CS), n, 1.0), analysis.eq13(CS, n),
        rtol=1e-12)  # s = 1 is Eq. 13
    np.testing.assert_allclose(
        analysis.scaled_free_gradient_scale(jnp.asarray(CS), n, _scale(n)),
        analysis.gradient_scale(mappings.n_aware_free(num_candidates=n), jnp.asarray(CS), n),
        rtol=1e-9)
    m = mappings.learnable_free()

    def row0(t_value, c):
      z1, z2 = analysis.pattern.pattern_embeddings(analysis.pattern.paper_pattern(c, n))
      return losses.info_nce(z1, z2, mapping=m.bind(params={"t": t_value}),
                             reduction="none")[0]

    autodiff = jax.jit(jax.vmap(jax.grad(row0), (None, 0)))  # one program for every t
    for t in (-0.5, 0.0, 1.0):
      got = analysis.learnable_free_t_gradient_scale(jnp.asarray(CS), n, t)
      np.testing.assert_allclose(got, _grad_scale_t(CS, n, math.exp(t)), rtol=1e-12)
      np.testing.assert_allclose(got, np.abs(autodiff(jnp.float64(t), jnp.asarray(CS))),
                                 rtol=1e-9, atol=1e-15)
  with pytest.raises(ValueError, match="s must be finite and > 0"):
    analysis.scaled_free_gradient_scale(0.5, n, 0.0)
  with pytest.raises(ValueError, match="C must lie in"):
    analysis.learnable_free_t_gradient_scale(1.0, n, 0.0)
