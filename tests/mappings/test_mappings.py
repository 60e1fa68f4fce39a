"""Mappings and schedules against NumPy formulas, edge cases in every float dtype, spec parsing."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from tfcl_jax import mappings, schedules

DTYPES = (jnp.float64, jnp.float32, jnp.bfloat16, jnp.float16)


class TemperatureTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_divides_by_tau(self):
    cos = np.linspace(-1.0, 1.0, 11, dtype=np.float32)
    out = self.variant(lambda c: mappings.temperature(0.25)(c))(cos)
    np.testing.assert_allclose(out, cos / 0.25, rtol=1e-6)

  @parameterized.parameters(0.0, -0.1, float("nan"), float("inf"))
  def test_bad_tau_raises(self, tau):
    with pytest.raises(ValueError, match="tau"):
      mappings.temperature(tau)

  def test_bool_tau_raises(self):
    with pytest.raises(TypeError, match="tau"):
      mappings.temperature(True)

  def test_traced_tau_gets_gradient(self):
    # d(c / tau)/d tau = -c / tau^2
    grad = jax.jit(jax.grad(lambda tau: mappings.temperature(tau)(0.5)))(0.25)
    np.testing.assert_allclose(grad, -0.5 / 0.25**2, rtol=1e-6)


class TemperatureFreeTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_equals_twice_artanh_float64(self):
    with jax.enable_x64(True):
      cos = np.linspace(-0.999999, 0.999999, 2001)
      out = self.variant(mappings.temperature_free())(cos)
      assert out.dtype == jnp.float64
      np.testing.assert_allclose(out, 2 * np.arctanh(cos), rtol=1e-12, atol=1e-14)
      np.testing.assert_allclose(out, np.log((1 + cos) / (1 - cos)), rtol=1e-9, atol=1e-12)

  def test_gradient_is_two_over_one_minus_c_squared(self):
    with jax.enable_x64(True):
      cos = np.linspace(-0.99, 0.99, 199)
      grad = jax.vmap(jax.grad(lambda c: mappings.temperature_free()(c)))(cos)
      np.testing.assert_allclose(grad, 2 / (1 - cos**2), rtol=1e-12)

  @parameterized.parameters(*DTYPES)
  def test_finite_values_and_gradients_on_closed_interval(self, dtype):
    with jax.enable_x64(True):
      cos = jnp.array([-1.0, -0.999, -0.5, 0.0, 0.5, 0.999, 1.0], dtype)
      free = mappings.temperature_free()
      chex.assert_tree_all_finite(free(cos))
      chex.assert_tree_all_finite(jax.vmap(jax.grad(lambda c: free(c).astype(jnp.float32)))(cos))

  @parameterized.parameters(*DTYPES)
  def test_saturates_at_documented_bound_not_at_clamp_0_9999(self, dtype):
    with jax.enable_x64(True):
      free = mappings.temperature_free()
      top = float(free(jnp.asarray(1.0, dtype)))
      bottom = float(free(jnp.asarray(-1.0, dtype)))
      assert top == pytest.approx(mappings.max_free_logit(dtype), rel=1e-6)
      assert bottom == -top
      # A 0.9999 clamp caps logits at log(1.9999 / 0.0001) = 9.9: the tau = 0.1 bound.
      assert top > math.log(1.9999 / 0.0001) + 5

  def test_documented_bounds(self):
    assert mappings.max_free_logit("float64") == pytest.approx(35.35, abs=0.01)
    assert mappings.max_free_logit("float32") == pytest.approx(15.25, abs=0.01)
    assert mappings.max_free_logit("bfloat16") == mappings.max_free_logit("float32")

  def test_odd_and_monotone(self):
    half = np.linspace(0.0, 1.0, 2001, dtype=np.float32)
    cos = np.concatenate([-half[::-1], half[1:]])
    out = np.asarray(mappings.temperature_free()(cos))
    np.testing.assert_allclose(out, -out[::-1], atol=1e-6)
    assert np.all(np.diff(out) > 0)

  def test_rejects_integer_input(self):
    with pytest.raises(TypeError, match="cos"):
      mappings.temperature_free()(jnp.array([0, 1]))


class LearnableTemperatureTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_value_and_gradient_in_t(self):
    # Eq. 8: logits = exp(t) cos, so d logits / dt = exp(t) cos.
    def logit(t, c):
      return mappings.learnable_temperature(t=t)(c)

    t, c = 1.3, 0.4
    np.testing.assert_allclose(self.variant(logit)(t, c), math.exp(t) * c, rtol=1e-6)
    np.testing.assert_allclose(self.variant(jax.grad(logit))(t, c), math.exp(t) * c, rtol=1e-6)

  def test_params_override(self):
    mapping = mappings.learnable_temperature(t=0.0)
    assert float(mapping(0.5, params={"t": jnp.log(4.0)})) == pytest.approx(2.0)
    assert set(mapping.params) == {"t"} and mapping.learnable

  def test_bad_t_tau_and_positional_use(self):
    with pytest.raises(ValueError, match="t must"):
      mappings.learnable_temperature(t=float("nan"))
    with pytest.raises(ValueError, match="tau"):
      mappings.learnable_temperature(tau=0.0)
    with pytest.raises(ValueError, match="not both"):
      mappings.learnable_temperature(tau=0.1, t=1.0)
    with pytest.raises(TypeError):
      mappings.learnable_temperature(0.07)  # positional: ambiguous between tau and t

  def test_tau_keyword_is_the_spec_and_the_initial_temperature(self):
    by_keyword = mappings.learnable_temperature(tau=0.07)
    by_spec = mappings.from_spec("learnable=0.07")
    assert by_keyword.spec == by_spec.spec == "learnable=0.07"
    np.testing.assert_allclose(by_keyword(1.0), 1 / 0.07, rtol=1e-6)  # logit 1/tau at cos = 1
    np.testing.assert_allclose(by_spec(1.0), 1 / 0.07, rtol=1e-6)
    assert mappings.learnable_temperature().spec == "learnable=0.07"

  def test_clip_cap_spec(self):
    capped = mappings.from_spec("learnable=0.07:100")
    assert capped.spec == "learnable=0.07:100"
    assert capped.spec == mappings.learnable_temperature(tau=0.07, max_scale=100).spec
    np.testing.assert_allclose(capped(0.5), 0.5 / 0.07, rtol=1e-6)
    # Below temperature 1/100 the scale stops at the cap, and t gets no gradient there.
    grad = jax.grad(lambda t: capped.bind(params={"t": t})(0.5))(jnp.log(1 / 0.005))
    np.testing.assert_allclose(mappings.from_spec("learnable=0.005:100")(0.5), 50.0, rtol=1e-6)
    assert float(grad) == 0.0
    with pytest.raises(ValueError, match="max_scale"):
      mappings.from_spec("learnable=0.07:0")

  def test_max_scale_clamps_the_logit_scale(self):
    capped = mappings.learnable_temperature(tau=1e-3, max_scale=100.0)
    np.testing.assert_allclose(capped(0.5), 50.0, rtol=1e-6)
    # Past the cap the scale is constant: no gradient reaches t (open_clip's clamp).
    grad = jax.grad(lambda t: capped(0.5, params={"t": t}))(capped.params["t"])
    assert float(grad) == 0.0


class DynamicTemperatureTest(parameterized.TestCase):

  @parameterized.parameters((np.float64, 1e-14), (np.float32, 2e-6))
  def test_tau_formula_and_stop_gradient(self, dtype, rtol):
    # The mapping's Taylor series for tau against the cosine formula, on a fine grid of [-1, 1]
    # and a few ulps past +-1 (where a normalised vector's self-similarity can land).
    eps = np.finfo(dtype).eps
    s = np.concatenate([np.linspace(-1, 1, 4001), [-1 - 4 * eps, 1 + 4 * eps]]).astype(dtype)
    tau = 0.1 + 0.5 * (0.3 - 0.1) * (1 + np.cos(np.pi * (1 + s.astype(np.float64))))
    with jax.enable_x64(dtype == np.float64):
      mapping = mappings.dynamic_temperature(0.1, 0.3)
      np.testing.assert_allclose(mapping(s), s / tau, rtol=rtol)
      # tau(s) is detached, so the gradient of s / tau(s) is 1 / tau(s).
      grad = jax.vmap(jax.grad(lambda x: mapping(x)))(jnp.asarray(s))
      np.testing.assert_allclose(grad, 1 / tau, rtol=rtol)

  def test_bad_range(self):
    with pytest.raises(ValueError, match="tau_max"):
      mappings.dynamic_temperature(0.3, 0.1)
    with pytest.raises(ValueError, match="tau_min"):
      mappings.dynamic_temperature(0.0, 0.1)


class ScheduleTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_against_numpy(self):
    steps = np.array([0, 1, 10, 50, 100, 200])
    frac = np.minimum(steps / 100, 1.0)
    expected = {
        "log": np.maximum(0.5 / np.log(steps + 2.0), 1e-3),
        "linear": 1.0 + (0.1 - 1.0) * frac,
        "exp": 1.0 * (0.1 / 1.0) ** frac,
        "cosine": 0.1 + 0.5 * (1.0 - 0.1) * (1 + np.cos(np.pi * frac)),
    }
    built = {
        "log": schedules.logarithmic(tau0=0.5),
        "linear": schedules.linear(tau_start=1.0, tau_end=0.1, steps=100),
        "exp": schedules.exponential(tau_start=1.0, tau_end=0.1, steps=100),
        "cosine": schedules.cosine(tau_start=1.0, tau_end=0.1, steps=100),
    }
    for name, schedule in built.items():
      got = self.variant(jax.vmap(schedule))(steps)
      np.testing.assert_allclose(got, expected[name], rtol=1e-5, err_msg=name)

  def test_temperature_of_schedule_inside_jit(self):
    schedule = schedules.linear(tau_start=1.0, tau_end=0.5, steps=10)
    out = jax.jit(lambda step: mappings.temperature(schedule(step))(0.5))(10)
    assert float(out) == pytest.approx(1.0)

  def test_bad_arguments(self):
    with pytest.raises(ValueError, match="steps"):
      schedules.linear(tau_start=1.0, tau_end=0.1, steps=0)
    with pytest.raises(ValueError, match="tau_end"):
      schedules.cosine(tau_start=1.0, tau_end=-0.1, steps=10)
    with pytest.raises(ValueError, match="tau0"):
      schedules.logarithmic(tau0=0.0)


class FromSpecTest(chex.TestCase):

  @parameterized.parameters(
      ("tau=0.25", 0.5, 2.0),
      ("free", 0.5, math.log(3.0)),
      ("learnable", 0.5, 0.5 / 0.07),
      ("learnable=0.2", 0.5, 2.5),
      ("dynamic=0.1:0.2", 0.0, 0.0),
      ("anneal=log:0.5", 0.5, 0.5 * math.log(2.0) / 0.5),
      ("anneal=linear:1:0.5:10", 0.5, 0.5),
      ("anneal=exp:1:0.5:10", 0.5, 0.5),
      ("anneal=cosine:1:0.5:10", 0.5, 0.5),
  )
  def test_forms(self, spec, cos, expected):
    mapping = mappings.from_spec(spec)
    assert float(mapping(cos)) == pytest.approx(expected, rel=1e-5)
    assert mappings.from_spec(mapping.spec).spec == mapping.spec

  def test_schedule_reads_step(self):
    mapping = mappings.from_spec("anneal=linear:1:0.5:10")
    assert mapping.scheduled
    assert float(mapping(0.5, step=10)) == pytest.approx(1.0)

  @parameterized.parameters(
      "", "tau", "tau=", "tau=abc", "tau=0", "tau=-1", "temperature=0.1", "dynamic=0.1",
      "dynamic=0.2:0.1", "anneal=foo:1", "anneal=linear:1:0.1", "learnable=0", "free=1")
  def test_bad_specs_list_accepted_forms(self, spec):
    with pytest.raises(ValueError, match="Accepted forms") as error:
      mappings.from_spec(spec)
    assert repr(spec) in str(error.value)

  def test_non_string(self):
    with pytest.raises(TypeError, match="spec"):
      mappings.from_spec(0.1)


def test_bind_fixes_params_and_step_and_keeps_the_spec():
  annealed = mappings.from_spec("anneal=cosine:0.5:0.1:100")
  cos = jnp.linspace(-0.9, 0.9, 7)
  bound = annealed.bind(step=37)
  assert bound.spec == annealed.spec
  np.testing.assert_allclose(bound(cos), annealed(cos, step=37), rtol=1e-6)
  assert not np.allclose(bound(cos), annealed(cos))  # step 0 differs
  learnable = mappings.learnable_temperature(t=0.0).bind(params={"t": jnp.log(4.0)})
  np.testing.assert_allclose(learnable(cos), 4.0 * cos, rtol=1e-6)  # exp(t) cos, Eq. 8
  assert learnable.bind(step=2).params["t"] == learnable.params["t"]


def test_bind_rejects_params_with_other_keys():
  with pytest.raises(ValueError, match="params must have the keys"):
    mappings.learnable_temperature(t=0.0).bind(params={"tau": 1.0})
  with pytest.raises(ValueError, match="params must have the keys"):
    mappings.temperature_free().bind(params={"t": 1.0})


def test_mappings_are_pytrees_whose_leaves_are_the_learnable_scalars():
  learnable = mappings.learnable_temperature(tau=0.5).bind(step=3)
  leaves, treedef = jax.tree.flatten(learnable)
  assert len(leaves) == 2  # t and the bound step
  rebuilt = jax.tree.unflatten(treedef, leaves)
  assert rebuilt.spec == learnable.spec and float(rebuilt(0.5)) == float(learnable(0.5))
  assert jax.tree.leaves(mappings.temperature(0.5)) == []
  # Built-in mappings of equal hyperparameters have equal static parts: jit compiles once.
  assert (jax.tree.structure(mappings.temperature(0.5))
          == jax.tree.structure(mappings.from_spec("tau=0.5")))
  traced = jax.jit(lambda m, c: m(c))
  traced(mappings.from_spec("free"), 0.5)
  traced(mappings.temperature_free(), 0.25)
  assert traced._cache_size() == 1
  # Several values of t: bound one at a time under vmap (bind checks that t is a scalar).
  scaled = jax.vmap(lambda t: mappings.learnable_temperature().bind(params={"t": t})(0.5))(
      jnp.log(jnp.array([1.0, 2.0, 4.0])))
  np.testing.assert_allclose(scaled, [0.5, 1.0, 2.0], rtol=1e-6)


def test_logit_scale_is_the_factor_of_temperature_maps_cap_included():
  assert float(mappings.logit_scale(mappings.temperature(0.25))) == pytest.approx(4.0)
  learnable = mappings.learnable_temperature(tau=0.07)
  assert float(mappings.logit_scale(learnable)) == pytest.approx(1 / 0.07, rel=1e-6)
  # At other params (a train state's), and past CLIP's cap of 100.
  capped = mappings.from_spec("learnable=0.07:100")
  assert float(mappings.logit_scale(capped, params={"t": jnp.log(50.0)})) == pytest.approx(50.0)
  assert float(mappings.logit_scale(capped, params={"t": jnp.log(400.0)})) == 100.0
  # The scale is what the mapping multiplies a cosine by.
  assert float(capped(0.5, params={"t": jnp.log(400.0)})) == pytest.approx(50.0)


@pytest.mark.parametrize("spec, cap", [
    ("learnable=0.07:100", 100.0), ("learnable_free=30", 30.0), ("learnable=0.07", None),
    ("learnable_free", None), ("tau=0.1", None), ("free", None), ("dynamic=0.1:0.2", None)])
def test_max_logit_scale_is_the_cap_the_scale_stops_at(spec, cap):
  mapping = mappings.from_spec(spec)
  assert mappings.max_logit_scale(mapping) == cap
  if cap is not None:  # the scale at a huge t is the cap, and no more
    assert float(mappings.logit_scale(mapping, params={"t": jnp.asarray(20.0)})) == cap


def test_max_logit_scale_refuses_what_is_no_mapping():
  with pytest.raises(TypeError, match="mapping must be a Mapping"):
    mappings.max_logit_scale("learnable=0.07:100")  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", ["free", "dynamic=0.1:0.2", "anneal=log:0.5"])
def test_logit_scale_is_refused_for_maps_without_one(spec):
  with pytest.raises(TypeError, match="logit scale"):
    mappings.logit_scale(mappings.from_spec(spec))


def test_as_mapping_reads_spec_strings():
  assert mappings.as_mapping("learnable=0.07:100").spec == "learnable=0.07:100"
  assert float(mappings.as_mapping(" tau=0.5 ")(0.25)) == pytest.approx(0.5)


class MappingFunctionContractTest(parameterized.TestCase):
  """A mapping's optional forms are declared (`MappingFunction`), not looked up by name."""

  def test_a_plain_function_is_wrapped_and_declares_nothing(self):
    m = mappings.Mapping("double", lambda cos, params, step: 2.0 * cos)
    assert isinstance(m.fn, mappings.MappingFunction)
    assert m.exp_form(jnp.float32) is None and m.log_sigmoid_form(jnp.float32) is None
    assert m.parameter_checks() == ()
    np.testing.assert_allclose(m(jnp.asarray([0.25, -0.5])), [0.5, -1.0])
    with pytest.raises(TypeError, match="logit scale"):
      mappings.logit_scale(m)

  def test_a_map_function_must_be_callable(self):
    class NoCall(mappings.MappingFunction):
      pass

    with pytest.raises(TypeError, match="abstract"):
      NoCall()
    with pytest.raises(TypeError, match="fn must be a MappingFunction or a callable"):
      mappings.Mapping("three", 3)

  def test_what_a_user_map_declares_reaches_the_library(self):
    # 3 cos with its closed form exp(3c - 3) and scale 3: the loss through the declared form
    # equals the NumPy loss, and logit_scale reads the declaration.
    class Triple(mappings.MappingFunction):
      def __call__(self, cos, params, step):
        return 3.0 * cos

      def exp_form(self, dtype):
        weight = lambda cos: jnp.exp(3.0 * cos - 3.0)  # noqa: E731
        return mappings.ExpForm(3.0, weight, lambda cos: 3.0 * weight(cos))

      def logit_scale(self, params):
        return jnp.asarray(3.0)

    from tfcl_jax import losses  # noqa: PLC0415

    m = mappings.Mapping("triple", Triple())
    assert m.exp_form(jnp.float32).shift == 3.0 and float(mappings.logit_scale(m)) == 3.0
    z1 = np.random.default_rng(0).normal(size=(6, 4))
    z2 = z1 + 0.5 * np.random.default_rng(1).normal(size=(6, 4))
    u1 = z1 / np.linalg.norm(z1, axis=1, keepdims=True)
    u2 = z2 / np.linalg.norm(z2, axis=1, keepdims=True)
    logits = 3.0 * u1 @ u2.T
    expected = np.mean(np.log(np.exp(logits).sum(1)) - np.diag(logits))
    np.testing.assert_allclose(losses.info_nce(z1.astype(np.float32), z2.astype(np.float32),
                                               mapping=m), expected, rtol=1e-5)
