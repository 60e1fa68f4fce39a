"""A loss family declared once (`_family`): its derived forms' signatures, docstrings and errors
against the public ones written before them; cross-device negatives (all-gather, ring) against the
single-device loss, 8 CPU devices; a family declared from the decorator alone."""

from __future__ import annotations

import inspect

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from tests.helpers.marks import widest_cases
from tfcl_jax import losses, mappings

# (negatives, symmetric, masked, extra negatives)
CASES = [("cross", False, True, False), ("cross", True, True, True), ("all", False, False, True)]


def _mesh():
  return jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))


def _views(n=16, d=4):
  k1, k2, k3, k4 = jax.random.split(jax.random.key(0), 4)
  z1 = jax.random.normal(k1, (n, d))
  z2 = z1 + 0.7 * jax.random.normal(k2, (n, d))
  where = jax.random.bernoulli(k3, 0.7, (n,)).at[0].set(True)
  bank = jax.random.normal(k4, (5, d))
  return z1, z2, where, bank


def _loss_and_grads(loss_fn):
  """Jitted: loss and gradients (z1, z2, t) of a learnable-temperature loss for each case."""

  def run(z1, z2, t, where, bank):
    results = {}
    for negatives, symmetric, masked, banked in CASES:
      def loss(a, b, t, negatives=negatives, symmetric=symmetric, masked=masked, banked=banked):
        return loss_fn(a, b, mapping=mappings.learnable_temperature(t=t), negatives=negatives,
                       symmetric=symmetric, where=where if masked else None,
                       extra_negatives=bank if banked else None)
      results[negatives, symmetric] = jax.value_and_grad(loss, argnums=(0, 1, 2))(z1, z2, t)
    return results

  return jax.jit(run)


@pytest.fixture(scope="module")
def dense_reference():
  z1, z2, where, bank = _views()
  return _loss_and_grads(losses.info_nce)(z1, z2, 1.5, where, bank)


@pytest.mark.parametrize("strategy, block_size", widest_cases(
    ("all_gather", None), ("all_gather", 3), ("ring", None), ("ring", 3),
    quick=[("all_gather", 3), ("ring", None)]))
def test_matches_single_device_dense_loss_and_gradients(strategy, block_size, dense_reference):
  z1, z2, where, bank = _views()
  mesh = _mesh()

  def sharded(a, b, **kwargs):
    return losses.info_nce_on_mesh(a, b, mesh=mesh, strategy=strategy,
                                        block_size=block_size, **kwargs)

  results = _loss_and_grads(sharded)(z1, z2, 1.5, where, bank)
  chex.assert_trees_all_close(results, dense_reference, atol=1e-5, rtol=1e-5)
  assert all(abs(float(grads[2])) > 1e-3 for _, grads in results.values())


def test_per_row_losses_in_single_device_order():
  z1, z2, _, _ = _views()
  for negatives, symmetric in (("all", False), ("cross", True)):
    rows = jax.jit(lambda a, b, n=negatives, s=symmetric: losses.info_nce_on_mesh(
        a, b, mesh=_mesh(), negatives=n, symmetric=s, strategy="ring", reduction="none"))(z1, z2)
    chex.assert_trees_all_close(rows, losses.info_nce(
        z1, z2, negatives=negatives, symmetric=symmetric, reduction="none"), atol=1e-5)


def test_gradient_on_an_explicit_mesh_without_set_mesh():
  # Explicit axes (jax.make_mesh's default from JAX 0.9); value_and_grad must work without
  # `jax.set_mesh` (jitted: the eager ring dispatches every step of the ring op by op).
  z1, z2, _, _ = _views()
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  got = jax.jit(jax.value_and_grad(lambda a: losses.info_nce_on_mesh(
      a, z2, mesh=mesh, strategy="ring", symmetric=True)))(z1)
  expected = jax.jit(jax.value_and_grad(lambda a: losses.info_nce(a, z2, symmetric=True)))(z1)
  chex.assert_trees_all_close(got, expected, atol=1e-5)


@pytest.mark.parametrize("loss_on_mesh, loss", [
    (losses.info_nce_on_mesh, losses.info_nce), (losses.sigmoid_loss_on_mesh, losses.sigmoid_loss)])
def test_gradient_of_inputs_placed_on_an_explicit_mesh(loss_on_mesh, loss):
  # Inputs whose type carries the sharding (`device_put` on a `make_mesh` mesh, as the global
  # arrays of a multi-process run): the cotangents must carry the same sharding type.
  z1, z2, where, _ = _views()
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  placed = jax.sharding.NamedSharding(mesh, PartitionSpec("data"))
  a, b = jax.device_put(z1, placed), jax.device_put(z2, placed)
  for kwargs in (dict(negatives="all"), dict(negatives="cross", where=where)):
    got = jax.jit(jax.value_and_grad(
        lambda x, y, kw=kwargs: loss_on_mesh(x, y, mesh=mesh, **kw), argnums=(0, 1)))(a, b)
    expected = jax.jit(jax.value_and_grad(lambda x, y, kw=kwargs: loss(x, y, **kw),
                                          argnums=(0, 1)))(z1, z2)
    chex.assert_trees_all_close(got, expected, atol=1e-5)
    assert got[1][0].sharding.spec == PartitionSpec("data", None)


def test_unbound_axis_name_raises():
  z = jnp.ones((4, 2))
  with pytest.raises(ValueError, match="axis_name 'data' is not bound"):
    losses.sharded_info_nce(z, z)


def test_wrong_axis_name_inside_shard_map_raises():
  z = jnp.ones((16, 2))
  spec = PartitionSpec("data")
  loss_fn = jax.shard_map(lambda a: losses.sharded_info_nce(a, a, axis_name="batch"),
                          mesh=_mesh(), in_specs=spec, out_specs=PartitionSpec())
  with pytest.raises(ValueError, match="axis_name 'batch'"):
    loss_fn(z)


def test_batch_not_divisible_by_devices_raises():
  z = jnp.ones((12, 2))
  with pytest.raises(ValueError, match="z1 and z2 must have a batch divisible by the 8 devices"):
    losses.info_nce_on_mesh(z, z, mesh=_mesh())


def test_axis_not_in_mesh_raises():
  z = jnp.ones((16, 2))
  with pytest.raises(ValueError, match="axis_name 'model'"):
    losses.info_nce_on_mesh(z, z, mesh=_mesh(), axis_name="model")


def test_bad_strategy_and_block_size_raise():
  z = jnp.ones((16, 2))
  with pytest.raises(ValueError, match="strategy"):
    losses.info_nce_on_mesh(z, z, mesh=_mesh(), strategy="tree")
  with pytest.raises(ValueError, match="block_size"):
    losses.info_nce_on_mesh(z, z, mesh=_mesh(), block_size=0)


def test_gradient_taken_inside_shard_map_is_the_global_gradient():
  # A data-parallel train step differentiates per device; the psum'd loss's gradient must
  # still be each device's slice of the single-device gradient.
  z1, z2, _, _ = _views()
  batch = PartitionSpec("data")

  def local_step(a, b):
    loss = lambda a, b: losses.sharded_info_nce(a, b, negatives="all", strategy="ring",
                                                     block_size=3)
    return jax.value_and_grad(loss, argnums=(0, 1))(a, b)

  step = jax.jit(jax.shard_map(local_step, mesh=_mesh(), in_specs=(batch, batch),
                               out_specs=(PartitionSpec(), (batch, batch))))
  expected = jax.jit(jax.value_and_grad(lambda a, b: losses.info_nce(a, b, negatives="all"),
                                        argnums=(0, 1)))(z1, z2)
  chex.assert_trees_all_close(step(z1, z2), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("loss_on_mesh", (losses.info_nce_on_mesh, losses.sigmoid_loss_on_mesh))
def test_free_n_takes_the_global_candidate_count(loss_on_mesh):
  """On 8 devices of 2 pairs each, `free_n` scales by the global batch's candidates (16 for
  cross, 31 for all, plus a bank's 5), not a device's share."""
  z1, z2, _, bank = _views()
  mesh = _mesh()
  cases = [("cross", None, 16), ("all", None, 31)]
  if loss_on_mesh is losses.info_nce_on_mesh:
    cases.append(("cross", bank, 21))
  for negatives, extra, n in cases:
    kwargs = dict(negatives=negatives, mesh=mesh)
    if extra is not None:
      kwargs["extra_negatives"] = extra
    both = jax.jit(lambda a, b, kw=kwargs, n=n: [
        loss_on_mesh(a, b, mapping=m, **kw) for m in ("free_n", mappings.n_aware_free(
            num_candidates=n))])  # one program: compiled once, not run op by op
    got, want = both(z1, z2)
    np.testing.assert_allclose(got, want, rtol=1e-6)


# The keywords of each public form, as they were written by hand before the forms were derived.
SIGNATURES = {
    "info_nce": ["mapping", "negatives", "symmetric", "reduction", "where", "block_size",
                 "extra_negatives", "extra_where", "implementation", "candidate_bias",
                 "check_finite"],
    "sharded_info_nce": ["mapping", "negatives", "symmetric", "axis_name", "strategy",
                         "block_size", "where", "reduction", "extra_negatives", "extra_where"],
    "sigmoid_loss": ["mapping", "bias", "relative_bias", "negatives", "reduction", "where",
                     "block_size", "check_finite"],
    "sharded_sigmoid_loss": ["mapping", "bias", "relative_bias", "negatives", "axis_name",
                             "strategy", "block_size", "where", "reduction"],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_the_derived_forms_take_the_keywords_written_before(name):
  parameters = inspect.signature(getattr(losses, name)).parameters
  assert list(parameters)[:2] == ["z1", "z2"]
  assert sorted(list(parameters)[2:]) == sorted(SIGNATURES[name])
  strategy = parameters.get("strategy")
  if strategy is not None:  # each family's default: SigLIP's ring, InfoNCE's gather
    assert strategy.default == ("ring" if "sigmoid" in name else "all_gather")


@pytest.mark.parametrize("family", ["info_nce", "sigmoid_loss"])
def test_the_mesh_form_takes_the_sharded_keywords_and_the_mesh(family):
  sharded = inspect.signature(getattr(losses, f"sharded_{family}")).parameters
  meshed = inspect.signature(getattr(losses, f"{family}_on_mesh")).parameters
  assert set(meshed) == set(sharded) | {"mesh"}
  for form in (family, f"sharded_{family}", f"{family}_on_mesh"):
    function = getattr(losses, form)
    assert function.__name__ == form and "Examples:" in function.__doc__, form
    extra = {"mesh": None} if form.endswith("_on_mesh") else {}
    with pytest.raises(TypeError, match=f"{form}\\(\\) got an unexpected keyword argument 'axes'"):
      function(jnp.ones((4, 2)), jnp.ones((4, 2)), axes=1, **extra)


def test_the_one_device_form_shows_the_declared_source():
  source = inspect.getsource(losses.info_nce)
  assert source.lstrip().startswith("@family(") and "devices.reduce(" in source


def test_evaluation_metrics():
  assert losses.Evaluation(jnp.float32(1.0)).metrics == {}
  metrics = losses.Evaluation(jnp.float32(1.0), jnp.array([1.0, 3.0])).metrics
  np.testing.assert_allclose(metrics["loss/scale"], 2.0)


def test_a_family_from_its_declaration_alone_runs_on_every_device():
  """A family written against `Devices` only (an alignment loss, `1 - cos` of each pair): its
  sharded and mesh forms, derived, equal it on the whole batch, values and gradients."""
  from tfcl_jax.losses._engine import _arguments, _layout  # noqa: PLC0415
  from tfcl_jax.losses._family import Evaluation, family  # noqa: PLC0415

  @family(strategy="ring")
  def alignment(z1, z2, *, devices, reduction: str = "mean", where=None):
    """`1 - cos(z1_i, z2_i)` per pair."""
    devices.size("alignment")
    z1, z2 = _arguments.check_pair(z1, z2, local=devices.local)
    valid = _arguments.check_where(where, z1.shape[0])
    valid = jnp.ones(z1.shape[:1], bool) if valid is None else valid
    per_row = 1.0 - jnp.sum(_layout.l2_normalize(z1) * _layout.l2_normalize(z2), axis=1)
    return Evaluation(devices.reduce(per_row, valid, reduction=reduction,
                                     masked=where is not None))

  z1, z2, where, _ = _views()
  cos = np.sum(np.asarray(losses.l2_normalize(z1)) * np.asarray(losses.l2_normalize(z2)), 1)
  w = np.asarray(where)
  np.testing.assert_allclose(alignment(z1, z2, where=where), np.sum((1 - cos) * w) / w.sum(),
                             rtol=1e-6)
  mesh = _mesh()
  on_mesh = alignment.family.on_mesh
  grads = [jax.grad(lambda a, f=f: f(a))(z1) for f in (
      lambda a: alignment(a, z2, where=where),
      lambda a: on_mesh(a, z2, mesh=mesh, where=where))]
  chex.assert_trees_all_close(*grads, atol=1e-6)
  np.testing.assert_allclose(on_mesh(z1, z2, mesh=mesh, reduction="none"),
                             alignment(z1, z2, reduction="none"), rtol=1e-6)
