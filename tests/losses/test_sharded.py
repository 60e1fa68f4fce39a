"""Cross-device negatives (all-gather, ring) against the single-device loss, 8 CPU devices."""

from __future__ import annotations

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
