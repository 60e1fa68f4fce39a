r"""InfoNCE with negatives from every device: all-gather or a ring of `ppermute`, in `shard_map`.

Each device holds `N / P` pairs of the global batch; the loss equals the single-device loss
of the whole batch (Eq. 1 / 11), and so do the gradients of each device's embeddings.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from tfcl_jax import _checks, blockwise, losses, tiles
from tfcl_jax import mappings as mappings_lib

STRATEGIES = ("all_gather", "ring")


def _axis_size(axis_name) -> int:
  try:
    return jax.lax.axis_size(axis_name)
  except NameError:
    raise ValueError(
        f"axis_name {axis_name!r} is not bound: call sharded_info_nce inside jax.shard_map "
        f"over a mesh with that axis (or use info_nce_on_mesh).") from None


def _ring_permutation(size: int):
  return [(i, (i + 1) % size) for i in range(size)]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _ring_lse(fn, axis_name, block_rows, block_cols, anchors, excluded_ids, columns, params, step,
              consts):
  pure = tiles.PureMapping(fn, params, step, consts)
  permutation = _ring_permutation(jax.lax.axis_size(axis_name))

  def hop(_, carry):
    columns, stats = carry
    # Send the block on before using it, so the transfer can overlap the compute. (The
    # last hop's send is not needed; a loop of identical hops keeps the program small.)
    following = jax.lax.ppermute(columns, axis_name, permutation)
    stats = tiles.accumulate_stats(pure, anchors, excluded_ids, columns, stats,
                                       block_rows=block_rows, block_cols=block_cols)
    return following, stats

  stats = tiles.init_stats(anchors)
  columns = tiles.match_varying(columns, anchors)
  _, stats = jax.lax.fori_loop(0, jax.lax.axis_size(axis_name), hop, (columns, stats))
  return tiles.finish_logsumexp(stats)


def _ring_lse_fwd(fn, axis_name, block_rows, block_cols, anchors, excluded_ids, columns, params,
                  step, consts):
  lse = _ring_lse(fn, axis_name, block_rows, block_cols, anchors, excluded_ids, columns, params,
                  step, consts)
  return lse, (anchors, excluded_ids, columns, params, step, consts, lse)


def _ring_lse_bwd(fn, axis_name, block_rows, block_cols, residuals, g):
  anchors, excluded_ids, columns, params, step, consts, lse = residuals
  pure = tiles.PureMapping(fn, params, step, consts)
  permutation = _ring_permutation(jax.lax.axis_size(axis_name))

  def hop(_, carry):
    columns, danchors, grads = carry
    following = jax.lax.ppermute(columns, axis_name, permutation)
    da, (dcolumns, dparams, dconsts) = tiles.accumulate_grads(
        pure, anchors, excluded_ids, lse, g, columns, grads, block_rows=block_rows,
        block_cols=block_cols)
    # The column gradient travels with its block; after a full round it is back home.
    dcolumns = jax.lax.ppermute(dcolumns, axis_name, permutation)
    return following, danchors + da, (dcolumns, dparams, dconsts)

  carry = (tiles.match_varying(columns, anchors), jnp.zeros_like(anchors),
           tiles.zero_grads(pure, anchors, columns))
  _, danchors, (dcolumns, dparams, dconsts) = jax.lax.fori_loop(
      0, jax.lax.axis_size(axis_name), hop, carry)
  return (danchors, None, blockwise.Candidates(dcolumns, None, None), dparams, None, dconsts)


_ring_lse.defvjp(_ring_lse_fwd, _ring_lse_bwd)


def _gathered_lse(rows: blockwise.Layout, mapping, axis_name, block_size):
  columns = blockwise.Candidates(
      *(jax.lax.all_gather(x, axis_name, tiled=True) for x in rows.columns))
  if block_size is not None:
    return blockwise.logsumexp_of_mapped(
        rows.anchors, columns, excluded_ids=rows.excluded_ids, mapping=mapping,
        block_size=block_size)
  logits = mapping(rows.anchors @ columns.vectors.T)
  return losses._masked_logsumexp(logits, tiles.candidate_mask(rows.excluded_ids, columns))


def _ring_logsumexp(rows: blockwise.Layout, mapping, axis_name, block_size):
  tile, anchors, excluded_ids, columns = blockwise.padded_blocks(
      rows.anchors, rows.excluded_ids, rows.columns, block_size)
  pure = tiles.pure_mapping(mapping, tile_shape=tile, like=rows.anchors)
  lse = _ring_lse(pure.fn, axis_name, *tile, anchors, excluded_ids, columns, pure.params,
                  pure.step, pure.consts)
  return lse[:rows.anchors.shape[0]]


def sharded_info_nce(
    z1: jax.typing.ArrayLike,
    z2: jax.typing.ArrayLike,
    *,
    mapping=None,
    negatives: str = "cross",
    axis_name: str = "data",
    strategy: str = "all_gather",
    block_size: int | None = None,
    where: jax.typing.ArrayLike | None = None,
    reduction: str = "mean",
) -> jax.Array:
  r"""InfoNCE over the global batch, called inside `jax.shard_map` on each device's pairs.

  Device `p` holds rows `z1_p, z2_p` (`[n, D]`, `n = N / P`); anchors are its own rows,
  candidates the rows of every device (Eq. 1, or Eq. 11 with the default mapping), so the
  result equals `losses.info_nce` on the concatenated batch, and the gradient of each
  device's embeddings equals its slice of the single-device gradient.

  * `strategy="all_gather"`: gather all candidates (`[N or 2N, D]` per device), then a
    dense (`block_size=None`) or blockwise logsumexp; the gather's transpose (a reduce-
    scatter) returns the candidates' gradients to their owners.
  * `strategy="ring"`: candidate blocks travel round the ring with `lax.ppermute`, `P` hops;
    an online logsumexp folds each in, and the custom backward sends each block's gradient
    round with it. Memory O(n D) per device (plus one tile), never the gathered batch.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from tfcl_jax import distributed, losses
    >>> mesh = jax.sharding.Mesh(jax.devices(), ("data",))  # 1, 2, 4 or 8 devices
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 4))
    >>> z2 = jax.random.normal(jax.random.key(1), (8, 4))
    >>> loss_fn = jax.shard_map(
    ...     lambda a, b: distributed.sharded_info_nce(a, b, strategy="ring"),
    ...     mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P())
    >>> bool(jnp.allclose(loss_fn(z1, z2), losses.info_nce(z1, z2), atol=1e-5))
    True

  Args:
    z1: `[n, D]` float, this device's first-view embeddings.
    z2: `[n, D]` float, this device's second-view embeddings (row i the positive of `z1[i]`).
    mapping: `cos -> logits` (a `tfcl_jax.mappings.Mapping`); default temperature-free.
    negatives: `"cross"` or `"all"` as in `losses.info_nce`, over the global batch.
    axis_name: the mesh axis the batch is split over; must be bound by `shard_map`.
    strategy: `"all_gather"` or `"ring"`.
    block_size: `None` or an int > 0: tile side of the blockwise logsumexp (for `"ring"`,
      `None` means one tile per hop, `[n, n]` or `[2n, 2n]`).
    where: optional `[n]` bool mask of this device's valid pairs.
    reduction: `"mean"` (global mean over valid anchors, the same on every device), `"sum"`
      (global sum), or `"none"` (this device's per-row losses: `[n]`, or `[2n]` as `z1` rows
      then `z2` rows).

  Returns:
    A scalar (mean, sum) or this device's per-row losses.
  """
  size = _axis_size(axis_name)
  z1 = _checks.float_matrix(z1, name="z1")
  z2 = _checks.float_matrix(z2, name="z2")
  if z1.shape != z2.shape:
    raise ValueError(f"z1 and z2 must have the same shape [n, D], got {z1.shape} and {z2.shape}.")
  _checks.one_of(negatives, ("cross", "all"), name="negatives")
  _checks.one_of(strategy, STRATEGIES, name="strategy")
  _checks.one_of(reduction, ("mean", "sum", "none"), name="reduction")
  block_size = blockwise.check_block_size(block_size)
  mapping = losses._check_mapping(mappings_lib.temperature_free() if mapping is None else mapping)
  n = z1.shape[0]
  if n * size < 2:
    raise ValueError(f"the global batch needs N >= 2 pairs to have a negative, got N = {n * size}.")
  valid = losses._check_where(where, n)

  dtype = _checks.compute_dtype(z1.dtype, z2.dtype)
  u1 = losses.l2_normalize(z1.astype(dtype), eps=losses.norm_floor(z1.dtype))
  u2 = losses.l2_normalize(z2.astype(dtype), eps=losses.norm_floor(z2.dtype))
  rows_per_device = n if negatives == "cross" else 2 * n
  offset = jax.lax.axis_index(axis_name) * rows_per_device
  rows = blockwise.layout(u1, u2, negatives=negatives, valid=valid, offset=offset)
  if strategy == "ring":
    lse = _ring_logsumexp(rows, mapping, axis_name, block_size)
  else:
    lse = _gathered_lse(rows, mapping, axis_name, block_size)
  # lse runs over the negatives only: softplus keeps small losses exact (as losses.info_nce).
  positive = blockwise.positive_logits(mapping, rows.anchors, rows.positives)
  per_row = jax.nn.softplus(lse - positive)
  if rows.anchor_valid is not None:
    per_row = jnp.where(rows.anchor_valid, per_row, 0.0)
  if reduction == "none":
    return per_row
  total = jax.lax.psum(jnp.sum(per_row), axis_name)
  if reduction == "sum":
    return total
  if rows.anchor_valid is None:
    return total / (rows_per_device * size)
  return total / jnp.maximum(jax.lax.psum(jnp.sum(rows.anchor_valid), axis_name), 1)


def info_nce_on_mesh(
    z1: jax.typing.ArrayLike,
    z2: jax.typing.ArrayLike,
    *,
    mesh: jax.sharding.Mesh,
    axis_name: str = "data",
    where: jax.typing.ArrayLike | None = None,
    reduction: str = "mean",
    **kwargs,
) -> jax.Array:
  """`sharded_info_nce` on global `[N, D]` arrays: splits the batch over `mesh[axis_name]`.

  A convenience wrapper that builds the `jax.shard_map`; differentiate through it as
  through `losses.info_nce`. `reduction="none"` returns the global per-row losses in the
  order of `losses.info_nce`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import distributed, losses
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))  # 1, 2, 4 or 8 devices
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 4))
    >>> z2 = jax.random.normal(jax.random.key(1), (8, 4))
    >>> loss = distributed.info_nce_on_mesh(z1, z2, mesh=mesh, negatives="all",
    ...     strategy="all_gather")
    >>> bool(jnp.allclose(loss, losses.info_nce(z1, z2, negatives="all"), atol=1e-5))
    True

  Args:
    z1: `[N, D]` float, first view; `N` divisible by the number of devices on `axis_name`.
    z2: `[N, D]` float, second view.
    mesh: a `jax.sharding.Mesh` with an axis `axis_name`.
    axis_name: the mesh axis to split the batch over.
    where: optional `[N]` bool mask of valid pairs.
    reduction: `"mean"`, `"sum"` or `"none"`.
    **kwargs: `mapping`, `negatives`, `strategy`, `block_size` of `sharded_info_nce`.

  Returns:
    The loss (scalar) or the `[N]` / `[2N]` per-row losses.
  """
  if axis_name not in mesh.axis_names:
    raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh {mesh.axis_names}.")
  z1 = _checks.float_matrix(z1, name="z1")
  z2 = _checks.float_matrix(z2, name="z2")
  size = mesh.shape[axis_name]
  if z1.shape[0] % size:
    raise ValueError(
        f"z1 and z2 must have a batch divisible by the {size} devices of axis {axis_name!r}, "
        f"got N = {z1.shape[0]}.")
  batch = PartitionSpec(axis_name)
  where = None if where is None else losses._check_where(where, z1.shape[0])

  def local(a, b, mask):
    return sharded_info_nce(a, b, axis_name=axis_name, where=mask, reduction=reduction, **kwargs)

  axis_types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
  if axis_types[axis_name] == jax.sharding.AxisType.Explicit:
    # Explicit-sharding meshes (`jax.make_mesh`'s default) want inputs already split.
    sharding = jax.sharding.NamedSharding(mesh, batch)
    z1, z2, where = jax.tree.map(lambda x: jax.reshard(x, sharding), (z1, z2, where))
  out_specs = batch if reduction == "none" else PartitionSpec()
  result = jax.shard_map(local, mesh=mesh, in_specs=(batch, batch, batch), out_specs=out_specs)(
      z1, z2, where)
  if reduction == "none" and kwargs.get("negatives", "cross") == "all":
    # Per device: its z1 rows then its z2 rows; reorder to all z1 rows, then all z2 rows.
    result = result.reshape(size, 2, -1).transpose(1, 0, 2).reshape(-1)
  return result
