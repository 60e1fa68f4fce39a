r"""A batch-scaled mapping inside a loss (`mappings.BatchScaled`): its scale solved from the loss's
own batch, and handed to the tiles (the one parameter of the tiles' mapping, or a per-anchor
`Side.scale`).

The solve is one forward-only pass of `ScaleMoments` over the loss's similarity matrix through the
loss's own tile reduction (`tile_reduce`, or the devices' all-gather / ring `device_reduce`: the
loss's `Devices`), the bank included, under `stop_gradient`; each anchor's positive is then merged
in analytically (`l_{i,i+} = 2 artanh(cos_{i,i+})`), and the scale solved on the grid
(`_solves`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import cast

import jax
import jax.numpy as jnp

from tfcl_jax import mappings
from tfcl_jax.losses._engine import _arguments, _layout, _moments
from tfcl_jax.losses._engine._devices import ONE_DEVICE, Devices, sum_over_anchors
from tfcl_jax.losses._engine._solves import accuracy_scale, calibrated_scale, perplexity_scale
from tfcl_jax.losses._engine._sums import PositiveSum
from tfcl_jax.losses._engine._tiled import tile_reduce
from tfcl_jax.losses._engine._tiles import (
  MappingArgs,
  Side,
  TileMapping,
  TileReduction,
  mask,
  stats_dtype,
)

_FREE = mappings.temperature_free()


@dataclasses.dataclass(frozen=True)
class _ScaleParameter(mappings.MappingFunction):
  """`params["scale"] 2 artanh(c)`: a solved global scale as the losses hand it to their tiles,
  a parameter, as a learnt scale is (the engine's custom VJP and the fused kernels take it; a
  closed-over value inside `shard_map` would vary unlike the tiles'). It takes no gradient: the
  losses stop it. `free`: Eq. 11 as the free mapping computes it, or in its kernel form."""

  free: mappings.MappingFunction = _FREE.fn

  def __call__(self, cos, params, step):
    return jnp.asarray(params["scale"], cos.dtype) * self.free(cos, {}, step)

  def kernel_form(self) -> mappings.MappingFunction:
    return _ScaleParameter(self.free.kernel_form())


def with_scale_parameter(mapping: mappings.Mapping, scale: jax.Array) -> mappings.Mapping:
  """`mapping`'s `s 2 artanh(c)` with `s = scale` (a scalar) as its parameter `"scale"`."""
  return mappings.Mapping(mapping.spec, _ScaleParameter(), {"scale": scale}, bound=True)


def anchor_scale(layout: _layout.Layout) -> jax.Array | None:
  """`[M]` the per-anchor scales of the loss's anchors in its order, or None (`Side.scale`)."""
  if layout.kind == "rows_and_columns":
    assert layout.columns is not None  # the two-tower kind has a column side
    if layout.rows.scale is None:
      return None
    assert layout.columns.scale is not None  # set together by `with_anchor_scale`
    return jnp.concatenate([layout.rows.scale, layout.columns.scale])
  return layout.rows.scale


def with_anchor_scale(layout: _layout.Layout, scale: jax.Array) -> _layout.Layout:
  """`layout` whose anchors carry `scale [M]` (rows, then columns for the two-tower loss)."""
  if layout.kind == "rows_and_columns":
    assert layout.columns is not None  # the two-tower kind has a column side
    n = layout.rows.ids.shape[0]
    return layout._replace(rows=layout.rows._replace(scale=scale[:n]),
                           columns=layout.columns._replace(scale=scale[n:]))
  return layout._replace(rows=layout.rows._replace(scale=scale))


def _constant(side: Side) -> Side:
  return jax.tree.map(jax.lax.stop_gradient, side)


def _negatives(layout: _layout.Layout, bank: Side | None, *, bias: bool, reduce_fn,
               block_size) -> tuple[_moments.Moments, jax.Array]:
  """Each anchor's moments over its negatives (in-batch, then the bank), in the loss's anchor
  order, and the shift taken off the candidates' bias (0 without one): the largest valid bias
  (of either direction's candidates in CLIP's symmetric loss), so that every weight
  `exp(s (l - m) + b - shift)` is at most 1. Without `bias` the candidates' bias is dropped."""
  rows = _constant(layout.rows)
  columns = None if layout.columns is None else _constant(layout.columns)
  shift = jnp.zeros((), rows.vectors.dtype)
  biased = [side for side in (rows, columns) if side is not None and side.bias is not None]
  if biased and bias:  # one shift for both directions of CLIP's symmetric loss
    top = jnp.max(jnp.stack([jnp.max(jnp.where(side.valid, cast(jax.Array, side.bias), -jnp.inf))
                             for side in biased]))
    shift = jnp.where(jnp.isfinite(top), top, 0.0)

  def shifted(side: Side) -> Side:
    if side.bias is None:
      return side
    return side._replace(bias=side.bias - shift if bias else None)

  rows, columns = shifted(rows), None if columns is None else shifted(columns)
  moments = _moments.ScaleMoments()
  row_out, col_out = reduce_fn(rows, columns, mapping=_FREE, kind=layout.kind,
                               block_size=block_size, tile_reduction=moments)
  found = [_moments.unpack(row_out)] + ([] if col_out is None else [_moments.unpack(col_out)])
  if bank is not None:
    anchors = [rows] + ([] if columns is None or col_out is None else [columns])
    found = [_moments.merge(part, _moments.unpack(tile_reduce(
        side, _constant(bank), mapping=_FREE, kind="rows", block_size=block_size,
        column_grad=False, tile_reduction=moments)[0])) for part, side in zip(
            found, anchors, strict=True)]
  return jax.tree.map(lambda *parts: jnp.concatenate(parts), *found), shift


def solve(target: str, layout: _layout.Layout, *, bank: Side | None = None,
          positive_bias: jax.Array | None = None, block_size=None,
          devices: Devices = ONE_DEVICE) -> jax.Array:
  """The scale of `target` (`mappings.BatchScaled.target`) for the loss's anchors on its
  `devices`: a scalar, or `[M]` for `"perplexity"`; the candidate bias enters the softmax for
  `"calibrated"` only."""
  with_bias = target == "calibrated" and positive_bias is not None
  negatives, shift = _negatives(layout, bank, bias=with_bias, reduce_fn=devices.reduce_fn,
                                block_size=block_size)
  positive = _FREE(jax.lax.stop_gradient(layout.positive_cos))
  own_bias = None
  if with_bias and positive_bias is not None:  # one direction of `cross`: the rows' positives
    own_bias = jax.lax.stop_gradient(positive_bias) - shift
  moments = _moments.merge(negatives, _moments.single(positive, own_bias))
  correct = positive > negatives.top  # accuracy: the positive strictly above every negative
  return _scale(target, devices.total, moments, positive, correct, _layout.anchor_valid(layout))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _scale(target: str, total, moments: _moments.Moments, positive: jax.Array,
           correct: jax.Array, valid: jax.Array) -> jax.Array:
  """The scale of `target` from every anchor's moments (its positive among them): one program,
  also where the loss runs op by op."""
  grid = _moments.grid_moments(moments)
  if target == "calibrated":
    scale = calibrated_scale(grid, positive, valid, total=total)
  elif target == "perplexity":
    scale = perplexity_scale(grid, valid)
  else:
    scale = accuracy_scale(grid, correct, valid, total=total)
  return jax.lax.stop_gradient(scale)


def _count(layout: _layout.Layout) -> int:
  return layout.positive_cos.shape[0]


def check_scale(fn: mappings.BatchScaled, scale: jax.Array, anchors: int, *, what: str
                ) -> jax.Array:
  """A bound per-anchor scale checked against the loss's `anchors`."""
  if fn.per_anchor and scale.shape != (anchors,):
    raise ValueError(
        f"the scale bound to {fn.target}_free must have shape ({anchors},), one per anchor of "
        f"this loss ({what}), got shape {scale.shape}; losses.batch_scale with the loss's "
        f"arguments returns it in that order.")
  return jax.lax.stop_gradient(scale)


def solve_batch(fn: mappings.BatchScaled, batch, *, devices: Devices = ONE_DEVICE
                ) -> jax.Array:
  """`fn`'s scale on a loss's `batch` (`_batch.Batch`) on its `devices`: the bound one checked,
  else solved (`solve`)."""
  if fn.scale is not None:
    return check_scale(fn, fn.scale, batch.layout.positive_cos.shape[0],
                       what="the loss's anchors")
  return solve(fn.target, batch.layout, bank=batch.bank, positive_bias=batch.bias,
               block_size=batch.block_size, devices=devices)


def supervised_scale(fn: mappings.BatchScaled, z, labels, *, block_size=None) -> jax.Array:
  """`fn`'s scale on the supervised batch `z [B, D]`, `labels [B]` (`supervised_batch_scale`),
  the arguments checked."""
  z = _arguments.check_embeddings(z, name="z", rows="B")
  labels = jnp.asarray(labels)
  if not jnp.issubdtype(labels.dtype, jnp.integer) or labels.shape != z.shape[:1]:
    raise ValueError(f"labels must be [B] = ({z.shape[0]},) integers, got shape {labels.shape} "
                     f"and dtype {labels.dtype}.")
  block_size = _arguments.check_block_size(block_size)
  if fn.scale is not None:
    return check_scale(fn, fn.scale, z.shape[0], what="one per row of z")
  rows = _layout.operand_rows(z, _layout.operand_dtype(z.dtype))
  return supervised_solve(fn.target, rows, labels, block_size=block_size)


def for_loss(mapping: mappings.Mapping, layout: _layout.Layout, **solve_kwargs
             ) -> tuple[mappings.Mapping, _layout.Layout, jax.Array | None]:
  """`(mapping, layout, scale)` for the tiles: a global scale `s` as the mapping's one parameter
  (`s 2 artanh(c)`), a per-anchor one on the anchors' sides with the free mapping; anything else
  as it is, its scale None. Unbound, the scale is solved (`solve`, `solve_kwargs`: the loss's
  bank, positive bias, block size and devices); it takes no gradient. `scale` is what the loss
  reports (`Evaluation.scale`): the solved or bound scale, as `solve` gives it."""
  fn = mapping.fn
  if not isinstance(fn, mappings.BatchScaled):
    return mapping, layout, None
  if fn.scale is None:
    scale = solve(fn.target, layout, **solve_kwargs)
  else:
    scale = check_scale(fn, fn.scale, _count(layout),
                        what="N rows for one direction, 2N for CLIP's loss and for 'all'")
  if fn.per_anchor:
    return _FREE, with_anchor_scale(layout, scale.astype(layout.rows.vectors.dtype)), scale
  return with_scale_parameter(mapping, scale), layout, scale


@dataclasses.dataclass(frozen=True)
class _NegativeTop(TileReduction):
  """`max_j l_ij` over each row's candidates of other labels (`mask` of a side whose ids are
  the labels); forward-only, like `ScaleMoments`."""

  def fast_form(self, mapping, dtype):
    return None

  def init(self, num: int, dtype, tile_mapping: TileMapping):
    return (jnp.full((num,), -jnp.inf, dtype),)

  def finish(self, stats) -> jax.Array:
    return stats[0]

  def forward(self, tile_mapping: TileMapping, args: MappingArgs, a: Side, b: Side, row_stats,
              col_stats, use_cols):
    logits = tile_mapping.fn(a.vectors @ b.vectors.T, args.params, args.step, *args.consts)
    logits = jnp.where(mask(a, b), logits, -jnp.inf)
    row_stats = (jnp.maximum(row_stats[0], jnp.max(logits, axis=1)),)
    if use_cols is not None:
      col_stats = (jnp.where(use_cols, jnp.maximum(col_stats[0], jnp.max(logits, axis=0)),
                             col_stats[0]),)
    return row_stats, col_stats

  def backward(self, tile_mapping, args, a, b, row_out, row_g, col_out, col_g):
    raise NotImplementedError("forward-only: call it under jax.lax.stop_gradient.")


def supervised_solve(target: str, u: jax.Array, labels: jax.Array, *, block_size
                     ) -> jax.Array:
  """The scale of `target` for `supervised_info_nce` on its rows `u` (`_layout.operand_rows`):
  every row an anchor, its candidates every other row; `calibrated` takes the mean of its
  positives' logits as its positive's (SupCon's `L_out`), `accuracy` counts it correct when its
  best candidate shares its label; the global ones average over the anchors with a positive."""
  u = jax.lax.stop_gradient(u)
  dtype = stats_dtype(u)
  n = u.shape[0]
  ids = jnp.arange(n, dtype=jnp.int32)
  labels = labels.astype(jnp.int32)
  valid = jnp.ones((n,), bool)

  def run(side, tile_reduction):
    return tile_reduce(side, None, mapping=_FREE, kind="symmetric", block_size=block_size,
                       tile_reduction=tile_reduction)[0]

  every = _moments.unpack(run(Side(u, ids, ids, valid), _moments.ScaleMoments()))
  positive = correct = jnp.zeros((n,), dtype)
  if target != "perplexity":
    positives = jnp.sum(labels[:, None] == labels[None, :], axis=1) - 1  # O(B^2) ints, no D
    valid = positives > 0
  if target == "calibrated":
    positive_sum = run(Side(u, ids, labels, valid), PositiveSum())
    positive = positive_sum / jnp.maximum(positives, 1).astype(dtype)
  elif target == "accuracy":
    correct = every.top > run(Side(u, labels, labels, jnp.ones((n,), bool)), _NegativeTop())
  return _scale(target, sum_over_anchors, every, positive, correct, valid)


def supervised_for_loss(mapping: mappings.Mapping, u: jax.Array, labels: jax.Array, *,
                        block_size
                        ) -> tuple[mappings.Mapping, jax.Array | None, jax.Array | None]:
  """`(mapping bound to its scale, the per-anchor scale or None, the scale the loss reports)` for
  `supervised_info_nce`; anything but a batch-scaled mapping as it is (no scale)."""
  fn = mapping.fn
  if not isinstance(fn, mappings.BatchScaled):
    return mapping, None, None
  if fn.scale is None:
    solved = supervised_solve(fn.target, u, labels, block_size=block_size)
  else:
    solved = check_scale(fn, fn.scale, u.shape[0], what="one per row of z")
  scale = solved.astype(stats_dtype(u))
  if fn.per_anchor:  # the dense form calls the mapping on [B, B] cosines: rows are anchors
    return mapping.bind(scale=scale), scale, solved
  return with_scale_parameter(mapping, scale), None, solved
