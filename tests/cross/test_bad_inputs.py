"""Bad inputs that once gave a wrong answer in silence or an obscure error: each now gives the
right answer or a `ValueError` that names the argument and the fix.

The list of what stays silent on purpose (NaN in, NaN out; rows below the norm floor) is in
docs/losses.md, "Bad inputs". Each case here checks against something independent of the losses:
a float64 NumPy transcription, a closed form of a schedule, the invariance of a cosine to scale.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfcl_jax import losses, mappings, schedules


def _views(n=8, d=6, seed=0):
  z1 = jax.random.normal(jax.random.key(seed), (n, d))
  return z1, z1 + 0.3 * jax.random.normal(jax.random.key(seed + 1), (n, d))


def _mesh():
  return jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])


LABELS = jnp.arange(8) % 3

# Every public loss that takes a mapping, as `f(z1, z2, mapping)`.
LOSSES = {
    "info_nce cross": lambda z1, z2, m: losses.info_nce(z1, z2, mapping=m),
    "info_nce all": lambda z1, z2, m: losses.info_nce(z1, z2, mapping=m, negatives="all"),
    "clip": lambda z1, z2, m: losses.info_nce(z1, z2, mapping=m, symmetric=True),
    "info_nce pallas": lambda z1, z2, m: losses.info_nce(z1, z2, mapping=m,
                                                         implementation="pallas"),
    "sigmoid": lambda z1, z2, m: losses.sigmoid_loss(z1, z2, mapping=m),
    "supervised": lambda z1, z2, m: losses.supervised_info_nce(z1, LABELS, mapping=m),
    "info_nce_on_mesh": lambda z1, z2, m: losses.info_nce_on_mesh(z1, z2, mesh=_mesh(),
                                                                  mapping=m),
    "sigmoid_loss_on_mesh": lambda z1, z2, m: losses.sigmoid_loss_on_mesh(z1, z2, mesh=_mesh(),
                                                                          mapping=m),
}
LEARNABLE = ("learnable=0.07:100", "learnable_free=100")


# -- 1. a built learnable mapping passed unbound ----------------------------------------------


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("spec", LEARNABLE)
def test_an_unbound_learnable_mapping_is_refused_with_the_fix(loss, spec):
  z1, z2 = _views()
  m = mappings.from_spec(spec)
  with pytest.raises(ValueError, match=r"has trainable params \['t'\] but was passed unbound") \
      as error:
    LOSSES[loss](z1, z2, m)
  assert "m.bind(params=params['loss'])" in str(error.value)
  assert "m.bind(params=m.params)" in str(error.value)   # how to hold t fixed on purpose
  # Both fixes the message names run (the sharded losses run bound learnable mappings in
  # tests/losses/test_family.py: compiling them here again would double their cost).
  if not loss.endswith("_on_mesh"):
    bound = m.bind(params=m.params)
    assert np.isfinite(jax.jit(lambda a, b: LOSSES[loss](a, b, bound))(z1, z2))


def test_the_unbound_mapping_would_never_have_trained():
  # What the refusal prevents: inside the loss function, the unbound mapping's t is a constant
  # of the trace, so the gradient on the train state's t is exactly 0 whatever the loss; bound,
  # the gradient is the loss's derivative in t (checked against a central difference).
  z1, z2 = _views()
  m = mappings.from_spec("learnable_free=100")

  def bound_loss(params):
    return losses.info_nce(z1, z2, mapping=m.bind(params=params))

  params = {"t": jnp.asarray(0.3)}
  grad = jax.grad(bound_loss)(params)["t"]
  eps = 1e-3
  central = (bound_loss({"t": params["t"] + eps})
             - bound_loss({"t": params["t"] - eps})) / (2 * eps)
  np.testing.assert_allclose(grad, central, rtol=1e-2)
  assert abs(float(grad)) > 1e-3

  def unbound_loss(params):
    del params  # the trap: the loss reads m's own t, not the train state's
    return losses.info_nce(z1, z2, mapping=m)

  with pytest.raises(ValueError, match="passed unbound"):
    jax.grad(unbound_loss)(params)
  # A mapping differentiated as an argument trains: tests/cross/test_unbound_mappings.py.


# -- 2. annealed mappings without a step ------------------------------------------------------


def _numpy_info_nce(z1, z2, tau):
  u1, u2 = (np.asarray(z, np.float64) for z in (z1, z2))
  u1 = u1 / np.linalg.norm(u1, axis=1, keepdims=True)
  u2 = u2 / np.linalg.norm(u2, axis=1, keepdims=True)
  logits = u1 @ u2.T / tau
  top = logits.max(axis=1, keepdims=True)
  lse = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
  return float(np.mean(lse - np.diag(logits)))


@pytest.mark.parametrize("loss", list(LOSSES))
def test_an_annealed_spec_string_is_refused_naming_bind_step(loss):
  z1, z2 = _views()
  with pytest.raises(ValueError, match=r"cannot carry the training step") as error:
    LOSSES[loss](z1, z2, "anneal=log:0.5")
  assert "m.bind(step=step)" in str(error.value)
  m = mappings.from_spec("anneal=log:0.5")
  with pytest.raises(ValueError, match=r"passed without a step"):
    LOSSES[loss](z1, z2, m)
  bound = m.bind(step=7)
  assert np.isfinite(jax.jit(lambda a, b: LOSSES[loss](a, b, bound))(z1, z2))


@pytest.mark.parametrize("step", [0, 10, 1000])
def test_a_bound_step_anneals_as_its_schedule_says(step):
  # anneal=log:T0 is tau = T0 / log(step + 2): the loss at a bound step is InfoNCE at that tau.
  z1, z2 = _views()
  m = mappings.from_spec("anneal=log:0.5")
  tau = 0.5 / math.log(step + 2)
  np.testing.assert_allclose(losses.info_nce(z1, z2, mapping=m.bind(step=step)),
                             _numpy_info_nce(z1, z2, tau), rtol=1e-5)
  # The loss spec takes the step when called, and refuses to run without one.
  loss = losses.from_spec("anneal=log:0.5")
  np.testing.assert_allclose(loss(z1, z2, step=step), _numpy_info_nce(z1, z2, tau), rtol=1e-5)
  with pytest.raises(ValueError, match="passed without a step"):
    loss(z1, z2)


# -- 3. rows of extreme norm -------------------------------------------------------------------


def _unit64(z):
  z = np.asarray(jnp.asarray(z, jnp.float32), np.float64)
  return z / np.linalg.norm(z, axis=1, keepdims=True)


def _lse(logits):
  top = logits.max(axis=1, keepdims=True)
  return np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]


def _free(cos):
  return np.log1p(cos) - np.log1p(-cos)


def _numpy_loss(kind, z1, z2):
  """Float64 references under the free mapping: InfoNCE (cross, CLIP, all), the sigmoid loss,
  the supervised NT-Xent with LABELS."""
  u1, u2 = _unit64(z1), _unit64(z2)
  if kind in ("cross", "clip"):
    logits = _free(np.clip(u1 @ u2.T, -1 + 1e-12, 1 - 1e-12))
    rows = _lse(logits) - np.diag(logits)
    if kind == "cross":
      return rows.mean()
    return 0.5 * rows.mean() + 0.5 * (_lse(logits.T) - np.diag(logits)).mean()
  if kind == "all":
    u = np.concatenate([u1, u2])
    n = len(u1)
    logits = _free(np.clip(u @ u.T, -1 + 1e-12, 1 - 1e-12))
    np.fill_diagonal(logits, -np.inf)
    positive = logits[np.arange(2 * n), (np.arange(2 * n) + n) % (2 * n)]
    return (_lse(logits) - positive).mean()
  if kind == "sigmoid":
    logits = _free(np.clip(u1 @ u2.T, -1 + 1e-12, 1 - 1e-12))
    labels = 2.0 * np.eye(len(logits)) - 1.0
    return np.mean(np.sum(np.logaddexp(0.0, -labels * logits), axis=1))
  if kind == "supervised":
    labels = np.asarray(LABELS)
    logits = _free(np.clip(u1 @ u1.T, -1 + 1e-12, 1 - 1e-12))
    np.fill_diagonal(logits, -np.inf)
    same = (labels[:, None] == labels[None, :]) & ~np.eye(len(labels), dtype=bool)
    out = []
    for i in range(len(labels)):   # NT-Xent form: each positive against the anchor's negatives
      negatives = logits[i][~same[i] & (np.arange(len(labels)) != i)]
      for j in np.flatnonzero(same[i]):
        out.append(np.logaddexp.reduce(np.concatenate([[logits[i, j]], negatives]))
                   - logits[i, j])
    return float(np.mean(out))
  raise ValueError(kind)


NORM_LOSSES = {
    "cross": lambda a, b, **kw: losses.info_nce(a, b, **kw),
    "clip": lambda a, b, **kw: losses.info_nce(a, b, symmetric=True, **kw),
    "all": lambda a, b, **kw: losses.info_nce(a, b, negatives="all", **kw),
    "sigmoid": lambda a, b, **kw: losses.sigmoid_loss(a, b, **kw),
    "supervised": lambda a, b, **kw: losses.supervised_info_nce(a, LABELS, **kw),
}
SCALES = tuple(10.0 ** k for k in range(-12, 16, 3))  # 1e-12 ... 1e15


def _check_scales(fn, kind, dtype, *, scales=SCALES, rtol=1e-5):
  z1, z2 = _views(d=16)
  jitted = jax.jit(fn)
  for scale in scales:
    a = (z1 * scale).astype(dtype)
    b = (z2 * scale).astype(dtype)
    got = float(jitted(a, b))
    np.testing.assert_allclose(got, _numpy_loss(kind, a, b), rtol=rtol, atol=1e-6,
                               err_msg=f"{kind} {dtype} at scale {scale:g}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", list(NORM_LOSSES))
def test_every_input_scale_gives_the_float64_loss(kind, dtype):
  # A cosine does not depend on the norm: from 1e-12 to 1e15 (float32 squares overflow beyond
  # ~1e19 and fall below its normal range under ~1e-19) the loss is the float64 one of the same
  # inputs. bfloat16 holds every one of these scales.
  _check_scales(NORM_LOSSES[kind], kind, jnp.dtype(dtype))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["cross", "clip", "all"])
def test_the_fused_kernels_take_every_input_scale(kind, dtype):
  # The Pallas kernels (interpreted here) take bfloat16 inputs as raw rows scaled by a power of
  # two: their products neither overflow nor underflow.
  fn = NORM_LOSSES[kind]
  _check_scales(lambda a, b: fn(a, b, implementation="pallas"), kind, jnp.dtype(dtype),
                scales=(1e-12, 1e-6, 1.0, 1e6, 1e15))


@pytest.mark.parametrize("loss", ["info_nce_on_mesh", "sigmoid_loss_on_mesh"])
def test_the_sharded_losses_take_every_input_scale(loss):
  kind = "cross" if loss == "info_nce_on_mesh" else "sigmoid"
  fn = LOSSES[loss]
  _check_scales(lambda a, b: fn(a, b, "free"), kind, jnp.float32,
                scales=(1e-12, 1e-6, 1.0, 1e6, 1e15))


@pytest.mark.parametrize("scale", [1e-12, 1e15])
def test_the_gradient_scales_as_the_norm(scale):
  # L(s z) = L(z) for every s > 0, hence s grad L(s z) = grad L(z).
  z1, z2 = _views(d=16)
  grad = jax.jit(jax.grad(lambda a, b: losses.info_nce(a, b, negatives="all"), argnums=(0, 1)))
  at_one = grad(z1, z2)
  scaled = grad(z1 * scale, z2 * scale)
  for g1, gs in zip(at_one, scaled, strict=True):
    np.testing.assert_allclose(np.asarray(gs) * scale, g1, rtol=1e-4, atol=1e-6)


def test_below_the_floor_a_row_is_divided_by_it():
  # The documented zero-row behaviour: a row of norm below losses.norm_floor is z / floor, so
  # a zero row has cosine 0 with every row; its gradient is finite (1 / floor).
  floor = losses.norm_floor("float32")
  z = jnp.array([[3.0, 4.0], [0.0, 0.0], [3e-14, 4e-14]])
  np.testing.assert_allclose(losses.l2_normalize(z),
                             [[0.6, 0.8], [0.0, 0.0], [3e-14 / floor, 4e-14 / floor]], rtol=1e-6)
  z1, z2 = _views()
  z1 = z1.at[0].set(0.0)
  loss = losses.info_nce(z1, z2)
  u1, u2 = _unit64(z1[1:]), _unit64(z2)
  cos = np.concatenate([np.zeros((1, 8)), u1 @ u2.T])
  logits = _free(cos)
  np.testing.assert_allclose(loss, np.mean(_lse(logits) - np.diag(logits)), rtol=1e-5)
  grad = jax.grad(losses.info_nce)(z1, z2)
  assert np.all(np.isfinite(grad))


# -- 4. a non-scalar t bound to a learnable mapping -------------------------------------------


@pytest.mark.parametrize("spec", LEARNABLE)
def test_a_non_scalar_t_is_refused_where_it_is_bound(spec):
  m = mappings.from_spec(spec)
  with pytest.raises(ValueError, match=rf"params\['t'\] of mapping '{m.spec}' must have "
                                       r"shape \(\) .* got shape \(3,\)"):
    m.bind(params={"t": jnp.zeros(3)})
  # Through a loss spec, which binds the train state's params.
  z1, z2 = _views()
  with pytest.raises(ValueError, match=r"params\['t'\] .* got shape \(3,\)"):
    losses.from_spec(spec)(z1, z2, params={"t": jnp.zeros(3)})
  # Under vmap each example's t is a scalar: several scales train side by side.
  batched = jax.vmap(lambda t: losses.info_nce(z1, z2, mapping=m.bind(params={"t": t})))(
      jnp.zeros(3))
  np.testing.assert_allclose(batched, batched[0], rtol=1e-6)


# -- 5. clamps and no-ops: a named error, or documented on purpose -----------------------------


def _numpy_sigmoid(z1, z2, logit):
  """SigLIP's loss, float64, with `logit(cos)` the pairs' logits."""
  logits = logit(_unit64(z1) @ _unit64(z2).T)
  labels = 2.0 * np.eye(len(logits)) - 1.0
  return np.mean(np.sum(np.logaddexp(0.0, -labels * logits), axis=1))


@pytest.mark.parametrize("r", [2.0, -1.5, 1.0 + 1e-3])
def test_a_relative_bias_outside_the_cosines_is_refused(r):
  # It was clamped in silence: relative_bias=2.0 gave the loss of 1.0 under the free mapping.
  z1, z2 = _views()
  for loss in (losses.sigmoid_loss,
               lambda a, b, **kw: losses.sigmoid_loss_on_mesh(a, b, mesh=_mesh(), **kw)):
    with pytest.raises(ValueError, match=r"relative_bias r is the cosine .* \[-1, 1\], got"):
      loss(z1, z2, relative_bias=r)
    with pytest.raises(ValueError, match=r"relative_bias r is the cosine"):
      loss(z1, z2, relative_bias=jnp.asarray(r), mapping="tau=0.5")


@pytest.mark.parametrize("r", [-1.0, 0.3, 1.0])
def test_a_relative_bias_is_the_cosine_at_which_a_logit_is_zero(r):
  z1, z2 = _views()
  np.testing.assert_allclose(losses.sigmoid_loss(z1, z2, relative_bias=r, mapping="tau=0.25"),
                             _numpy_sigmoid(z1, z2, lambda c: (c - r) / 0.25), rtol=1e-5)
  margin = 8 * float(np.finfo(np.float32).epsneg)   # free's own clamp, 8 float32 ulps
  clip = np.clip(r, -1 + margin, 1 - margin)
  np.testing.assert_allclose(losses.sigmoid_loss(z1, z2, relative_bias=r),
                             _numpy_sigmoid(z1, z2, lambda c: _free(c) - _free(clip)), rtol=1e-4)


def test_a_step_is_an_integer_not_below_zero():
  # Once a negative step was clamped to 0 and a float step accepted, in silence.
  m = mappings.from_spec("anneal=log:0.5")
  for step in (-1, jnp.int32(-3)):
    with pytest.raises(ValueError, match=r"step of mapping 'anneal=log:0.5' must be >= 0"):
      m.bind(step=step)
    with pytest.raises(ValueError, match=r"must be >= 0"):
      m(0.5, step=step)
  for step in (2.5, jnp.float32(2.0), True):
    with pytest.raises(TypeError, match=r"step of mapping 'anneal=log:0.5' must be an integer"):
      m.bind(step=step)
  with pytest.raises(TypeError, match=r"must be an integer"):   # traced: its dtype is known
    jax.jit(lambda s: m.bind(step=s)(0.5))(1.5)
  z1, z2 = _views()
  with pytest.raises(ValueError, match=r"must be >= 0"):
    losses.from_spec("anneal=log:0.5")(z1, z2, step=-1)
  np.testing.assert_allclose(m.bind(step=jnp.int32(3))(0.5), 0.5 / (0.5 / math.log(5)),
                             rtol=1e-6)


def test_a_mapping_without_a_schedule_ignores_its_step_on_purpose():
  # Documented (Mapping.bind): a train step binds every loss's mapping to its step alike.
  z1, z2 = _views()
  m = mappings.temperature(0.5)
  assert not m.scheduled
  np.testing.assert_array_equal(losses.info_nce(z1, z2, mapping=m.bind(step=7)),
                                losses.info_nce(z1, z2, mapping=m))
  loss = losses.from_spec("tau=0.5")
  np.testing.assert_array_equal(loss(z1, z2, step=7), loss(z1, z2))
  np.testing.assert_allclose(loss(z1, z2), _numpy_info_nce(z1, z2, 0.5), rtol=1e-5)


def test_the_supervised_ntxent_form_refuses_labels_without_a_negative():
  # With one label every pair's loss is -log(1) = 0: it returned 0.0, while labels without a
  # positive were refused. SupCon's form is defined there: the float64 loss of its formula.
  z1, _ = _views()
  one_label = jnp.zeros((8,), jnp.int32)
  with pytest.raises(ValueError, match=r"two different labels for form='ntxent'"):
    losses.supervised_info_nce(z1, one_label)
  logits = _free(np.clip(_unit64(z1) @ _unit64(z1).T, -1 + 1e-12, 1 - 1e-12))
  others = ~np.eye(8, dtype=bool)
  rows = [np.logaddexp.reduce(logits[i][others[i]]) - logits[i][others[i]].mean()
          for i in range(8)]
  np.testing.assert_allclose(losses.supervised_info_nce(z1, one_label, form="supcon"),
                             np.mean(rows), rtol=1e-5)


# -- 6. errors that say what to do ------------------------------------------------------------


@pytest.mark.parametrize("constructor, call", [
    (mappings.temperature, "mappings.temperature(tau)"),
    (mappings.temperature_free, "mappings.temperature_free()"),
    (mappings.from_spec, "mappings.from_spec(text)"),
    (mappings.learnable_free, "mappings.learnable_free()"),
    (mappings.n_aware_free, "mappings.n_aware_free(num_candidates=...)"),
])
@pytest.mark.parametrize("loss", ["info_nce cross", "sigmoid", "supervised"])
def test_an_uncalled_constructor_is_named_with_the_call(loss, constructor, call):
  z1, z2 = _views()
  with pytest.raises(TypeError, match=rf"did you mean {re.escape(call)}\?"):
    LOSSES[loss](z1, z2, constructor)


def test_a_schedule_passed_as_a_mapping_is_named():
  z1, z2 = _views()
  with pytest.raises(TypeError, match=r"schedules.cosine is a temperature schedule.*"
                                      r"annealed_temperature"):
    losses.info_nce(z1, z2, mapping=schedules.cosine)


def test_the_schedules_take_positional_arguments_as_optax_does():
  # The closed forms of each schedule, positional and by keyword.
  assert float(schedules.logarithmic(0.5)(3)) == pytest.approx(0.5 / math.log(5), rel=1e-6)
  assert float(schedules.logarithmic(0.5, 0.3)(10**6)) == pytest.approx(0.3)
  assert float(schedules.linear(1.0, 0.1, 10)(5)) == pytest.approx(0.55, rel=1e-6)
  assert float(schedules.exponential(1.0, 0.01, 10)(5)) == pytest.approx(0.1, rel=1e-5)
  assert float(schedules.cosine(0.5, 0.1, 100)(50)) == pytest.approx(0.3, rel=1e-6)
  keyword = schedules.cosine(tau_start=0.5, tau_end=0.1, steps=100)
  assert float(keyword(25)) == float(schedules.cosine(0.5, 0.1, 100)(25))
