"""InfoNCE and the sigmoid loss with candidates from every device (`_devices`: all-gather or a
ring of `ppermute`).

Each device holds `N / P` pairs of the global batch; each loss equals its single-device loss
of the whole batch (Eq. 1 / 11; SigLIP's), and so do the gradients of each device's
embeddings. Both strategies reuse the single-device layout and tiles; both losses lay out a
device's share of the batch the same way (`_local_layout`).
"""

from __future__ import annotations

import functools

import jax

from tfcl_jax import _checks, mappings
from tfcl_jax.losses import _sigmoid
from tfcl_jax.losses._engine import _arguments, _calibration, _layout
from tfcl_jax.losses._engine._devices import (
  STRATEGIES,
  axis_size,
  device_reduce,
  on_mesh,
  reduce_across_devices,
)
from tfcl_jax.losses._engine._sums import SigmoidSum
from tfcl_jax.losses._info_nce import Batch, negatives_lse, row_losses


def sharded_info_nce(
    z1: jax.typing.ArrayLike,
    z2: jax.typing.ArrayLike,
    *,
    mapping: mappings.MappingLike | None = None,
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
    >>> loss_fn = jax.jit(jax.shard_map(
    ...     lambda a, b: losses.sharded_info_nce(a, b, strategy="ring", symmetric=True),
    ...     mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P()))
    >>> expected = losses.info_nce(z1, z2, symmetric=True)
    >>> bool(jnp.allclose(loss_fn(z1, z2), expected, atol=1e-5))
    True

  Args:
    z1: `[n, D]` float, this device's first-view embeddings.
    z2: `[n, D]` float, this device's second-view embeddings (row i the positive of `z1[i]`).
    mapping: `cos -> logits` (a `tfcl_jax.mappings.Mapping` or a mapping spec; `"free_n"` counts
      the global batch's candidates); default temperature-free. A batch-scaled mapping's
      global scale is solved over the global batch (its sums `psum`-ed), a per-anchor one
      for this device's anchors, each through the same `strategy`.
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
  _arguments.refuse_forward_mode(z1, z2, mapping, extra_negatives, loss="sharded_info_nce")
  batch = local_setup(z1, z2, mapping=mapping, negatives=negatives, symmetric=symmetric,
                      axis_name=axis_name, strategy=strategy, block_size=block_size,
                      where=where, reduction=reduction, extra_negatives=extra_negatives,
                      extra_where=extra_where)
  lse_fn = device_reduce(axis_name, strategy)
  mapping, rows = _calibration.for_loss(
      batch.mapping, batch.layout, bank=batch.bank, block_size=batch.block_size, reduce_fn=lse_fn,
      total=_calibration.total_across(axis_name))
  lse = negatives_lse(rows, mapping=mapping, block_size=batch.block_size, bank=batch.bank,
                      lse_fn=lse_fn)
  return reduce_across_devices(row_losses(rows, lse, mapping), _layout.anchor_valid(rows),
                               reduction=reduction, masked=where is not None,
                               axis_name=axis_name, size=axis_size(axis_name))


def local_setup(z1, z2, *, mapping, negatives: str, symmetric: bool, axis_name, strategy: str,
                block_size, where, reduction: str, extra_negatives, extra_where) -> Batch:
  """`sharded_info_nce`'s arguments checked and laid out on this device: `Batch` (no bias)."""
  size = axis_size(axis_name)
  z1, z2 = _arguments.check_pair(z1, z2, local=True)
  _arguments.check_mode(negatives, symmetric, reduction)
  _checks.one_of(strategy, STRATEGIES, name="strategy")
  block_size = _arguments.check_block_size(block_size)
  bank, bank_where = _arguments.check_extra(extra_negatives, extra_where, z1.shape[1])
  mapping = _arguments.loss_mapping(
      mapping, num_candidates=_layout.candidates_per_anchor(z1.shape[0] * size, negatives, bank),
      inputs=(z1, z2))
  rows = _local_layout(z1, z2, negatives=negatives, symmetric=symmetric, where=where,
                       axis_name=axis_name, size=size)
  bank = None if bank is None else _layout.bank_side(bank, bank_where, rows.rows.vectors.dtype)
  return Batch(z1, z2, mapping, rows, bank, None, block_size)


def _local_layout(z1, z2, *, negatives: str, symmetric: bool, where, axis_name,
                  size: int) -> _layout.Layout:
  """This device's `n` pairs laid out as its share of the global batch of `n * size` pairs
  (`_layout.layout`): ids offset by the device's index on `axis_name`."""
  n = z1.shape[0]
  if n * size < 2:
    raise ValueError(f"the global batch needs N >= 2 pairs to have a negative, got N = {n * size}.")
  valid = _arguments.check_where(where, n)
  rows_per_device = n if negatives == "cross" else 2 * n
  offset = jax.lax.axis_index(axis_name) * rows_per_device
  return _layout.layout(z1, z2, negatives=negatives, symmetric=symmetric, valid=valid,
                        offset=offset)


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
    >>> expected = jax.jit(jax.grad(lambda a: losses.info_nce(a, z2, negatives="all")))(z1)
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
  _arguments.refuse_forward_mode(z1, z2, kwargs.get("mapping"), extra_negatives,
                                 loss="info_nce_on_mesh")
  kwargs.update(where=where, reduction=reduction, extra_negatives=extra_negatives,
                extra_where=extra_where)
  return on_mesh(sharded_info_nce, z1, z2, mesh=mesh, axis_name=axis_name, **kwargs)


def sharded_sigmoid_loss(
    z1: jax.typing.ArrayLike,
    z2: jax.typing.ArrayLike,
    *,
    mapping: mappings.MappingLike | None = None,
    bias: float | jax.typing.ArrayLike = 0.0,
    relative_bias: float | jax.typing.ArrayLike | None = None,
    negatives: str = "cross",
    axis_name: str = "data",
    strategy: str = "ring",
    block_size: int | None = None,
    where: jax.typing.ArrayLike | None = None,
    reduction: str = "mean",
) -> jax.Array:
  """`sigmoid_loss` over the global batch, called inside `jax.shard_map` on each device's pairs.

  With `strategy="ring"` (the default) the candidates' blocks travel round the devices by
  `lax.ppermute` and every device scores its rows against each block as it passes: SigLIP's
  chunked form (open_clip's neighbour exchange), memory O(n D) per device, never the gathered
  batch. `"all_gather"` gathers the candidates first. The result equals `sigmoid_loss` on the
  concatenated batch, and each device's gradients its slice of the single-device ones.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from tfcl_jax import losses
    >>> mesh = jax.sharding.Mesh(jax.devices(), ("data",))
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 4))
    >>> z2 = jax.random.normal(jax.random.key(1), (8, 4))
    >>> loss_fn = jax.jit(jax.shard_map(lambda a, b: losses.sharded_sigmoid_loss(a, b, bias=-1.0),
    ...     mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P()))
    >>> bool(jnp.allclose(loss_fn(z1, z2), losses.sigmoid_loss(z1, z2, bias=-1.0), atol=1e-5))
    True

  Args:
    z1, z2: `[n, D]` float, this device's pairs.
    mapping, bias, relative_bias, negatives, block_size: as in `sigmoid_loss`.
    axis_name: the mesh axis the batch is split over; must be bound by `shard_map`.
    strategy: `"ring"` or `"all_gather"`.
    where: optional `[n]` bool mask of this device's valid pairs.
    reduction: `"mean"` (global), `"sum"` (global), or `"none"` (this device's rows).

  Returns:
    A scalar (mean, sum) or this device's per-row losses.
  """
  _arguments.refuse_forward_mode(z1, z2, mapping, bias, relative_bias,
                                 loss="sharded_sigmoid_loss")
  size = axis_size(axis_name, loss="sharded_sigmoid_loss", wrapper="sigmoid_loss_on_mesh")
  z1, z2, mapping, bias, relative_bias = _sigmoid.setup(
      z1, z2, mapping, bias, relative_bias, negatives, reduction, devices=size)
  _checks.one_of(strategy, STRATEGIES, name="strategy")
  block_size = _arguments.check_block_size(block_size)
  rows = _local_layout(z1, z2, negatives=negatives, symmetric=False, where=where,
                       axis_name=axis_name, size=size)
  reduce_fn = device_reduce(axis_name, strategy)
  calibrate = functools.partial(_calibration.for_loss, block_size=block_size,
                                reduce_fn=reduce_fn, total=_calibration.total_across(axis_name))
  mapping, rows = _sigmoid.with_bias(mapping, rows, bias, relative_bias, calibrate=calibrate)
  per_row, _ = reduce_fn(
      rows.rows, rows.columns, mapping=mapping, kind=rows.kind, block_size=block_size,
      tile_reduction=SigmoidSum())
  return reduce_across_devices(per_row, rows.rows.valid, reduction=reduction,
                               masked=where is not None, axis_name=axis_name, size=size)


def sigmoid_loss_on_mesh(z1: jax.typing.ArrayLike, z2: jax.typing.ArrayLike, *,
                         mesh: jax.sharding.Mesh, axis_name: str = "data",
                         where: jax.typing.ArrayLike | None = None, reduction: str = "mean",
                         **kwargs) -> jax.Array:
  """`sharded_sigmoid_loss` on global `[N, D]` arrays, split over `mesh[axis_name]`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 4))
    >>> z2 = jax.random.normal(jax.random.key(1), (8, 4))
    >>> loss = jax.jit(lambda a, b: losses.sigmoid_loss_on_mesh(a, b, mesh=mesh,
    ...                                                         negatives="all"))(z1, z2)
    >>> bool(jnp.allclose(loss, losses.sigmoid_loss(z1, z2, negatives="all"), atol=1e-5))
    True

  Args:
    z1, z2: `[N, D]` float views; `N` divisible by the devices on `axis_name`.
    mesh: a `jax.sharding.Mesh` with an axis `axis_name`.
    axis_name: the mesh axis to split the batch over.
    where: optional `[N]` bool mask of valid pairs.
    reduction: `"mean"`, `"sum"` or `"none"` (global per-row losses in `sigmoid_loss`'s order).
    **kwargs: `mapping`, `bias`, `relative_bias`, `negatives`, `strategy`, `block_size`.

  Returns:
    The loss or the global per-row losses.
  """
  _arguments.refuse_forward_mode(z1, z2, kwargs.get("mapping"), kwargs.get("bias"),
                                 kwargs.get("relative_bias"), loss="sigmoid_loss_on_mesh")
  return on_mesh(sharded_sigmoid_loss, z1, z2, mesh=mesh, axis_name=axis_name, where=where,
                 reduction=reduction, **kwargs)
