r"""Triton kernels whose programs write each other's rows (atomic adds): one tile serves both
of its sides.

* `symmetric_forward` (`negatives="all"`, mappings with a closed form `w = exp(f - shift)`): `S = U
  U^T` is symmetric, so program `i` forms its diagonal tile and the tiles `(i, i + t mod nb)`,
  `t = 1 .. nb/2` (each unordered pair of blocks once, the half-circulant schedule that keeps
  programs equally loaded); a tile's row sums of `w` go to block `i` and its column sums to
  block `j`. A closed form has a fixed shift, so sums from different programs add exactly;
  a mapping without one keeps the row kernel, whose running maximum is its own.
* `two_sided_forward` (CLIP's two-tower loss, closed-form mappings): one pass over `S = U V^T`
  gives each row's sum (the program's own) and each column's (added across programs).
* `symmetric_grads`: `dU = (G + G^T) U` on the same schedule, `G_ij U_j` to block `i` and
  `G_ij^T U_i` to block `j`; the mapping's parameters take both terms of an off-diagonal tile.
* `both_grads` (`"rows"` and `"rows_and_columns"` with candidate gradients): one kernel for
  `dU_i = sum_j dS_ij V_j` (the program's own, in registers) and `dV_j = sum_i dS_ij^T U_i`
  (added across programs), each tile formed once where separate row and column kernels
  form it twice.

Float atomic adds make the sums' order, and so their last bits, vary from run to run.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from tfcl_jax.losses._kernel_math import (
    INDEX,
    KernelMapping,
    keep_mask,
    load_theta,
    loop,
    tile_cotangent,
    without_empty,
)
from tfcl_jax.losses._kernel_triton import (
    _ALL,
    _add_product,
    _anchor_arrays,
    _block_rows,
    _call,
    _candidate_arrays,
    _cols,
    _columns,
    _cos,
    _finish,
    _Geometry,
    _geometry,
    _over_chunks,
    _raw_products,
    _rows,
    _span,
    _whole,
    _whole_block,
    _zero,
    backend,
)
from tfcl_jax.losses._tiles import Side
from tfcl_jax.losses._triton_tiles import Tiles, stats_dtype

_TRANSPOSED = (((0,), (0,)), ((), ()))  # `a^T b`


def _half(g: _Geometry, i, t):
  """Block `j = i + t mod nb` and whether program `i` forms tile `(i, j)`: every pair of blocks
  once (at distance `nb / 2` of an even `nb`, by the lower `i`)."""
  return (i + t) % g.steps, (2 * t < g.steps) | (2 * i < g.steps)


def _lse(sums, shift):
  nonempty = sums > 0
  return jnp.where(nonempty, shift + jnp.log(jnp.where(nonempty, sums, 1.0)), -jnp.inf)


def _every_column(ref):
  """All of `ref`'s columns, as an atomic add's index: its start int32 like the rows' (Pallas's
  interpreter refuses a mix, and a Python 0 is int64 under `jax_enable_x64`)."""
  return pl.ds(jnp.asarray(0, INDEX), ref.shape[1])


def _atomic_product(g: _Geometry, out_ref, out_span, dcos, ref, span, loaded, *,
                    transposed: bool):
  """`out[out_span] += dcos B` (`dcos^T B` when `transposed`) with atomic adds, `B` the block
  `ref[span]`: `loaded` when `D` is held whole, else read chunk by chunk."""
  dims = _TRANSPOSED if transposed else (((1,), (0,)), ((), ()))

  def product(block):
    return jax.lax.dot_general(dcos, block, dims, preferred_element_type=jnp.float32)

  if g.whole:
    backend().atomic_add(out_ref, (out_span, _every_column(out_ref)), product(loaded))
    return

  def add(c, carry):
    d = _columns(g, c)
    backend().atomic_add(out_ref, (out_span, d), product(ref[span, d]))
    return carry

  _over_chunks(g, add, 0)


def _symmetric_tile(g: _Geometry, refs, span_i, rows, span_j, active):
  """`(cos, keep, cols)` of tile `(i, j)` of `S = U U^T`."""
  u_ref, scale_ref, ids_ref, pos_ref, valid_ref = refs
  cols = _whole_block(g, u_ref, span_j)
  raw = _raw_products(g, u_ref, span_i, u_ref, span_j, rows, cols)
  cos = _cos(g, raw, _rows(scale_ref[span_i]), _cols(scale_ref[span_j])).astype(jnp.float32)
  keep = keep_mask(_rows(ids_ref[span_i]), _rows(pos_ref[span_i]), _rows(valid_ref[span_i]),
                   _cols(ids_ref[span_j]), _cols(valid_ref[span_j])) & active
  return cos, keep, cols


def _symmetric_forward_kernel(mapping: KernelMapping, g: _Geometry, u_ref, scale_ref, ids_ref,
                              pos_ref, valid_ref, sums_in_ref, sums_ref):
  del sums_in_ref  # zeros, aliased to `sums_ref`
  i = pl.program_id(0)
  span_i = _span(g, i)
  refs = (u_ref, scale_ref, ids_ref, pos_ref, valid_ref)
  rows = _whole_block(g, u_ref, span_i)

  def weights(span_j, active):
    cos, keep, _ = _symmetric_tile(g, refs, span_i, rows, span_j, active)
    return jnp.where(keep, mapping.fast.weight(cos), 0.0)

  def body(t, own):
    j, active = _half(g, i, t)
    span_j = _span(g, j)
    w = weights(span_j, active)
    backend().atomic_add(sums_ref, (span_j,), jnp.sum(w, axis=0))
    return own + jnp.sum(w, axis=1)

  own = loop(1, g.steps // 2 + 1, body, jnp.sum(weights(span_i, True), axis=1))
  backend().atomic_add(sums_ref, (span_i,), own)


def symmetric_forward(mapping: KernelMapping, tiles_: Tiles, theta, side: Side) -> jax.Array:
  """Each row's logsumexp over its negatives among the rows of `side` (closed-form mappings)."""
  del theta  # a closed form has no parameters
  (m, d), dtype = side.vectors.shape, stats_dtype(side.vectors)
  g = _geometry(tiles_, d, m, side.vectors)
  sums = _call(
      functools.partial(_symmetric_forward_kernel, mapping, g), tiles_, grid=(m // tiles_.block,),
      in_specs=[_whole((m, d))] + [_whole((m,))] * 5, out_specs=_whole((m,)),
      out_shape=jax.ShapeDtypeStruct((m,), dtype), input_output_aliases={5: 0},
      name="info_nce_lse_symmetric")(*_anchor_arrays(side), jnp.zeros((m,), dtype))
  return _lse(sums, mapping.fast.shift)


def _two_sided_forward_kernel(mapping: KernelMapping, g: _Geometry, r_ref, r_scale_ref, r_ids_ref,
                              r_pos_ref, r_valid_ref, c_ref, c_scale_ref, c_ids_ref, c_valid_ref,
                              col_in_ref, row_ref, col_ref):
  del col_in_ref  # zeros, aliased to `col_ref`
  r_ids, r_pos, r_valid = (_rows(r[...]) for r in (r_ids_ref, r_pos_ref, r_valid_ref))
  r_scale = _rows(r_scale_ref[...])
  rows = _whole_block(g, r_ref, _ALL)

  def body(j, own):
    span = _span(g, j)
    raw = _raw_products(g, r_ref, _ALL, c_ref, span, rows, _whole_block(g, c_ref, span))
    w = mapping.fast.weight(_cos(g, raw, r_scale, _cols(c_scale_ref[span])).astype(jnp.float32))
    c_ids, c_valid = _cols(c_ids_ref[span]), _cols(c_valid_ref[span])
    # Column j as the anchor: its positive is its own id (the two-tower layout).
    col_keep = keep_mask(c_ids, c_ids, c_valid, r_ids, r_valid)
    backend().atomic_add(col_ref, (span,), jnp.sum(jnp.where(col_keep, w, 0.0), axis=0))
    keep = keep_mask(r_ids, r_pos, r_valid, c_ids, c_valid)
    return own + jnp.sum(jnp.where(keep, w, 0.0), axis=1)

  row_ref[...] = loop(0, g.steps, body, jnp.zeros((g.block,), jnp.float32))


def two_sided_forward(mapping: KernelMapping, tiles_: Tiles, theta, rows: Side, cols: Side):
  """`(row_lse, col_lse)` of the two-tower loss from one pass (closed-form mappings)."""
  del theta
  (m, d), k, dtype = rows.vectors.shape, cols.vectors.shape[0], stats_dtype(rows.vectors)
  g = _geometry(tiles_, d, k, rows.vectors)
  row, vec = _block_rows(tiles_.block, d), _block_rows(tiles_.block)
  row_sums, col_sums = _call(
      functools.partial(_two_sided_forward_kernel, mapping, g), tiles_,
      grid=(m // tiles_.block,),
      in_specs=[row, vec, vec, vec, vec, _whole((k, d))] + [_whole((k,))] * 4,
      out_specs=[vec, _whole((k,))],
      out_shape=[jax.ShapeDtypeStruct((m,), dtype), jax.ShapeDtypeStruct((k,), dtype)],
      input_output_aliases={9: 1}, name="info_nce_lse_two_sided")(
          *_anchor_arrays(rows), *_candidate_arrays(cols), jnp.zeros((k,), dtype))
  return _lse(row_sums, mapping.fast.shift), _lse(col_sums, mapping.fast.shift)


def _symmetric_grads_kernel(mapping: KernelMapping, g: _Geometry, theta_ref, u_ref, scale_ref,
                            ids_ref, pos_ref, valid_ref, lse_ref, g_ref, du_in_ref, du_ref,
                            dtheta_ref):
  del du_in_ref  # zeros, aliased to `du_ref`
  i = pl.program_id(0)
  span_i = _span(g, i)
  theta = load_theta(mapping, theta_ref)
  refs = (u_ref, scale_ref, ids_ref, pos_ref, valid_ref)
  rows = _whole_block(g, u_ref, span_i)
  r_scale = _rows(scale_ref[span_i])
  r_lse, r_g = without_empty(_rows(lse_ref[span_i]), _rows(g_ref[span_i]))
  dtype = u_ref.dtype

  def tile(span_j, active, theta_from_columns):
    cos, keep, cols = _symmetric_tile(g, refs, span_i, rows, span_j, active)
    c_lse, c_g = without_empty(_cols(lse_ref[span_j]), _cols(g_ref[span_j]))
    dcos, dth = tile_cotangent(mapping, theta, cos, keep, r_lse, r_g, c_lse, c_g, columns=True,
                               theta_from_columns=theta_from_columns)
    c_scale = _cols(scale_ref[span_j])
    # Raw rows: the products take dS_ij r_j (rows) and dS_ij r_i (columns), see _kernel_triton.
    for_rows = (dcos * c_scale if g.scaled else dcos).astype(dtype)
    for_cols = (dcos * r_scale if g.scaled else dcos).astype(dtype)
    return for_rows, for_cols, cols, dth

  def own(acc, span_j, for_rows, cols):
    if g.whole:
      return acc + jnp.dot(for_rows, cols, preferred_element_type=jnp.float32)
    _atomic_product(g, du_ref, span_i, for_rows, u_ref, span_j, cols, transposed=False)
    return acc

  # The diagonal tile holds every ordered pair of block i: its row terms are the whole.
  for_rows, _, cols, dtheta = tile(span_i, True, False)
  acc = jnp.zeros((g.block, g.block_d), jnp.float32) if g.whole else None
  acc = own(acc, span_i, for_rows, cols)

  def body(t, carry):
    acc, dtheta = carry
    j, active = _half(g, i, t)
    span_j = _span(g, j)
    for_rows, for_cols, cols, dth = tile(span_j, active, True)
    acc = own(acc, span_j, for_rows, cols)
    _atomic_product(g, du_ref, span_j, for_cols, u_ref, span_i, rows, transposed=True)
    if dth is not None:
      dtheta = tuple(x + y for x, y in zip(dtheta, dth, strict=True))
    return acc, dtheta

  acc, dtheta = loop(1, g.steps // 2 + 1, body, (acc, dtheta))
  if g.whole:
    backend().atomic_add(du_ref, (span_i, _every_column(du_ref)), acc)
  for k, value in enumerate(dtheta or ()):
    dtheta_ref[0, k] = value
  if dtheta is None:
    for k in range(dtheta_ref.shape[1]):
      dtheta_ref[0, k] = jnp.zeros((), dtheta_ref.dtype)


def symmetric_grads(mapping: KernelMapping, tiles_: Tiles, theta, side: Side, lse, g_):
  """`(G, dtheta)` of `sum_i g_i lse_i` for `S = U U^T`: the gradient for the unit rows."""
  (m, d), dtype = side.vectors.shape, stats_dtype(side.vectors)
  g = _geometry(tiles_, d, m, side.vectors, tiles_.pair_block_d)
  blocks, width = m // tiles_.block, theta.shape[0]
  du, dtheta = _call(
      functools.partial(_symmetric_grads_kernel, mapping, g), tiles_, grid=(blocks,),
      in_specs=[_whole(theta.shape), _whole((m, d))] + [_whole((m,))] * 6 + [_whole((m, d))],
      out_specs=[_whole((m, d)), pl.BlockSpec((1, width), lambda i: (i, 0))],
      out_shape=[jax.ShapeDtypeStruct((m, d), dtype),
                 jax.ShapeDtypeStruct((blocks, width), theta.dtype)],
      input_output_aliases={8: 0}, name="info_nce_lse_symmetric_grad")(
          theta, *_anchor_arrays(side), lse, g_, jnp.zeros((m, d), dtype))
  return du, jnp.sum(dtheta, axis=0)


def _both_grads_kernel(mapping: KernelMapping, g: _Geometry, columns: bool, theta_ref, r_ref,
                       r_scale_ref, r_ids_ref, r_pos_ref, r_valid_ref, r_lse_ref, r_g_ref, c_ref,
                       c_scale_ref, c_ids_ref, c_valid_ref, c_lse_ref, c_g_ref, dc_in_ref, dr_ref,
                       dtheta_ref, dc_ref):
  del dc_in_ref  # zeros, aliased to `dc_ref`
  theta = load_theta(mapping, theta_ref)
  r_ids, r_pos, r_valid = (_rows(r[...]) for r in (r_ids_ref, r_pos_ref, r_valid_ref))
  r_lse, r_g = without_empty(_rows(r_lse_ref[...]), _rows(r_g_ref[...]))
  r_scale = _rows(r_scale_ref[...])
  rows = _whole_block(g, r_ref, _ALL)
  dtype = r_ref.dtype
  if not g.whole:
    _zero(dr_ref, g)

  def body(j, carry):
    acc, dtheta = carry
    span = _span(g, j)
    cols = _whole_block(g, c_ref, span)
    c_scale = _cols(c_scale_ref[span])
    cos = _cos(g, _raw_products(g, r_ref, _ALL, c_ref, span, rows, cols), r_scale,
               c_scale).astype(jnp.float32)
    keep = keep_mask(r_ids, r_pos, r_valid, _cols(c_ids_ref[span]), _cols(c_valid_ref[span]))
    c_lse, c_g = (without_empty(_cols(c_lse_ref[span]), _cols(c_g_ref[span])) if columns
                  else (None, None))
    dcos, dth = tile_cotangent(mapping, theta, cos, keep, r_lse, r_g, c_lse, c_g,
                               columns=columns, theta_from_columns=columns)
    for_rows = (dcos * c_scale if g.scaled else dcos).astype(dtype)
    for_cols = (dcos * r_scale if g.scaled else dcos).astype(dtype)
    acc = _add_product(acc, for_rows, cols, c_ref, span, dr_ref, g)
    _atomic_product(g, dc_ref, span, for_cols, r_ref, _ALL, rows, transposed=True)
    if dth is not None:
      dtheta = tuple(x + y for x, y in zip(dtheta, dth, strict=True))
    return acc, dtheta

  acc = jnp.zeros((g.block, g.block_d), jnp.float32) if g.whole else None
  zeros = tuple(jnp.zeros((), dtheta_ref.dtype) for _ in range(mapping.num_theta))
  acc, dtheta = loop(0, g.steps, body, (acc, zeros))
  _finish(g, dr_ref, acc)
  for k, value in enumerate(dtheta):
    dtheta_ref[0, k] = value


def both_grads(mapping: KernelMapping, tiles_: Tiles, theta, rows: Side, cols: Side, r_lse, r_g,
               c_lse, c_g, *, columns: bool):
  """`(G_rows, G_cols, dtheta)`: both sides' gradients for their unit rows from one pass."""
  (m, d), k, dtype = rows.vectors.shape, cols.vectors.shape[0], stats_dtype(rows.vectors)
  g = _geometry(tiles_, d, k, rows.vectors, tiles_.pair_block_d)
  row, vec = _block_rows(tiles_.block, d), _block_rows(tiles_.block)
  blocks, width = m // tiles_.block, theta.shape[0]
  drows, dtheta, dcols = _call(
      functools.partial(_both_grads_kernel, mapping, g, columns), tiles_, grid=(blocks,),
      in_specs=[_whole(theta.shape), row] + [vec] * 6 + [_whole((k, d))] + [_whole((k,))] * 5
      + [_whole((k, d))],
      out_specs=[row, pl.BlockSpec((1, width), lambda i: (i, 0)), _whole((k, d))],
      out_shape=[jax.ShapeDtypeStruct((m, d), dtype),
                 jax.ShapeDtypeStruct((blocks, width), theta.dtype),
                 jax.ShapeDtypeStruct((k, d), dtype)],
      input_output_aliases={14: 2}, name="info_nce_lse_grads")(
          theta, *_anchor_arrays(rows), r_lse, r_g, *_candidate_arrays(cols), c_lse, c_g,
          jnp.zeros((k, d), dtype))
  return drows, dcols, jnp.sum(dtheta, axis=0)
