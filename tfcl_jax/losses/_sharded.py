"""InfoNCE with negatives from every device: all-gather or a ring of `ppermute`, in `shard_map`.

Each device holds `N / P` pairs of the global batch; the loss equals the single-device loss
of the whole batch (Eq. 1 / 11), and so do the gradients of each device's embeddings. Both
strategies reuse the single-device layout and tiles.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from tfcl_jax import _checks
from tfcl_jax.losses import _engine, _layout
from tfcl_jax.losses._info_nce import negatives_lse, row_losses
from tfcl_jax.losses._tiles import LogSumExp, Side

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
  row_stats, col_stats = _engine.match_varying(_engine.init_stats(plan, rows, columns), like)

  def hop(_, carry):
    columns, row_stats, col_stats = carry
    # Send the block on before using it, so the transfer can overlap the compute. Column
    # statistics travel with their block; after P hops both are home.
    following = send(columns)
    row_stats, col_stats = _engine.accumulate(plan, args, rows, columns, row_stats, col_stats)
    return following, row_stats, send(col_stats)

  carry = (_engine.match_varying(columns, like), row_stats, col_stats)
  _, row_stats, col_stats = jax.lax.fori_loop(0, size, hop, carry)
  finish = plan.reduction.finish
  return finish(row_stats), None if col_stats is None else finish(col_stats)


def _ring_reduce_fwd(plan, axis_name, rows, columns, args):
  out = _ring_reduce(plan, axis_name, rows, columns, args)
  return out, (rows, columns, args, out)


def _ring_reduce_bwd(plan, axis_name, residuals, cotangents):
  rows, columns, args, (row_lse, col_lse) = residuals
  row_g, col_g = cotangents
  size, send = _ring(axis_name)
  like = rows.vectors
  drows, dcols, dparams, dconsts = _engine.match_varying(
      _engine.zero_grads(plan, args, rows, columns), like)

  def hop(_, carry):
    (columns, c_lse, c_g, dcols), grads = carry
    following = send((columns, c_lse, c_g))
    drows, dcols, dparams, dconsts = _engine.accumulate_grads(
        plan, args, rows, columns, row_lse, row_g, c_lse, c_g, (grads[0], dcols, *grads[1:]))
    # A block's gradient travels with it; after a full round it is back home.
    return (*following, send(dcols)), (drows, dparams, dconsts)

  travel = _engine.match_varying((columns, col_lse, col_g, dcols), like)
  (_, _, _, dcols), (drows, dparams, dconsts) = jax.lax.fori_loop(
      0, size, hop, (travel, (drows, dparams, dconsts)))
  return (Side(drows, None, None, None), Side(dcols, None, None, None),
          args._replace(params=dparams, step=None, consts=dconsts))


_ring_reduce.defvjp(_ring_reduce_fwd, _ring_reduce_bwd)


def device_reduce(axis_name, strategy):
  """`tile_reduce` with the candidates of every device (for `negatives_lse` and the sigmoid
  loss): a device's rows against everyone's columns."""

  def lse_fn(rows, columns, *, mapping, kind, block_size, reduction=LogSumExp):
    if kind == "symmetric":  # a device's rows against everyone's: not symmetric any more
      columns, kind = rows, "rows"
    if strategy == "all_gather":
      gathered = Side(*(jax.lax.all_gather(x, axis_name, tiled=True) for x in columns))
      row_lse, col_lse = _engine.tile_reduce(rows, gathered, mapping=mapping, kind=kind,
                                             block_size=block_size, reduction=reduction)
      if col_lse is not None:  # this device's rows only: combine over devices, keep ours
        assert reduction is LogSumExp, "only InfoNCE's two-tower loss has column outputs"
        col_lse = _global_logsumexp(col_lse, axis_name)
        n = columns.ids.shape[0]
        col_lse = jax.lax.dynamic_slice_in_dim(col_lse, jax.lax.axis_index(axis_name) * n, n)
      return row_lse, col_lse
    if block_size is None:
      return _engine.by_platform(rows.ids.shape[0], columns.ids.shape[0], functools.partial(
          ring, kind=kind, mapping=mapping, reduction=reduction), rows, columns)
    return ring(block_size, rows, columns, kind=kind, mapping=mapping, reduction=reduction)

  def ring(block_size, rows, columns, *, kind, mapping, reduction):
    block_rows = _engine.balanced_tile(block_size, rows.ids.shape[0])
    block_cols = _engine.balanced_tile(block_size, columns.ids.shape[0])
    tile_map, args = _engine.pure_map(mapping, rows.vectors.dtype, (block_rows, block_cols),
                                      like=rows.vectors, reduction=reduction)
    plan = _engine.Plan(kind, block_rows, block_cols, tile_map, reduction=reduction)
    row_lse, col_lse = _ring_reduce(plan, axis_name, _engine.pad_side(rows, block_rows),
                                    _engine.pad_side(columns, block_cols), args)
    num_rows, num_cols = rows.ids.shape[0], columns.ids.shape[0]
    return row_lse[:num_rows], None if col_lse is None else col_lse[:num_cols]

  return lse_fn


def _global_logsumexp(partial, axis_name):
  """`log sum_devices exp(partial)`, elementwise; `-inf` with zero gradient where all are."""
  top = jax.lax.pmax(jax.lax.stop_gradient(partial), axis_name)
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  total = jax.lax.psum(jnp.exp(partial - top), axis_name)
  nonempty = total > 0
  return jnp.where(nonempty, jnp.log(jnp.where(nonempty, total, 1.0)) + top, -jnp.inf)


def sharded_info_nce(
    z1: jax.typing.ArrayLike,
    z2: jax.typing.ArrayLike,
    *,
    mapping=None,
    negatives: str = "cross",
    symmetric: bool = False,
    axis_name: str = "data",
    strategy: str = "all_gather",
    block_size: int | None = None,
    where: jax.typing.ArrayLike | None = None,
    reduction: str = "mean",
    extra_negatives: jax.typing.ArrayLike | None = None,
    extra_where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
  r"""InfoNCE over the global batch, called inside `jax.shard_map` on each device's pairs.

  Device `p` holds rows `z1_p, z2_p` (`[n, D]`, `n = N / P`); anchors are its own rows,
  candidates the rows of every device (Eq. 1, or Eq. 11 with the default mapping), so the
  result equals `losses.info_nce` on the concatenated batch, and the gradient of each
  device's embeddings equals its slice of the single-device gradient.

  * `strategy="all_gather"`: gather all candidates (`[N or 2N, D]` per device), then the
    tiled logsumexp; the gather's transpose (a reduce-scatter) returns the candidates'
    gradients to their owners. With `symmetric=True` each device's tiles also give every
    column its partial logsumexp, combined over devices by a `psum`.
  * `strategy="ring"`: candidate blocks travel round the ring with `lax.ppermute`, `P` hops;
    the tiles fold each in, and the custom backward sends each block's gradient (and, for
    `symmetric=True`, its column statistics) round with it. Memory O(n D) per device plus
    one tile, never the gathered batch.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from tfcl_jax import losses
    >>> mesh = jax.sharding.Mesh(jax.devices(), ("data",))  # 1, 2, 4 or 8 devices
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 4))
    >>> z2 = jax.random.normal(jax.random.key(1), (8, 4))
    >>> loss_fn = jax.shard_map(
    ...     lambda a, b: losses.sharded_info_nce(a, b, strategy="ring", symmetric=True),
    ...     mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P())
    >>> expected = losses.info_nce(z1, z2, symmetric=True)
    >>> bool(jnp.allclose(loss_fn(z1, z2), expected, atol=1e-5))
    True

  Args:
    z1: `[n, D]` float, this device's first-view embeddings.
    z2: `[n, D]` float, this device's second-view embeddings (row i the positive of `z1[i]`).
    mapping: `cos -> logits` (a `tfcl_jax.mappings.Mapping`); default temperature-free.
    negatives: `"cross"` or `"all"` as in `losses.info_nce`, over the global batch.
    symmetric: CLIP's two-tower loss (with `"cross"`), as in `losses.info_nce`.
    axis_name: the mesh axis the batch is split over; must be bound by `shard_map`.
    strategy: `"all_gather"` or `"ring"`.
    block_size: the largest tile side, or None (automatic).
    where: optional `[n]` bool mask of this device's valid pairs.
    reduction: `"mean"` (global mean over valid anchors, the same on every device), `"sum"`
      (global sum), or `"none"` (this device's per-row losses, ordered as `losses.info_nce`
      orders a batch of `n` pairs).
    extra_negatives: optional `[K, D]` candidates for every anchor (the same on every device).
    extra_where: optional `[K]` bool mask of valid extra negatives.

  Returns:
    A scalar (mean, sum) or this device's per-row losses.
  """
  size = axis_size(axis_name)
  z1, z2 = _layout.check_pair(z1, z2, local=True)
  _layout.check_mode(negatives, symmetric, reduction)
  _checks.one_of(strategy, STRATEGIES, name="strategy")
  block_size = _layout.check_block_size(block_size)
  mapping = _layout.check_mapping(mapping)
  n = z1.shape[0]
  if n * size < 2:
    raise ValueError(f"the global batch needs N >= 2 pairs to have a negative, got N = {n * size}.")
  valid = _layout.check_where(where, n)
  bank, bank_where = _layout.check_extra(extra_negatives, extra_where, z1.shape[1])

  dtype = _checks.compute_dtype(z1.dtype, z2.dtype)
  u1, u2 = _layout.unit_rows(z1, dtype), _layout.unit_rows(z2, dtype)
  rows_per_device = n if negatives == "cross" else 2 * n
  offset = jax.lax.axis_index(axis_name) * rows_per_device
  rows = _layout.layout(u1, u2, negatives=negatives, symmetric=symmetric, valid=valid,
                        offset=offset)
  bank = None if bank is None else _layout.bank_side(bank, bank_where, dtype)
  lse = negatives_lse(rows, mapping=mapping, block_size=block_size, bank=bank,
                      lse_fn=device_reduce(axis_name, strategy))
  valid_rows = _layout.anchor_valid(rows)
  return reduce_across_devices(row_losses(rows, lse, mapping), valid_rows, reduction=reduction,
                               masked=where is not None, axis_name=axis_name, size=size)


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


def info_nce_on_mesh(
    z1: jax.typing.ArrayLike,
    z2: jax.typing.ArrayLike,
    *,
    mesh: jax.sharding.Mesh,
    axis_name: str = "data",
    where: jax.typing.ArrayLike | None = None,
    reduction: str = "mean",
    extra_negatives: jax.typing.ArrayLike | None = None,
    extra_where: jax.typing.ArrayLike | None = None,
    **kwargs,
) -> jax.Array:
  """`sharded_info_nce` on global `[N, D]` arrays: splits the batch over `mesh[axis_name]`.

  Builds the `jax.shard_map` for you; differentiate through it as through
  `losses.info_nce` (no `jax.set_mesh` needed). `reduction="none"` returns the global
  per-row losses in the order of `losses.info_nce`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))  # 1, 2, 4 or 8 devices
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 4))
    >>> z2 = jax.random.normal(jax.random.key(1), (8, 4))
    >>> grad = jax.jit(jax.grad(
    ...     lambda a: losses.info_nce_on_mesh(a, z2, mesh=mesh, negatives="all")))
    >>> expected = jax.grad(lambda a: losses.info_nce(a, z2, negatives="all"))(z1)
    >>> bool(jnp.allclose(grad(z1), expected, atol=1e-5))
    True

  Args:
    z1: `[N, D]` float, first view; `N` divisible by the number of devices on `axis_name`.
    z2: `[N, D]` float, second view.
    mesh: a `jax.sharding.Mesh` with an axis `axis_name`.
    axis_name: the mesh axis to split the batch over.
    where: optional `[N]` bool mask of valid pairs.
    reduction: `"mean"`, `"sum"` or `"none"`.
    extra_negatives: optional `[K, D]` candidates for every anchor (replicated).
    extra_where: optional `[K]` bool mask of valid extra negatives.
    **kwargs: `mapping`, `negatives`, `symmetric`, `strategy`, `block_size` of
      `sharded_info_nce`.

  Returns:
    The loss (scalar) or the global per-row losses.
  """
  kwargs.update(where=where, reduction=reduction, extra_negatives=extra_negatives,
                extra_where=extra_where)
  return on_mesh(sharded_info_nce, z1, z2, mesh=mesh, axis_name=axis_name, **kwargs)


def _explicitly_sharded(x) -> bool:
  """Whether `x`'s type carries a sharding on Explicit mesh axes (sharding in types)."""
  sharding = getattr(jax.typeof(x), "sharding", None)
  mesh = getattr(sharding, "mesh", None)
  return bool(mesh is not None and mesh.axis_names and any(
      t == jax.sharding.AxisType.Explicit for t in mesh.axis_types))


def on_mesh(local_loss, z1, z2, *, mesh, axis_name, where, reduction, extra_negatives=None,
            extra_where=None, **kwargs):
  """Runs `local_loss` (a sharded loss) under `jax.shard_map` on global `[N, D]` views."""
  if axis_name not in mesh.axis_names:
    raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh {mesh.axis_names}.")
  z1, z2 = _layout.check_pair(z1, z2)
  size = mesh.shape[axis_name]
  if z1.shape[0] % size:
    raise ValueError(
        f"z1 and z2 must have a batch divisible by the {size} devices of axis {axis_name!r}, "
        f"got N = {z1.shape[0]}.")
  where = _layout.check_where(where, z1.shape[0])
  bank, bank_where = _layout.check_extra(extra_negatives, extra_where, z1.shape[1])
  batch, replicated = PartitionSpec(axis_name), PartitionSpec()
  extra = {} if bank is None else dict(extra_negatives=bank, extra_where=bank_where)

  def local(a, b, mask, extra):
    return local_loss(a, b, axis_name=axis_name, where=mask, reduction=reduction, **extra,
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
