"""Input checks of the losses: an empty feature axis (D = 0), and the mapping's parameters under
`check_finite` (a traced tau <= 0, a non-finite learnable t, schedule or bias), against
NumPy references of the losses written here."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from jax.experimental import checkify
from jax.sharding import PartitionSpec as P

from tfcl_jax import losses, mappings

LABELS = jnp.array([0, 0, 1, 1, 2, 2, 3, 3])


def _views(n=8, d=4):
  z1 = jax.random.normal(jax.random.key(0), (n, d))
  return z1, z1 + 0.3 * jax.random.normal(jax.random.key(1), (n, d))


def _unit(z):
  z = np.asarray(z, np.float64)
  return z / np.linalg.norm(z, axis=1, keepdims=True)


def numpy_info_nce(z1, z2, tau):
  """`negatives="cross"`, one direction: mean of `logsumexp_j(c_ij / tau) - c_ii / tau`."""
  logits = _unit(z1) @ _unit(z2).T / tau
  top = logits.max(axis=1, keepdims=True)
  lse = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
  return np.mean(lse - np.diag(logits))


def numpy_sigmoid_loss(z1, z2, tau, bias=0.0):
  """`negatives="cross"`: mean over anchors of `sum_j -log sigmoid(l_ij (c_ij / tau + b))`."""
  logits = _unit(z1) @ _unit(z2).T / tau + bias
  labels = 2.0 * np.eye(len(logits)) - 1.0
  return np.mean(np.sum(np.logaddexp(0.0, -labels * logits), axis=1))


def _mesh():
  return jax.make_mesh((jax.device_count(),), ("data",))


def _sharded(loss):
  def call(z1, z2, **kw):
    mesh = jax.sharding.Mesh(jax.devices(), ("data",))
    fn = jax.shard_map(lambda a, b: loss(a, b, **kw), mesh=mesh, in_specs=(P("data"),) * 2,
                       out_specs=P())
    return fn(z1, z2)
  return call


# Every public loss that takes embeddings: `f(z1, z2, **kw)`, or `f(z, **kw)` (supervised).
PAIR_LOSSES = {
    "info_nce": losses.info_nce,
    "info_nce_all": lambda a, b, **kw: losses.info_nce(a, b, negatives="all", **kw),
    "info_nce_symmetric": lambda a, b, **kw: losses.info_nce(a, b, symmetric=True, **kw),
    "sigmoid_loss": losses.sigmoid_loss,
    "sigmoid_loss_biased": lambda a, b, **kw: losses.sigmoid_loss(a, b, bias=-1.0, **kw),
    "loss_spec": lambda a, b, **kw: losses.from_spec("sigmoid/free/learn_b=-1")(
        a, b, params={"bias": -1.0}, **kw),
}
MESH_LOSSES = {
    "sharded_info_nce": _sharded(losses.sharded_info_nce),
    "sharded_sigmoid_loss": _sharded(losses.sharded_sigmoid_loss),
    "info_nce_on_mesh": lambda a, b, **kw: losses.info_nce_on_mesh(a, b, mesh=_mesh(), **kw),
    "sigmoid_loss_on_mesh": lambda a, b, **kw: losses.sigmoid_loss_on_mesh(a, b, mesh=_mesh(),
                                                                           **kw),
}
SUPERVISED = {
    "supervised_ntxent": lambda z, **kw: losses.supervised_info_nce(z, LABELS, **kw),
    "supervised_supcon": lambda z, **kw: losses.supervised_info_nce(z, LABELS, form="supcon",
                                                                    **kw),
}


def _one_view(loss):
  return lambda z1, z2, **kw: loss(z1, **kw)


# The losses with `check_finite` and a `mapping` argument, as `f(z1, z2, **kw)`.
CHECKED = {**{name: fn for name, fn in PAIR_LOSSES.items() if name != "loss_spec"},
           **{name: _one_view(fn) for name, fn in SUPERVISED.items()}}


# -- D = 0: an empty feature axis --------------------------------------------------------------


class EmptyFeaturesTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(*((name, name) for name in sorted({**PAIR_LOSSES,
                                                                     **MESH_LOSSES})))
  def test_pair_losses_name_D_and_the_view(self, name):
    loss = {**PAIR_LOSSES, **MESH_LOSSES}[name]
    empty = jnp.zeros((8, 0))
    z1, _ = _views()
    # Inside shard_map a sharded loss sees (and names) its device's share, [8 / devices, 0].
    with pytest.raises(ValueError, match=r"^z1 must have D >= 1 features \(shape \[N, D\]\), "
                                         r"got shape \(\d+, 0\)\."):
      self.variant(loss)(empty, empty)
    # z1 is fine: the empty z2 is named, before the two shapes are compared.
    with pytest.raises(ValueError, match=r"^z2 must have D >= 1 features .* got shape \(\d+, 0\)"):
      self.variant(loss)(z1, empty)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(*((name, name) for name in sorted(SUPERVISED)))
  def test_supervised_loss_names_D_and_z(self, name):
    with pytest.raises(ValueError, match=r"^z must have D >= 1 features \(shape \[B, D\]\), "
                                         r"got shape \(8, 0\)\."):
      self.variant(SUPERVISED[name])(jnp.zeros((8, 0)))

  def test_empty_float16_views_name_D_not_the_engine(self):
    # Any float dtype: the check comes before the compute dtype and the tiles.
    with pytest.raises(ValueError, match="D >= 1"):
      losses.info_nce(jnp.zeros((3, 0), jnp.float16), jnp.zeros((3, 0), jnp.float16),
                      block_size=2)

  def test_one_feature_is_enough(self):
    # D = 1: every cosine is +-1; all-equal rows give log N (every candidate equally likely).
    ones = jnp.ones((8, 1))
    chex.assert_trees_all_close(losses.info_nce(ones, ones, mapping="tau=0.5"), np.log(8.0),
                                rtol=1e-6)


# -- the mapping's parameters under `check_finite=True` -------------------------------------------


def _checked(loss, mapping_of):
  """`checkify(jit(tau -> loss(z1, z2, mapping=mapping_of(tau), check_finite="checkify")))`."""
  z1, z2 = _views()
  return checkify.checkify(jax.jit(
      lambda value: loss(z1, z2, mapping=mapping_of(value), check_finite="checkify")))


class TracedTemperatureTest(parameterized.TestCase):

  @parameterized.product(name=sorted(CHECKED), tau=[0.0, -1.0])
  def test_traced_tau_at_most_zero_fails_naming_tau(self, name, tau):
    error, _ = _checked(CHECKED[name], mappings.temperature)(tau)
    assert error.get() is not None
    assert error.get().startswith(
        f"tau must be finite and > 0 (check_finite), got {tau} (mapping 'tau=<traced>')")
    with pytest.raises(checkify.JaxRuntimeError, match=r"^tau must be finite and > 0"):
      error.throw()

  @parameterized.parameters(float("nan"), float("inf"))
  def test_traced_non_finite_tau_fails(self, tau):
    error, _ = _checked(losses.info_nce, mappings.temperature)(tau)
    assert error.get().startswith(f"tau must be finite and > 0 (check_finite), got {tau}")

  @parameterized.parameters(*sorted(CHECKED))
  def test_valid_traced_tau_passes_and_equals_the_eager_loss(self, name):
    loss = CHECKED[name]
    z1, z2 = _views()
    error, value = _checked(loss, mappings.temperature)(0.5)
    assert error.get() is None
    eager = loss(z1, z2, mapping=mappings.temperature(0.5), check_finite=True)
    chex.assert_trees_all_close(value, eager, rtol=1e-5)

  def test_valid_traced_tau_against_numpy(self):
    z1, z2 = _views()
    for loss, reference in ((losses.info_nce, numpy_info_nce),
                            (losses.sigmoid_loss, numpy_sigmoid_loss)):
      error, value = _checked(loss, mappings.temperature)(0.5)
      assert error.get() is None
      np.testing.assert_allclose(value, reference(z1, z2, 0.5), rtol=1e-5)

  def test_the_check_keeps_the_gradient_of_tau(self):
    z1, z2 = _views()

    def loss(tau, check_finite):
      return losses.info_nce(z1, z2, mapping=mappings.temperature(tau), check_finite=check_finite)

    error, grad = checkify.checkify(jax.jit(jax.grad(lambda t: loss(t, "checkify"))))(0.5)
    assert error.get() is None
    # d/dtau of NumPy's loss, by a central difference in float64.
    step = 1e-5
    expected = (numpy_info_nce(z1, z2, 0.5 + step) - numpy_info_nce(z1, z2, 0.5 - step)) / (
        2 * step)
    np.testing.assert_allclose(grad, expected, rtol=1e-4)

  def test_without_check_finite_tau_is_not_checked(self):
    # As documented: no error, tau = 0 gives a non-finite loss (NaN for InfoNCE), tau < 0 a
    # finite loss, the NumPy formula at that tau, which means nothing.
    z1, z2 = _views()
    for loss, reference in ((losses.info_nce, numpy_info_nce),
                            (losses.sigmoid_loss, numpy_sigmoid_loss)):
      unchecked = jax.jit(lambda tau, loss=loss: loss(z1, z2, mapping=mappings.temperature(tau)))
      assert not np.isfinite(unchecked(0.0))
      np.testing.assert_allclose(unchecked(-1.0), reference(z1, z2, -1.0), rtol=1e-5)
    assert np.isnan(jax.jit(lambda tau: losses.info_nce(
        z1, z2, mapping=mappings.temperature(tau)))(0.0))
    # Under checkify too: the unchecked loss adds no check.
    error, _ = checkify.checkify(jax.jit(
        lambda tau: losses.info_nce(z1, z2, mapping=mappings.temperature(tau))))(0.0)
    assert error.get() is None

  @parameterized.parameters(*sorted(CHECKED))
  def test_check_finite_true_under_a_trace_says_what_to_do(self, name):
    # True checks concrete values; traced ones (jit, grad) are refused with the way to check
    # them, naming check_finite, not JAX's generic message about unfunctionalized checks.
    z1, z2 = _views()
    loss = CHECKED[name]
    traced = "z" if name.startswith("supervised") else "z1"
    for transform in (jax.jit, jax.grad):
      with pytest.raises(ValueError, match=rf"^check_finite=True checks concrete values, but "
                         rf"{traced} is traced .* check_finite='checkify' .*checkify.checkify"):
        transform(lambda a: loss(a, z2, check_finite=True))(z1)
    # The mapping's traced parameter, with concrete embeddings.
    with pytest.raises(ValueError, match=r"but the parameter tau of mapping 'tau=<traced>' is "
                                         r"traced"):
      jax.jit(lambda tau: loss(z1, z2, mapping=mappings.temperature(tau),
                               check_finite=True))(0.5)

  @parameterized.parameters(1, "yes", None)
  def test_check_finite_takes_its_three_values_only(self, value):
    z1, z2 = _views()
    with pytest.raises(ValueError, match=r"check_finite must be one of \(False, True, "
                                         r"'checkify'\)"):
      losses.info_nce(z1, z2, check_finite=value)

  def test_eager_non_positive_tau_is_refused_when_built(self):
    for tau in (0.0, -1.0):
      with pytest.raises(ValueError, match="tau"):
        mappings.temperature(tau)


class OtherMapParametersTest(parameterized.TestCase):

  def test_learnable_t_must_be_finite_traced_and_eager(self):
    z1, z2 = _views()
    base = mappings.learnable_temperature(tau=0.5)

    def loss(m, check_finite="checkify"):
      return losses.info_nce(z1, z2, mapping=m, check_finite=check_finite)

    bad = base.bind(params={"t": jnp.asarray(jnp.nan)})
    error, _ = checkify.checkify(jax.jit(loss))(bad)  # the mapping's params are traced leaves
    assert error.get().startswith(
        "t must be finite (check_finite), got nan (mapping 'learnable=0.5')")
    with pytest.raises(ValueError, match=r"^t must be finite \(check_finite\), got nan"):
      loss(bad)  # concrete: raised at once
    assert np.isnan(loss(bad, check_finite=False))
    error, value = checkify.checkify(jax.jit(loss))(base)
    assert error.get() is None
    np.testing.assert_allclose(value, numpy_info_nce(z1, z2, 0.5), rtol=1e-5)

  def test_annealed_tau_at_a_traced_step(self):
    z1, z2 = _views()
    # A schedule that crosses 0 at step 5: tau = 0.5 - 0.1 step.
    annealed = mappings.annealed_temperature(lambda step: 0.5 - 0.1 * jnp.asarray(step, float),
                                             spec="falling")
    loss = jax.jit(lambda step: losses.info_nce(z1, z2, mapping=annealed.bind(step=step),
                                                check_finite="checkify"))
    error, value = checkify.checkify(loss)(0)
    assert error.get() is None
    np.testing.assert_allclose(value, numpy_info_nce(z1, z2, 0.5), rtol=1e-5)
    for step in (5, 7):
      error, _ = checkify.checkify(loss)(step)
      assert error.get().startswith(
          "tau = schedule(step) must be finite and > 0 (check_finite), got ")
      assert "(mapping 'falling')" in error.get()
    with pytest.raises(ValueError, match=r"^tau = schedule\(step\) must be finite and > 0"):
      losses.info_nce(z1, z2, mapping=annealed.bind(step=6), check_finite=True)

  def test_sigmoid_bias_must_be_finite(self):
    z1, z2 = _views()
    # A bias must be finite; a relative bias is a cosine, in [-1, 1] (inf and 1.5 are not).
    for kw, message in (({"bias": jnp.asarray(jnp.nan)}, "bias must be finite"),
                        ({"relative_bias": jnp.asarray(jnp.inf)}, "relative_bias must be in"),
                        ({"relative_bias": jnp.asarray(1.5)}, "relative_bias must be in")):
      loss = jax.jit(lambda kw: losses.sigmoid_loss(z1, z2, mapping="tau=0.5",
                                                    check_finite="checkify", **kw))
      error, _ = checkify.checkify(loss)(kw)
      assert error.get().startswith(message), error.get()
    # The bias does not hide the mapping's own check.
    error, _ = _checked(lambda a, b, **kw: losses.sigmoid_loss(a, b, bias=jnp.asarray(-1.0),
                                                               **kw), mappings.temperature)(0.0)
    assert error.get().startswith("tau must be finite and > 0")
    error, value = _checked(lambda a, b, **kw: losses.sigmoid_loss(a, b, bias=-1.0, **kw),
                            mappings.temperature)(0.5)
    assert error.get() is None
    np.testing.assert_allclose(value, numpy_sigmoid_loss(z1, z2, 0.5, -1.0), rtol=1e-5)

  def test_maps_declare_their_checks(self):
    def declared(m):
      return [(check.name, check.requirement, bool(check.valid))
              for check in m.parameter_checks()]

    # Concrete parameters are checked when the mapping is built: nothing left to check.
    for m in (mappings.temperature_free(), mappings.temperature(0.5),
              mappings.dynamic_temperature(0.1, 0.2), mappings.as_mapping(lambda c: 3.0 * c)):
      assert declared(m) == [], m.spec
    assert declared(mappings.learnable_temperature(tau=0.07)) == [("t", "finite", True)]
    assert declared(mappings.from_spec("anneal=cosine:0.5:0.1:10").bind(step=3)) == [
        ("tau = schedule(step)", "finite and > 0", True)]
    valid = jax.jit(lambda tau: [c.valid for c in mappings.temperature(tau).parameter_checks()])
    assert [bool(v) for v in valid(-1.0)] == [False]
    assert [bool(v) for v in valid(0.25)] == [True]
