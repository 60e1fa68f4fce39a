r"""Triton kernels in which one tile serves both of its sides: a program forms tile `(i, j)` once
and sends its column side to block `j`, either as partial results in its own slots of a scratch
that XLA sums (`column_side="partials"`, no atomics) or by atomic adds, once per tile (per step
of `D` where `D` is walked; `"atomic"`). `_triton_tiles.COLUMN_SIDE` chooses, forward and
backward; its `"separate"` is `_kernel_triton`'s row and column kernels instead.

* `symmetric_forward` (`negatives="all"`, mappings with a closed form `w = exp(f - shift)`): `S = U
  U^T` is symmetric, so program `i` forms its diagonal tile and the tiles `(i, i + t mod nb)`,
  `t = 1 .. nb/2` (each unordered pair of blocks once, the half-circulant schedule that keeps
  programs equally loaded); a tile's row sums of `w` are block `i`'s, its column sums block
  `j`'s (slot `t`: for each `t` every block is some program's `j` exactly once). A closed form
  has a fixed shift, so sums from different programs add exactly; a mapping without one keeps
  the row kernel, whose running maximum is its own.
* `two_sided_forward` (CLIP's two-tower loss, closed-form mappings): one pass over `S = U V^T`
  gives each row's sum (the program's own) and each column's (slot: the row block).
* `symmetric_grads`: `dU = (G + G^T) U` on the same schedule, `G_ij U_j` to block `i` (the
  program's own, no atomics) and `G_ij^T U_i` to block `j`; the mapping's parameters take both
  terms of an off-diagonal tile.
* `both_grads` (`"rows"` and `"rows_and_columns"` with candidate gradients): one kernel for
  `dU_i = sum_j dS_ij V_j` (the program's own) and `dV_j = sum_i dS_ij^T U_i`, each tile formed
  once where separate row and column kernels form it twice.

Float atomic adds make the sums' order, and so their last bits, vary from run to run; the
partials do not (XLA sums them in a fixed order).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from tfcl_jax.losses._engine._tiles import Side, stats_dtype
from tfcl_jax.losses._kernels import _kernel_triton
from tfcl_jax.losses._kernels import _triton_blocks as tb
from tfcl_jax.losses._kernels._kernel_math import (
  KernelMapping,
  keep_mask,
  load_theta,
  loop,
  tile_cotangent,
  without_empty,
)
from tfcl_jax.losses._kernels._triton_tiles import Tiles


def _half(g: tb.Geometry, i, t):
  """Block `j = i + t mod nb` and whether program `i` forms tile `(i, j)`: every pair of blocks
  once (at distance `nb / 2` of an even `nb`, by the lower `i`)."""
  return (i + t) % g.steps, (2 * t < g.steps) | (2 * i < g.steps)


def _lse(sums, shift):
  nonempty = sums != 0  # a NaN candidate gives NaN, not an empty row
  return jnp.where(nonempty, shift + jnp.log(jnp.where(nonempty, sums, 1.0)), -jnp.inf)


def _sender(partials: bool, share_ref, slot, target):
  """`send(d, value)`: a tile's column share for the rows `target` (columns `d`; None: all),
  to slot `slot` of the scratch `share_ref` (`partials`), else added atomically."""
  def send(d, value):
    if partials:
      share_ref[(slot, target) + (() if d is None and share_ref.ndim == 2 else
                                  (tb.ALL if d is None else d,))] = value.astype(share_ref.dtype)
    else:
      index = (target,) if share_ref.ndim == 1 else (target, tb.every_column(share_ref)
                                                     if d is None else d)
      tb.backend().atomic_add(share_ref, index, value)
  return send


def _share_spec(partials: bool, slots: int, k: int, d: int | None = None):
  """The column side's output: a scratch `[slots, k(, d)]` (`partials`) or `[k(, d)]` (atomic
  adds into zeros, aliased to an input)."""
  shape = ((slots,) if partials else ()) + (k,) + (() if d is None else (d,))
  return tb.whole(shape), shape


def _summed(partials: bool, share):
  return jnp.sum(share, axis=0) if partials else share


def _symmetric_tile(g: tb.Geometry, refs, span_i, rows, span_j, active):
  """`(cos, keep, cols)` of tile `(i, j)` of `S = U U^T`."""
  u_ref, scale_ref, ids_ref, pos_ref, valid_ref = refs
  cols = tb.whole_block(g, u_ref, span_j)
  raw = tb.products(g, u_ref, span_i, u_ref, span_j, rows, cols)
  cos = tb.scaled(g, raw, tb.rows(scale_ref[span_i]), tb.cols(scale_ref[span_j]))
  keep = keep_mask(tb.rows(ids_ref[span_i]), tb.rows(pos_ref[span_i]),
                   tb.rows(valid_ref[span_i]), tb.cols(ids_ref[span_j]),
                   tb.cols(valid_ref[span_j])) & active
  return cos, keep, cols


def _symmetric_forward_kernel(mapping: KernelMapping, g: tb.Geometry, partials: bool, u_ref,
                              scale_ref, ids_ref, pos_ref, valid_ref, *refs):
  own_ref, share_ref = refs[-2:]  # (an aliased input of zeros before them for atomics)
  i = pl.program_id(0)
  span_i = tb.span(g, i)
  tile_refs = (u_ref, scale_ref, ids_ref, pos_ref, valid_ref)
  rows = tb.whole_block(g, u_ref, span_i)

  def weights(span_j, active):
    cos, keep, _ = _symmetric_tile(g, tile_refs, span_i, rows, span_j, active)
    return jnp.where(keep, mapping.fast.weight(cos), 0.0)

  def body(t, own):
    j, active = _half(g, i, t)
    span_j = tb.span(g, j)
    w = weights(span_j, active)
    _sender(partials, share_ref, t - 1, span_j)(None, jnp.sum(w, axis=0))
    return own + jnp.sum(w, axis=1)

  own_ref[...] = loop(1, g.steps // 2 + 1, body, jnp.sum(weights(span_i, True), axis=1))


def symmetric_forward(mapping: KernelMapping, tiles_: Tiles, theta, side: Side, *,
                      column_side: str) -> jax.Array:
  """Each row's logsumexp over its negatives among the rows of `side` (closed-form mappings)."""
  (m, d), dtype, launch = side.vectors.shape, stats_dtype(side.vectors), tiles_.forward
  blocks = m // launch.block
  if blocks < 2:  # no pair of blocks: the row kernel
    return _kernel_triton.forward(mapping, tiles_, theta, side, side)
  g = tb.geometry(launch, d, blocks, side.vectors)
  partials = column_side == "partials"
  share_spec, share_shape = _share_spec(partials, blocks // 2, m)
  zeros = () if partials else (jnp.zeros(share_shape, dtype),)
  own, share = tb.call(
      functools.partial(_symmetric_forward_kernel, mapping, g, partials), launch, grid=(blocks,),
      in_specs=[tb.whole((m, d))] + [tb.whole((m,))] * (4 + len(zeros)),
      out_specs=[tb.own_block(launch.block), share_spec],
      out_shape=[jax.ShapeDtypeStruct((m,), dtype), jax.ShapeDtypeStruct(share_shape, dtype)],
      input_output_aliases={} if partials else {5: 1}, name="info_nce_lse_symmetric")(
          *tb.anchor_arrays(side), *zeros)
  return _lse(own + _summed(partials, share), mapping.fast.shift)


def _two_sided_forward_kernel(mapping: KernelMapping, g: tb.Geometry, partials: bool, r_ref,
                              r_scale_ref, r_ids_ref, r_pos_ref, r_valid_ref, c_ref, c_scale_ref,
                              c_ids_ref, c_valid_ref, *refs):
  row_ref, col_ref = refs[-2:]
  r_ids, r_pos, r_valid = (tb.rows(r[...]) for r in (r_ids_ref, r_pos_ref, r_valid_ref))
  r_scale = tb.rows(r_scale_ref[...])
  rows = tb.whole_block(g, r_ref, tb.ALL)
  i = pl.program_id(0)

  def body(j, own):
    span = tb.span(g, j)
    raw = tb.products(g, r_ref, tb.ALL, c_ref, span, rows, tb.whole_block(g, c_ref, span))
    w = mapping.fast.weight(tb.scaled(g, raw, r_scale, tb.cols(c_scale_ref[span])))
    c_ids, c_valid = tb.cols(c_ids_ref[span]), tb.cols(c_valid_ref[span])
    # Column j as the anchor: its positive is its own id (the two-tower layout).
    col_keep = keep_mask(c_ids, c_ids, c_valid, r_ids, r_valid)
    _sender(partials, col_ref, i, span)(None, jnp.sum(jnp.where(col_keep, w, 0.0), axis=0))
    keep = keep_mask(r_ids, r_pos, r_valid, c_ids, c_valid)
    return own + jnp.sum(jnp.where(keep, w, 0.0), axis=1)

  row_ref[...] = loop(0, g.steps, body, jnp.zeros((g.block,), jnp.float32))


def two_sided_forward(mapping: KernelMapping, tiles_: Tiles, theta, rows: Side, cols: Side, *,
                      column_side: str):
  """`(row_lse, col_lse)` of the two-tower loss from one pass (closed-form mappings)."""
  del theta
  (m, d), k, dtype = rows.vectors.shape, cols.vectors.shape[0], stats_dtype(rows.vectors)
  launch = tiles_.forward
  g = tb.geometry(launch, d, k // launch.block, rows.vectors)
  row, vec = tb.own_block(launch.block, d), tb.own_block(launch.block)
  partials = column_side == "partials"
  share_spec, share_shape = _share_spec(partials, m // launch.block, k)
  zeros = () if partials else (jnp.zeros(share_shape, dtype),)
  row_sums, col_sums = tb.call(
      functools.partial(_two_sided_forward_kernel, mapping, g, partials), launch,
      grid=(m // launch.block,),
      in_specs=[row, vec, vec, vec, vec, tb.whole((k, d))] + [tb.whole((k,))] * (3 + len(zeros)),
      out_specs=[vec, share_spec],
      out_shape=[jax.ShapeDtypeStruct((m,), dtype), jax.ShapeDtypeStruct(share_shape, dtype)],
      input_output_aliases={} if partials else {9: 1}, name="info_nce_lse_two_sided")(
          *tb.anchor_arrays(rows), *tb.candidate_arrays(cols), *zeros)
  return (_lse(row_sums, mapping.fast.shift),
          _lse(_summed(partials, col_sums), mapping.fast.shift))


def _finish(g: tb.Geometry, own_ref, acc, dtheta, dtheta_ref):
  if g.whole:
    own_ref[...] = acc.astype(own_ref.dtype)
  tb.write_dtheta(dtheta_ref, dtheta)


def _symmetric_grads_kernel(mapping: KernelMapping, g: tb.Geometry, partials: bool, theta_ref,
                            u_ref, scale_ref, ids_ref, pos_ref, valid_ref, lse_ref, g_ref, *refs):
  own_ref, dtheta_ref, share_ref = refs[-3:]
  i = pl.program_id(0)
  span_i = tb.span(g, i)
  theta = load_theta(mapping, theta_ref)
  tile_refs = (u_ref, scale_ref, ids_ref, pos_ref, valid_ref)
  rows = tb.whole_block(g, u_ref, span_i)
  r_scale = tb.rows(scale_ref[span_i])
  r_lse, r_g = without_empty(tb.rows(lse_ref[span_i]), tb.rows(g_ref[span_i]))
  dtype = u_ref.dtype
  if not g.whole:
    tb.zero(own_ref, g)

  def tile(span_j, active, theta_from_columns):
    cos, keep, cols = _symmetric_tile(g, tile_refs, span_i, rows, span_j, active)
    c_lse, c_g = without_empty(tb.cols(lse_ref[span_j]), tb.cols(g_ref[span_j]))
    dcos, dth = tile_cotangent(mapping, theta, cos, keep, r_lse, r_g, c_lse, c_g, columns=True,
                               theta_from_columns=theta_from_columns)
    c_scale = tb.cols(scale_ref[span_j])
    # Raw rows: the products take dS_ij r_j (rows) and dS_ij r_i (columns), see _kernel_triton.
    for_rows = (dcos * c_scale if g.scaled else dcos).astype(dtype)
    for_cols = (dcos * r_scale if g.scaled else dcos).astype(dtype)
    return for_rows, for_cols, cols, dth

  # The diagonal tile holds every ordered pair of block i: its row terms are the whole.
  for_rows, _, cols, dtheta = tile(span_i, True, False)
  acc = jnp.zeros((g.block, g.block_d), jnp.float32) if g.whole else None
  acc = tb.add_product(g, acc, for_rows, cols, u_ref, span_i, own_ref, transposed=False)

  def body(t, carry):
    acc, dtheta = carry
    j, active = _half(g, i, t)
    span_j = tb.span(g, j)
    for_rows, for_cols, cols, dth = tile(span_j, active, True)
    acc = tb.add_product(g, acc, for_rows, cols, u_ref, span_j, own_ref, transposed=False)
    tb.share(g, for_cols, rows, u_ref, span_i, _sender(partials, share_ref, t - 1, span_j),
             transposed=True)
    if dth is not None:
      dtheta = tuple(x + y for x, y in zip(dtheta, dth, strict=True))
    return acc, dtheta

  acc, dtheta = loop(1, g.steps // 2 + 1, body, (acc, dtheta))
  _finish(g, own_ref, acc, dtheta, dtheta_ref)


def symmetric_grads(mapping: KernelMapping, tiles_: Tiles, theta, side: Side, lse, g_, *,
                    column_side: str):
  """`(G, dtheta)` of `sum_i g_i lse_i` for `S = U U^T`: the gradient for the unit rows."""
  (m, d), dtype, launch = side.vectors.shape, stats_dtype(side.vectors), tiles_.pairs
  blocks, width = m // launch.block, theta.shape[0]
  if blocks < 2:  # no pair of blocks: the row kernel
    return _kernel_triton.row_grads(mapping, tiles_, theta, side, side, lse, g_, lse, g_,
                                    columns=True, theta_from_columns=False)
  g = tb.geometry(launch, d, blocks, side.vectors)
  partials = column_side == "partials"
  share_spec, share_shape = _share_spec(partials, blocks // 2, m, d)
  zeros = () if partials else (jnp.zeros(share_shape, dtype),)
  own, dtheta, share = tb.call(
      functools.partial(_symmetric_grads_kernel, mapping, g, partials), launch, grid=(blocks,),
      in_specs=[tb.whole(theta.shape), tb.whole((m, d))] + [tb.whole((m,))] * 6
      + [share_spec] * len(zeros),
      out_specs=[tb.own_block(launch.block, d), pl.BlockSpec((1, width), lambda i: (i, 0)),
                 share_spec],
      out_shape=[jax.ShapeDtypeStruct((m, d), dtype),
                 jax.ShapeDtypeStruct((blocks, width), theta.dtype),
                 jax.ShapeDtypeStruct(share_shape, dtype)],
      input_output_aliases={} if partials else {8: 2}, name="info_nce_lse_symmetric_grad")(
          theta, *tb.anchor_arrays(side), lse, g_, *zeros)
  return own + _summed(partials, share), jnp.sum(dtheta, axis=0)


def _both_grads_kernel(mapping: KernelMapping, g: tb.Geometry, columns: bool, partials: bool,
                       theta_ref, r_ref, r_scale_ref, r_ids_ref, r_pos_ref, r_valid_ref, r_lse_ref,
                       r_g_ref, c_ref, c_scale_ref, c_ids_ref, c_valid_ref, c_lse_ref, c_g_ref,
                       *refs):
  own_ref, dtheta_ref, share_ref = refs[-3:]
  theta = load_theta(mapping, theta_ref)
  r_ids, r_pos, r_valid = (tb.rows(r[...]) for r in (r_ids_ref, r_pos_ref, r_valid_ref))
  r_lse, r_g = without_empty(tb.rows(r_lse_ref[...]), tb.rows(r_g_ref[...]))
  r_scale = tb.rows(r_scale_ref[...])
  rows = tb.whole_block(g, r_ref, tb.ALL)
  dtype, i = r_ref.dtype, pl.program_id(0)
  if not g.whole:
    tb.zero(own_ref, g)

  def body(j, carry):
    acc, dtheta = carry
    span = tb.span(g, j)
    cols = tb.whole_block(g, c_ref, span)
    c_scale = tb.cols(c_scale_ref[span])
    cos = tb.scaled(g, tb.products(g, r_ref, tb.ALL, c_ref, span, rows, cols), r_scale, c_scale)
    keep = keep_mask(r_ids, r_pos, r_valid, tb.cols(c_ids_ref[span]), tb.cols(c_valid_ref[span]))
    c_lse, c_g = (without_empty(tb.cols(c_lse_ref[span]), tb.cols(c_g_ref[span])) if columns
                  else (None, None))
    dcos, dth = tile_cotangent(mapping, theta, cos, keep, r_lse, r_g, c_lse, c_g,
                               columns=columns, theta_from_columns=columns)
    for_rows = (dcos * c_scale if g.scaled else dcos).astype(dtype)
    for_cols = (dcos * r_scale if g.scaled else dcos).astype(dtype)
    acc = tb.add_product(g, acc, for_rows, cols, c_ref, span, own_ref, transposed=False)
    tb.share(g, for_cols, rows, r_ref, tb.ALL, _sender(partials, share_ref, i, span),
             transposed=True)
    if dth is not None:
      dtheta = tuple(x + y for x, y in zip(dtheta, dth, strict=True))
    return acc, dtheta

  acc = jnp.zeros((g.block, g.block_d), jnp.float32) if g.whole else None
  zeros = tuple(jnp.zeros((), jnp.float32) for _ in range(mapping.num_theta))
  acc, dtheta = loop(0, g.steps, body, (acc, zeros))
  _finish(g, own_ref, acc, dtheta, dtheta_ref)


def both_grads(mapping: KernelMapping, tiles_: Tiles, theta, rows: Side, cols: Side, r_lse, r_g,
               c_lse, c_g, *, columns: bool, column_side: str):
  """`(G_rows, G_cols, dtheta)`: both sides' gradients for their unit rows from one pass."""
  (m, d), k, dtype = rows.vectors.shape, cols.vectors.shape[0], stats_dtype(rows.vectors)
  launch = tiles_.pairs
  g = tb.geometry(launch, d, k // launch.block, rows.vectors)
  row, vec = tb.own_block(launch.block, d), tb.own_block(launch.block)
  blocks, width = m // launch.block, theta.shape[0]
  partials = column_side == "partials"
  share_spec, share_shape = _share_spec(partials, blocks, k, d)
  zeros = () if partials else (jnp.zeros(share_shape, dtype),)
  drows, dtheta, share = tb.call(
      functools.partial(_both_grads_kernel, mapping, g, columns, partials), launch,
      grid=(blocks,),
      in_specs=[tb.whole(theta.shape), row] + [vec] * 6 + [tb.whole((k, d))]
      + [tb.whole((k,))] * 5 + [share_spec] * len(zeros),
      out_specs=[row, pl.BlockSpec((1, width), lambda i: (i, 0)), share_spec],
      out_shape=[jax.ShapeDtypeStruct((m, d), dtype),
                 jax.ShapeDtypeStruct((blocks, width), theta.dtype),
                 jax.ShapeDtypeStruct(share_shape, dtype)],
      input_output_aliases={} if partials else {14: 2}, name="info_nce_lse_grads")(
          theta, *tb.anchor_arrays(rows), r_lse, r_g, *tb.candidate_arrays(cols), c_lse, c_g,
          *zeros)
  return drows, _summed(partials, share), jnp.sum(dtheta, axis=0)
