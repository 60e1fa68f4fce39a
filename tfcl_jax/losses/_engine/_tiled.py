"""The tiled core of every contrastive loss: a schedule of tiles and one custom VJP.

The `[M, K]` logits are never held: tiles of at most `[block, block]` are folded into per-row
(and per-column) statistics, and the backward pass recomputes each tile (FlashAttention,
Inf-CL). Three kinds of matrix:

* `"rows"`: anchors against candidates, statistics per anchor (InfoNCE `cross`, extra negatives);
* `"rows_and_columns"`: the same tiles also give every candidate column its statistics
  (CLIP's symmetric two-tower loss: both directions in one pass);
* `"symmetric"`: `S = U U^T` (InfoNCE `all`): each off-diagonal tile is computed once and used
  for its rows and, transposed, for its columns, forward and backward: half the work. On GPU
  and TPU the diagonal tiles run in a scan of their own: a diagonal tile's cotangent `G` gives
  its rows' gradient in one product, `(G + G^T) U_i`. On CPU they share the one scan, computed
  whole with their column shares masked (`_blocks.Tiling`: one product more per diagonal tile,
  one scan fewer).

Tile products take the sides' own dtype with float32 accumulation (`_tiles.cosines`,
`_tiles.weighted_rows`): raw 16-bit rows are normalised inside the custom VJP (their float32
inverse norms scale each product), and their gradient is carried through the normalisation in
float32 and rounded once (`_layout.through_norm`). Per tile of `b x b` rows of `D` entries: one
product forward, three backward (the cosines again, then the rows' and the columns' gradients);
a diagonal tile of `"symmetric"` in a scan of its own two backward.

Dense logits are the one-tile case.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import cast, overload

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax.losses._engine import _layout
from tfcl_jax.losses._engine._blocks import Tiling, balanced_tile, by_platform, scan_unroll
from tfcl_jax.losses._engine._pure import match_varying, pure_mapping
from tfcl_jax.losses._engine._tiles import (
  LogSumExp,
  MappingArgs,
  Side,
  TileMapping,
  TileReduction,
  is_raw,
  stats_dtype,
  weighted_rows,
)

KINDS = ("rows", "rows_and_columns", "symmetric")

@dataclasses.dataclass(frozen=True)
class Plan:
  """Static description of one tiled computation."""

  kind: str
  block_rows: int
  block_cols: int
  tile_mapping: TileMapping
  column_grad: bool = True  # False: candidates under stop_gradient (extra negatives)
  tile_reduction: TileReduction = LogSumExp()  # what a tile folds into per-row statistics
  unroll: int = 1  # tiles per step of the scans (`jax.lax.scan`'s unroll; `_blocks.scan_unroll`)
  # `"symmetric"` only: the diagonal tiles in a scan of their own (3 products each, the fewest),
  # or in the one scan with the rest (4 products each, one scan fewer; `_blocks.Tiling`).
  diagonal_apart: bool = True


def pad_side(side: Side, multiple: int) -> Side:
  """Pads `side` to a multiple of `multiple` rows with invalid zero rows."""
  extra = -side.vectors.shape[0] % multiple
  if extra == 0:
    return side
  return Side(jnp.pad(side.vectors, [(0, extra), (0, 0)]),
              jnp.pad(side.ids, (0, extra), constant_values=-1),
              jnp.pad(side.positive_ids, (0, extra), constant_values=-1),
              jnp.pad(side.valid, (0, extra), constant_values=False),
              None if side.bias is None else jnp.pad(side.bias, (0, extra)),
              # A padded row is no one's anchor; scale 1 keeps its masked logits at -inf.
              None if side.scale is None else jnp.pad(side.scale, (0, extra), constant_values=1),
              None if side.inverse_norm is None else jnp.pad(side.inverse_norm, (0, extra)))


def _blocks(side: Side, block: int) -> Side:
  return jax.tree.map(lambda x: x.reshape(-1, block, *x.shape[1:]), side)


def no_grad(side: Side | None, dvectors) -> Side | None:
  """The cotangent of `side`: `dvectors` for its vectors, zero for its bias and scale, None
  elsewhere."""
  if side is None:
    return None
  bias = None if side.bias is None else jnp.zeros_like(side.bias)
  scale = None if side.scale is None else jnp.zeros_like(side.scale)
  return Side(dvectors, None, None, None, bias, scale)  # pyright: ignore[reportArgumentType]


def has_scale(rows: Side, columns: Side | None) -> bool:
  """Whether either side carries a per-anchor scale (`Side.scale`)."""
  return rows.scale is not None or (columns is not None and columns.scale is not None)


# How a scan's tiles use their columns: not at all (no column side, or the diagonal tiles of
# `"symmetric"` apart: a diagonal tile's columns are its own rows), always, or off the diagonal
# only (`"symmetric"` in one scan: the diagonal tiles' column shares masked).
_OFF_DIAGONAL = "off_diagonal"


def _pairs(kind: str, num_row_blocks: int, num_col_blocks: int, diagonal_apart: bool = True
           ) -> list[tuple[np.ndarray, np.ndarray, bool | str | None]]:
  """The tiles in scan order, as scans: `(row blocks, column blocks, use_cols)` per scan, two
  int32 vectors and whether the tiles feed their columns' statistics (None: no column side;
  `_OFF_DIAGONAL`: where the row and column blocks differ). `"symmetric"` has two scans, the
  diagonal tiles (rows only: a diagonal tile's columns are its own rows), then the tiles above
  the diagonal, each serving its rows and its columns; or, unless `diagonal_apart`, one scan of
  the tiles on and above the diagonal."""
  if kind == "symmetric" and not diagonal_apart:
    rows, cols = np.array([(i, j) for i in range(num_row_blocks)
                           for j in range(i, num_row_blocks)], np.int32).T
    return [(rows, cols, _OFF_DIAGONAL)]
  if kind == "symmetric":
    diagonal = np.arange(num_row_blocks, dtype=np.int32)
    above = [(i, j) for i in range(num_row_blocks) for j in range(i + 1, num_row_blocks)]
    scans: list[tuple[np.ndarray, np.ndarray, bool | str | None]] = [(diagonal, diagonal, None)]
    if above:
      rows, cols = np.array(above, np.int32).T
      scans.append((rows, cols, True))
    return scans
  pairs = [(i, j) for i in range(num_row_blocks) for j in range(num_col_blocks)]
  rows, cols = np.array(pairs, np.int32).T
  return [(rows, cols, None if kind == "rows" else True)]


# Block `index` (a traced scalar, always in range) of stacked blocks. Reads are dynamic slices:
# `x[index]` would give the same block through jnp indexing, whose tracing is most of the
# engine's. Writes stay scatters: XLA:CPU updates the scan's carry in place (a dynamic update
# slice of a slice plus the tile measured a fifth slower for negatives="all", N = 4096).
def _get(blocks, index):
  return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, index, keepdims=False), blocks)


def _set(stacked, index, value):
  return jax.tree.map(lambda s, v: s.at[index].set(v), stacked, value)


def accumulate(plan: Plan, args: MappingArgs, rows: Side, columns: Side, row_stats, col_stats):
  """Folds every tile of `rows x columns` into the statistics (shapes multiples of the blocks).

  `col_stats` is None for `"rows"`; for `"symmetric"`, `columns` is `rows` and the column
  statistics are the row statistics.
  """
  row_blocks = _blocks(rows, plan.block_rows)
  col_blocks = _blocks(columns, plan.block_cols)
  symmetric = plan.kind == "symmetric"
  # Statistics are `[num, ...]` per row: blocks of rows, any trailing axes kept.
  row_stats = jax.tree.map(lambda x: x.reshape(-1, plan.block_rows, *x.shape[1:]), row_stats)
  if symmetric:
    col_stats = None
  elif col_stats is not None:
    col_stats = jax.tree.map(lambda x: x.reshape(-1, plan.block_cols, *x.shape[1:]), col_stats)

  for row_index, col_index, use_cols in _pairs(plan.kind, row_blocks.ids.shape[0],
                                               col_blocks.ids.shape[0], plan.diagonal_apart):

    def step(carry, pair, use_cols=use_cols):
      row_stats, col_stats = carry
      i, j = pair
      used = None if use_cols is None else (
          i != j if use_cols == _OFF_DIAGONAL else jnp.bool_(use_cols))
      columns_stats = None
      if used is not None:
        columns_stats = _get(row_stats if symmetric else col_stats, j)
      new_rows, new_cols = plan.tile_reduction.forward(
          plan.tile_mapping, args, _get(row_blocks, i), _get(col_blocks, j), _get(row_stats, i),
          columns_stats, used)
      row_stats = _set(row_stats, i, new_rows)
      if used is not None and symmetric:  # block j's rows are the columns
        if use_cols == _OFF_DIAGONAL:  # on the diagonal `new_cols` is block i's old statistics
          new_cols = jax.tree.map(lambda new, now: jnp.where(used, new, now), new_cols,
                                  _get(row_stats, j))
        row_stats = _set(row_stats, j, new_cols)
      elif used is not None:
        col_stats = _set(col_stats, j, new_cols)
      return (row_stats, col_stats), None

    (row_stats, col_stats), _ = jax.lax.scan(step, (row_stats, col_stats),
                                             (row_index, col_index), unroll=plan.unroll)
  flat = lambda stats: jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), stats)  # noqa: E731
  return flat(row_stats), None if col_stats is None else flat(col_stats)


def accumulate_grads(plan: Plan, args: MappingArgs, rows: Side, columns: Side, row_out, row_g,
                     col_out, col_g, grads):
  """Adds the gradients of `sum_i g_i out_i (+ sum_j g'_j out'_j)` over every tile.

  `row_out`, `col_out` are the reduction's finished outputs (InfoNCE's logsumexp).

  `grads = (drows [M, D], dcolumns [K, D] or None, dparams, dconsts)`, `drows` and `dcolumns`
  the gradients of the sides' unit rows, in float32 at least (`_tiles.weighted_rows`); for
  `"symmetric"` the column gradients go into `drows`.
  """
  row_blocks = _blocks(rows, plan.block_rows)
  col_blocks = _blocks(columns, plan.block_cols)
  symmetric = plan.kind == "symmetric"
  by_rows = lambda x: x.reshape(-1, plan.block_rows, *x.shape[1:])  # noqa: E731
  by_cols = lambda x: x.reshape(-1, plan.block_cols, *x.shape[1:])  # noqa: E731
  row_out, row_g = by_rows(row_out), by_rows(row_g)
  if symmetric:
    col_out, col_g = row_out, row_g
  elif plan.kind == "rows_and_columns":
    col_out, col_g = by_cols(col_out), by_cols(col_g)
  drows, dcols, dparams, dconsts = grads
  drows = by_rows(drows)
  dcols = None if dcols is None else by_cols(dcols)

  for row_index, col_index, use_cols in _pairs(plan.kind, row_blocks.ids.shape[0],
                                               col_blocks.ids.shape[0], plan.diagonal_apart):
    diagonal = symmetric and use_cols is None

    def step(carry, pair, use_cols=use_cols, diagonal=diagonal):
      drows, dcols, dparams, dconsts = carry
      i, j = pair
      a, b = _get(row_blocks, i), _get(col_blocks, j)
      if use_cols is None:  # no column side, or a diagonal tile: the columns take no share
        c_out = jnp.zeros((plan.block_cols,), row_out.dtype)
        c_g = c_out
      elif use_cols == _OFF_DIAGONAL:  # a diagonal tile's columns take no share
        c_out, c_g = _get(col_out, j), jnp.where(i != j, _get(col_g, j), 0.0)
      else:
        c_out, c_g = _get(col_out, j), _get(col_g, j)
      dcos, dp, dk = plan.tile_reduction.backward(plan.tile_mapping, args, a, b,
                                                  _get(row_out, i), _get(row_g, i), c_out, c_g)
      if diagonal:  # b is a: the rows' and the columns' gradients in one product
        drows = drows.at[i].add(weighted_rows(dcos + dcos.T, a))
      else:
        drows = drows.at[i].add(weighted_rows(dcos, b))
        if symmetric:
          drows = drows.at[j].add(weighted_rows(dcos.T, a))
        elif dcols is not None:
          dcols = dcols.at[j].add(weighted_rows(dcos.T, a))
      dparams = jax.tree.map(jnp.add, dparams, dp)
      dconsts = tuple(x + y for x, y in zip(dconsts, dk, strict=True))
      return (drows, dcols, dparams, dconsts), None

    (drows, dcols, dparams, dconsts), _ = jax.lax.scan(
        step, (drows, dcols, dparams, dconsts), (row_index, col_index), unroll=plan.unroll)
  return (drows.reshape(-1, drows.shape[-1]),
          None if dcols is None else dcols.reshape(-1, dcols.shape[-1]), dparams, dconsts)


def init_stats(plan: Plan, rows: Side, columns: Side | None):
  dtype = stats_dtype(rows.vectors)
  row_stats = plan.tile_reduction.init(rows.ids.shape[0], dtype, plan.tile_mapping)
  col_stats = None
  if plan.kind == "rows_and_columns":
    assert columns is not None, "the two-tower kind has a column side"
    col_stats = plan.tile_reduction.init(columns.ids.shape[0], dtype, plan.tile_mapping)
  return row_stats, col_stats


def zero_grads(plan: Plan, args: MappingArgs, rows: Side, columns: Side | None):
  dcols = None
  if plan.kind != "symmetric" and plan.column_grad:
    assert columns is not None, "only the symmetric kind has no column side"
    dcols = jnp.zeros(columns.vectors.shape, stats_dtype(columns.vectors))
  return (jnp.zeros(rows.vectors.shape, stats_dtype(rows.vectors)), dcols,
          jax.tree.map(jnp.zeros_like, args.params), tuple(jnp.zeros_like(k) for k in args.consts))


@overload
def with_inverse_norms(side: Side) -> Side: ...
@overload
def with_inverse_norms(side: None) -> None: ...
def with_inverse_norms(side: Side | None) -> Side | None:
  """`side` with the float32 inverse norms of its raw rows (`Side.inverse_norm`), which scale
  every tile product; unit rows as they are."""
  if side is None or not is_raw(side.vectors):
    return side
  return side._replace(inverse_norm=_layout.inverse_norms(side.vectors))


def side_grad(side: Side | None, unit_grad) -> Side | None:
  """`no_grad` of `side` with the gradient of its unit rows carried to its vectors
  (`_layout.through_norm`: raw rows through their normalisation, rounded once)."""
  if side is None or unit_grad is None:
    return no_grad(side, unit_grad)
  return no_grad(side, _layout.through_norm(side.vectors, unit_grad))


def saving_inputs(primal, num_static: int = 1):
  """The forward rule of a custom VJP whose backward recomputes every tile: `primal`'s outputs,
  with its inputs after the `num_static` static ones (`nondiff_argnums`) and its outputs as the
  residuals, `(*inputs, outputs)`.

  It runs the function `primal` wraps (`__wrapped__`), not the custom VJP itself: under
  forward-over-reverse (`jax.jvp` of `jax.grad`, `jax.hessian`) JAX differentiates the forward
  rule and the backward in forward mode, which a custom VJP refuses; the plain function and the
  backward take it. Reverse mode runs the same computation either way.
  """
  function = getattr(primal, "__wrapped__", primal)

  def forward(*args):
    out = function(*args)
    return out, (*args[num_static:], out)

  return forward


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _reduce(plan: Plan, rows: Side, columns: Side | None, args: MappingArgs):
  rows, columns = with_inverse_norms(rows), with_inverse_norms(columns)
  stats = match_varying(init_stats(plan, rows, columns), rows.vectors)
  row_stats, col_stats = accumulate(plan, args, rows, rows if columns is None else columns,
                                    *stats)
  finish = plan.tile_reduction.finish
  return finish(row_stats), None if col_stats is None else finish(col_stats)


def _reduce_bwd(plan, residuals, cotangents):
  rows, columns, args, (row_out, col_out) = residuals
  row_g, col_g = cotangents
  normed_rows, normed_cols = with_inverse_norms(rows), with_inverse_norms(columns)
  drows, dcols, dparams, dconsts = accumulate_grads(
      plan, args, normed_rows, normed_rows if normed_cols is None else normed_cols, row_out,
      row_g, col_out, col_g, match_varying(zero_grads(plan, args, rows, columns), rows.vectors))
  # The step's cotangent is None (an integer).
  return side_grad(rows, drows), side_grad(columns, dcols), MappingArgs(dparams, None, dconsts)  # pyright: ignore[reportArgumentType]


_reduce.defvjp(saving_inputs(_reduce), _reduce_bwd)


def tile_reduce(rows: Side, columns: Side | None, *, mapping, kind: str,
                block_size: int | None, column_grad: bool = True,
                tile_reduction: TileReduction = LogSumExp()):
  """`(row_out, col_out)`: a reduction over each row's (and column's) tile entries.

  With `LogSumExp`, the logsumexp of each row's (and column's) negatives' logits.

  Args:
    rows: the anchors.
    columns: the candidates; None for `"symmetric"` (the candidates are `rows`).
    mapping: a `tfcl_jax.mappings.Mapping`.
    kind: one of `KINDS`.
    block_size: the largest tile side, or None for `auto_block_size`.
    column_grad: False when the candidates take no gradient (extra negatives).
    tile_reduction: a `_tiles.TileReduction`: `LogSumExp()` (InfoNCE), `SigmoidSum()`
      (SigLIP) or `PositiveSum()` (SupCon's positives).

  Returns:
    `row_out [M]` and `col_out [K]` (None unless `"rows_and_columns"`); for `LogSumExp`,
    `-inf` for a row without negatives.
  """
  return with_tiling(block_size, functools.partial(
      _tile_reduce, mapping=mapping, kind=kind, column_grad=column_grad,
      tile_reduction=tile_reduction), rows, columns)


def with_tiling(block_size: int | None, fn, rows: Side, columns: Side | None):
  """`fn(tiling, rows, columns)` with the `_blocks.Tiling` of the platform the program is
  lowered for (`_blocks.by_platform`): tiles of `block_size` (None: the platform's automatic
  side); without `columns` (the symmetric kind) the platform's place for the diagonal tiles."""
  num_rows = rows.ids.shape[0]
  num_cols = num_rows if columns is None else columns.ids.shape[0]
  return by_platform(num_rows, num_cols, fn, rows, columns, block_size=block_size,
                     symmetric=columns is None)


def planned(tiling: Tiling, rows: Side, columns: Side | None, *, mapping, kind: str,
            tile_reduction: TileReduction, column_grad: bool = True):
  """`(plan, args, rows, columns)`: the plan of a tiled computation with tiles balanced under
  `tiling.block`, the mapping's arguments, and the sides with their bias and scale constant,
  padded to whole tiles (`unpadded` cuts the outputs back). Two sides whose vectors differ in
  dtype, one of them raw rows (a bfloat16 batch against a float32 bank), both take unit rows in
  their common compute dtype (`_layout.unit`)."""
  if columns is not None and rows.vectors.dtype != columns.vectors.dtype and (
      is_raw(rows.vectors) or is_raw(columns.vectors)):
    dtype = jnp.promote_types(stats_dtype(rows.vectors), stats_dtype(columns.vectors))
    rows, columns = _as_unit(rows, dtype), _as_unit(columns, dtype)
  block_rows = balanced_tile(tiling.block, rows.ids.shape[0])
  block_cols = block_rows if columns is None else balanced_tile(tiling.block,
                                                                columns.ids.shape[0])
  tile_mapping, args = pure_mapping(mapping, stats_dtype(rows.vectors), (block_rows, block_cols),
                                    like=rows.vectors, tile_reduction=tile_reduction,
                                    closed_form=not has_scale(rows, columns))
  plan = Plan(kind, block_rows, block_cols, tile_mapping, column_grad, tile_reduction,
              scan_unroll(block_rows, block_cols), tiling.diagonal_apart)
  rows = pad_side(constant_bias_and_scale(rows), block_rows)
  columns = None if columns is None else pad_side(constant_bias_and_scale(columns), block_cols)
  return plan, args, rows, columns


def _as_unit(side: Side, dtype) -> Side:
  return side._replace(vectors=_layout.unit(side.vectors).astype(dtype))


def unpadded(outputs, rows: Side, columns: Side | None):
  """`(row_out, col_out)` of padded sides cut back to `rows` and `columns` (`col_out` may be
  None)."""
  row_out, col_out = cast("tuple[jax.Array, jax.Array | None]", outputs)
  num_rows = rows.ids.shape[0]
  num_cols = num_rows if columns is None else columns.ids.shape[0]
  return row_out[:num_rows], None if col_out is None else col_out[:num_cols]


def _tile_reduce(tiling: Tiling, rows: Side, columns: Side | None, *, mapping, kind: str,
                 column_grad: bool, tile_reduction: TileReduction):
  plan, args, padded_rows, padded_cols = planned(
      tiling, rows, columns, mapping=mapping, kind=kind, tile_reduction=tile_reduction,
      column_grad=column_grad)
  if not column_grad:
    assert padded_cols is not None, "stop_gradient on candidates needs a column side"
    padded_cols = padded_cols._replace(vectors=jax.lax.stop_gradient(padded_cols.vectors))
  return unpadded(_reduce(plan, padded_rows, padded_cols, args), rows, columns)


def constant_bias_and_scale(side: Side) -> Side:
  """`side` with its bias and scale (if any) under `stop_gradient`: neither takes a gradient."""
  return side._replace(bias=None if side.bias is None else jax.lax.stop_gradient(side.bias),
                       scale=None if side.scale is None else jax.lax.stop_gradient(side.scale))
