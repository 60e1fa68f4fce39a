"""The devices a loss runs on (`Devices`: one, or a share of the batch on each device of a mesh
axis), and the device layer of the sharded losses: negatives from every device, by all-gather or a
ring of `ppermute`, inside `jax.shard_map`; shared by every loss family.

A device's rows are the anchors and every device's rows the candidates; `device_reduce` gives
the engine's tile reduction over them (gathered, or passed round the ring with their column
statistics and gradients), `reduce_across_devices` the global mean, and `on_mesh` the
`shard_map` around a sharded loss for global arrays.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from tfcl_jax import _checks
from tfcl_jax.losses._engine import _arguments, _layout, _pure, _tiled
from tfcl_jax.losses._engine._tiles import LogSumExp, Side, TileReduction

#: How the sharded losses reach other devices' candidates: gather them all, or pass them round.
STRATEGIES = ("all_gather", "ring")


def axis_size(axis_name, *, loss: str = "sharded_info_nce",
              wrapper: str = "info_nce_on_mesh") -> int:
  """The size of the bound mesh axis `axis_name`; a clear error when it is not bound."""
  try:
    return jax.lax.axis_size(axis_name)
  except NameError:
    raise ValueError(
        f"axis_name {axis_name!r} is not bound: call {loss} inside jax.shard_map "
        f"over a mesh with that axis (or use {wrapper}).") from None


def _ring(axis_name):
  size = jax.lax.axis_size(axis_name)
  permutation = [(i, (i + 1) % size) for i in range(size)]
  return size, lambda x: jax.lax.ppermute(x, axis_name, permutation)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _ring_reduce(plan, axis_name, rows: Side, columns: Side, args):
  size, send = _ring(axis_name)
  like = rows.vectors
  # Raw rows travel with their inverse norms (`_tiled.with_inverse_norms`), computed once.
  rows, columns = _tiled.with_inverse_norms(rows), _tiled.with_inverse_norms(columns)
  row_stats, col_stats = _pure.match_varying(_tiled.init_stats(plan, rows, columns), like)

  def hop(_, carry):
    columns, row_stats, col_stats = carry
    # Send the block on before using it, so the transfer can overlap the compute. Column
    # statistics travel with their block; after P hops both are home.
    following = send(columns)
    row_stats, col_stats = _tiled.accumulate(plan, args, rows, columns, row_stats, col_stats)
    return following, row_stats, send(col_stats)

  carry = (_pure.match_varying(columns, like), row_stats, col_stats)
  _, row_stats, col_stats = jax.lax.fori_loop(0, size, hop, carry)
  finish = plan.tile_reduction.finish
  return finish(row_stats), None if col_stats is None else finish(col_stats)


def _ring_reduce_bwd(plan, axis_name, residuals, cotangents):
  home_rows, home_cols, args, (row_out, col_out) = residuals
  row_g, col_g = cotangents
  size, send = _ring(axis_name)
  like = home_rows.vectors
  rows, columns = _tiled.with_inverse_norms(home_rows), _tiled.with_inverse_norms(home_cols)
  drows, dcols, dparams, dconsts = _pure.match_varying(
      _tiled.zero_grads(plan, args, rows, columns), like)

  def hop(_, carry):
    (columns, c_out, c_g, dcols), grads = carry
    following = send((columns, c_out, c_g))
    drows, dcols, dparams, dconsts = _tiled.accumulate_grads(
        plan, args, rows, columns, row_out, row_g, c_out, c_g, (grads[0], dcols, *grads[1:]))
    # A block's gradient travels with it; after a full round it is back home.
    return (*following, send(dcols)), (drows, dparams, dconsts)

  travel = _pure.match_varying((columns, col_out, col_g, dcols), like)
  (_, _, _, dcols), (drows, dparams, dconsts) = jax.lax.fori_loop(
      0, size, hop, (travel, (drows, dparams, dconsts)))
  # None: JAX's cotangent for the integer and boolean leaves.
  return (_tiled.side_grad(home_rows, drows), _tiled.side_grad(home_cols, dcols),
          args._replace(params=dparams, step=None, consts=dconsts))


_ring_reduce.defvjp(_tiled.saving_inputs(_ring_reduce, num_static=2), _ring_reduce_bwd)


def device_reduce(axis_name, strategy):
  """`tile_reduce` with the candidates of every device (for `negatives_lse` and the sigmoid
  loss): a device's rows against everyone's columns."""

  def reduce_fn(rows, columns, *, mapping, kind, block_size,
                tile_reduction: TileReduction = LogSumExp()):
    if kind == "symmetric":  # a device's rows against everyone's: not symmetric any more
      columns, kind = rows, "rows"
    if strategy == "all_gather":
      gathered = jax.tree.map(lambda x: jax.lax.all_gather(x, axis_name, tiled=True), columns)
      row_out, col_out = _tiled.tile_reduce(rows, gathered, mapping=mapping, kind=kind,
                                            block_size=block_size,
                                            tile_reduction=tile_reduction)
      if col_out is not None:  # this device's rows only: combine over devices, keep ours
        col_out = tile_reduction.combine_across(col_out, axis_name)
        n = columns.ids.shape[0]
        col_out = jax.lax.dynamic_slice_in_dim(col_out, jax.lax.axis_index(axis_name) * n, n)
      return row_out, col_out
    return _tiled.with_tiling(block_size, functools.partial(
        ring, kind=kind, mapping=mapping, tile_reduction=tile_reduction), rows, columns)

  def ring(tiling, rows, columns, *, kind, mapping, tile_reduction):
    plan, args, padded_rows, padded_cols = _tiled.planned(
        tiling, rows, columns, mapping=mapping, kind=kind, tile_reduction=tile_reduction)
    return _tiled.unpadded(_ring_reduce(plan, axis_name, padded_rows, padded_cols, args), rows,
                           columns)

  return reduce_fn


def reduce_across_devices(per_row: jax.Array, valid: jax.Array, *, reduction: str, masked: bool,
                          axis_name, size: int) -> jax.Array:
  """This device's row losses (invalid rows zeroed) as `reduction` over the rows of all `size`
  devices on `axis_name`: per row (`"none"`, this device's), summed, or the mean over all rows
  (over the valid ones when `masked`)."""
  per_row = jnp.where(valid, per_row, 0.0)
  if reduction == "none":
    return per_row
  total = jax.lax.psum(jnp.sum(per_row), axis_name)
  if reduction == "sum":
    return total
  if not masked:
    return total / (per_row.shape[0] * size)
  return total / jnp.maximum(jax.lax.psum(jnp.sum(valid), axis_name), 1)


def _explicitly_sharded(x) -> bool:
  """Whether `x`'s type carries a sharding on Explicit mesh axes (sharding in types)."""
  sharding = getattr(jax.typeof(x), "sharding", None)
  mesh = getattr(sharding, "mesh", None)
  return bool(mesh is not None and mesh.axis_names and any(
      t == jax.sharding.AxisType.Explicit for t in mesh.axis_types))


def on_mesh(local_loss, z1, z2, *, mesh, axis_name, where=None, reduction="mean",
            extra_negatives=None, extra_where=None, **kwargs):
  """Runs `local_loss` (a sharded loss) under `jax.shard_map` on global `[N, D]` views: `z1`,
  `z2` and `where` split over `axis_name`, the bank replicated, the rest as it is."""
  if axis_name not in mesh.axis_names:
    raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh {mesh.axis_names}.")
  z1, z2 = _arguments.check_pair(z1, z2)
  size = mesh.shape[axis_name]
  if z1.shape[0] % size:
    raise ValueError(
        f"z1 and z2 must have a batch divisible by the {size} devices of axis {axis_name!r}, "
        f"got N = {z1.shape[0]}.")
  where = _arguments.check_where(where, z1.shape[0])
  bank, bank_where = _arguments.check_extra(extra_negatives, extra_where, z1.shape[1])
  batch, replicated = PartitionSpec(axis_name), PartitionSpec()
  extra = {} if bank is None else dict(extra_negatives=bank, extra_where=bank_where)

  def local(a, b, mask, extra):
    masked = {} if mask is None else {"where": mask}  # a loss may take no mask
    return local_loss(a, b, axis_name=axis_name, reduction=reduction, **masked, **extra,
                      **kwargs)

  in_specs = (batch, batch, batch, replicated)
  out_specs = batch if reduction == "none" else replicated
  if _explicitly_sharded(z1) or _explicitly_sharded(z2):
    # Inputs typed with an Explicit sharding (`jax.make_mesh` + `device_put`, multi-process
    # global arrays): shard_map on that mesh, the other inputs resharded to their specs, so the
    # gradient's cotangents carry the same sharding types as the inputs.
    explicit = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(
        jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))
    place = jax.sharding.reshard
    z1, z2, where = (place(x, NamedSharding(explicit, batch)) for x in (z1, z2, where))
    extra = jax.tree.map(lambda x: place(x, NamedSharding(explicit, replicated)), extra)
    run_mesh = explicit
  else:
    # An Auto-axes copy of the mesh: shard_map places unplaced inputs itself, so the loss and
    # its gradient work on `jax.make_mesh`'s Explicit meshes without `jax.set_mesh`.
    run_mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names,
                                 axis_types=(jax.sharding.AxisType.Auto,) * len(mesh.axis_names))
  result = jax.shard_map(local, mesh=run_mesh, in_specs=in_specs, out_specs=out_specs)(
      z1, z2, where, extra)
  two_sets = kwargs.get("negatives", "cross") == "all" or kwargs.get("symmetric", False)
  if reduction == "none" and two_sets:
    # Per device: its first rows then its second rows; reorder to all first, then all second.
    result = result.reshape(size, 2, -1).transpose(1, 0, 2).reshape(-1)
  return result


def sum_over_anchors(x: jax.Array) -> jax.Array:
  """The sum over a single-device loss's anchors (`axis=0`)."""
  return jnp.sum(x, axis=0)


@functools.cache  # one function per axis: a static argument of the jitted solve
def total_across(axis_name) -> Callable[[jax.Array], jax.Array]:
  """The sum over anchors of a sharded loss: this device's, then over the devices."""
  return lambda x: jax.lax.psum(jnp.sum(x, axis=0), axis_name)


class Devices(abc.ABC):
  """Where a loss runs: the whole batch on one device (`ONE_DEVICE`), or each device's share of
  it inside `jax.shard_map` (`Sharded`). A loss family is written once against it: its checks,
  its layout, the tile reductions over its candidates and the reduction of its row losses."""

  #: Whether `z1, z2` are a device's share of the batch (`_arguments.check_pair(local=...)`).
  local: bool

  @abc.abstractmethod
  def name(self, family: str) -> str:
    """The public name of `family`'s loss here (`info_nce`, `sharded_info_nce`)."""

  @abc.abstractmethod
  def size(self, family: str) -> int:
    """How many devices hold the batch (an error naming the loss where the axis is not bound)."""

  @abc.abstractmethod
  def check(self) -> None:
    """Checks the devices' own arguments (a sharded loss's `strategy`)."""

  @abc.abstractmethod
  def layout(self, z1, z2, *, negatives: str, symmetric: bool, valid, size: int
             ) -> _layout.Layout:
    """The rows of `z1, z2` laid out as their share of the batch (`_layout.layout`)."""

  @property
  @abc.abstractmethod
  def reduce_fn(self) -> Callable:
    """`_tiled.tile_reduce`'s contract over every device's candidates."""

  @property
  @abc.abstractmethod
  def total(self) -> Callable[[jax.Array], jax.Array]:
    """The sum over every device's anchors (`axis=0`)."""

  @abc.abstractmethod
  def reduce(self, per_row: jax.Array, valid: jax.Array, *, reduction: str, masked: bool
             ) -> jax.Array:
    """The row losses as `reduction` over the batch (`_layout.reduce`)."""


class _OneDevice(Devices):
  local = False

  def name(self, family: str) -> str:
    return family

  def size(self, family: str) -> int:
    return 1

  def check(self) -> None:
    return None

  def layout(self, z1, z2, *, negatives, symmetric, valid, size):
    return _layout.layout(z1, z2, negatives=negatives, symmetric=symmetric, valid=valid)

  @property
  def reduce_fn(self):
    return _tiled.tile_reduce

  @property
  def total(self):
    return sum_over_anchors

  def reduce(self, per_row, valid, *, reduction, masked):
    return _layout.reduce(per_row, valid, reduction, masked=masked)


#: The whole batch on one device.
ONE_DEVICE = _OneDevice()


@dataclasses.dataclass(frozen=True)
class Sharded(Devices):
  """Each device's share of the batch on the mesh axis `axis_name`, inside `jax.shard_map`; the
  candidates of other devices reached by `strategy` (`STRATEGIES`)."""

  axis_name: str
  strategy: str
  local = True

  def name(self, family: str) -> str:
    return f"sharded_{family}"

  def size(self, family: str) -> int:
    return axis_size(self.axis_name, loss=self.name(family), wrapper=f"{family}_on_mesh")

  def check(self) -> None:
    _checks.one_of(self.strategy, STRATEGIES, name="strategy")

  def layout(self, z1, z2, *, negatives, symmetric, valid, size):
    """This device's `n` pairs as its share of the global batch of `n * size` pairs: ids offset
    by the device's index on `axis_name`."""
    n = z1.shape[0]
    if n * size < 2:
      raise ValueError(f"the global batch needs N >= 2 pairs to have a negative, got N = "
                       f"{n * size}.")
    rows_per_device = n if negatives == "cross" else 2 * n
    offset = jax.lax.axis_index(self.axis_name) * rows_per_device
    return _layout.layout(z1, z2, negatives=negatives, symmetric=symmetric, valid=valid,
                          offset=offset)

  @property
  def reduce_fn(self):
    return device_reduce(self.axis_name, self.strategy)

  @property
  def total(self):
    return total_across(self.axis_name)

  def reduce(self, per_row, valid, *, reduction, masked):
    return reduce_across_devices(per_row, valid, reduction=reduction, masked=masked,
                                 axis_name=self.axis_name, size=jax.lax.axis_size(self.axis_name))
