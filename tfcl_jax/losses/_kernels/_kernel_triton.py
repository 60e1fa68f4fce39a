r"""The fused InfoNCE kernels for GPUs (Triton) in which no program writes another's rows.

A program holds one block of its own side and walks blocks of the other side, FlashAttention-2's
layout; at small `N` the other side's blocks are split between several programs
(`_triton_tiles.splits`, so that every SM has two), whose partial results XLA combines:

* `forward`: `lse_i = log sum_{j negative of i} exp(f(S_ij))`, an online logsumexp, or a plain
  sum of `w(S_ij) = exp(f(S_ij) - shift)` for mappings with a closed form (`Mapping.exp_form`;
  Eq. 11's `w = (1 + c) / (1 - c)`); tiled as a matrix product (`_triton_tiles.LAUNCH`'s
  "forward": 128 x 128 tiles, `D` in steps, the reduction loop), no `D`-sized accumulator;
* `row_grads`: each tile recomputed and its cotangent (`_kernel_math`), then
  `dU_i = sum_j dS_ij V_j` with the mapping's parameter gradients, the gradient block a loop
  carry (registers) when `D` is held whole and the program's own output block beyond that;
* `col_grads`: the same for a column block, `dV_j = sum_i dS_ij^T U_i` (the candidates'
  gradient where no tile serves both sides, `_triton_tiles.COLUMN_SIDE` "separate").

No atomics and no fences: the sums' order, and so every bit, is the same from run to run.
The kernels whose tiles serve both their sides are `_kernel_triton_pairs`'s.

Raw rows (bfloat16 inputs, `_pallas`): a side's vectors may be the raw rows `z` with float32
inverse norms `r = 1 / ||z||`, so that `S_ij = r_i r_j (z_i . z_j)`: the products run on
bfloat16 tensor cores with float32 accumulation and no normalised vector is ever rounded to
bfloat16. Backward, the products take `dS_ij r_j` in bfloat16 and give the gradient with
respect to the unit rows, `G_i = sum_j dS_ij u_j`, in float32; `_pallas` carries it through
the normalisation. Float32 sides are unit rows (`r = 1`), and their products are TF32, as
XLA's default on the same GPUs.

Every shape a kernel touches is a power of two (Triton's rule): `N` is padded to whole blocks
with rows that are never anyone's candidate, and `D` with zeros.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from tfcl_jax.losses._engine._tiles import Side, stats_dtype
from tfcl_jax.losses._kernels import _triton_blocks as tb
from tfcl_jax.losses._kernels._kernel_math import (
  KernelMapping,
  keep_mask,
  load_theta,
  loop,
  tile_cotangent,
  without_empty,
)
from tfcl_jax.losses._kernels._triton_tiles import (  # noqa: F401 - `tiles`: the backend's, for _pallas
  Launch,
  Tiles,
  splits,
  tiles,
)


def _first(g: tb.Geometry):
  """The first block of the other side in this program's share (its split, `program_id(1)`):
  read at the kernel's top level, where Pallas's interpreter gives program ids."""
  return pl.program_id(1) * g.steps


def _forward_kernel(mapping: KernelMapping, g: tb.Geometry, theta_ref, r_ref, r_scale_ref,
                    r_ids_ref, r_pos_ref, r_valid_ref, c_ref, c_scale_ref, c_ids_ref, c_valid_ref,
                    lse_ref):
  """One row block's logsumexp over its share of the column blocks (grid: row blocks, splits)."""
  block, dtype = g.block, lse_ref.dtype
  theta = load_theta(mapping, theta_ref)
  r_ids, r_pos, r_valid = (tb.rows(r[...]) for r in (r_ids_ref, r_pos_ref, r_valid_ref))
  r_scale = tb.rows(r_scale_ref[...])
  rows = tb.whole_block(g, r_ref, tb.ALL)  # loaded once when D is whole
  first = _first(g)

  def tile(t):
    span = tb.span(g, first + t)
    raw = tb.products(g, r_ref, tb.ALL, c_ref, span, rows, tb.whole_block(g, c_ref, span))
    cos = tb.scaled(g, raw, r_scale, tb.cols(c_scale_ref[span])).astype(dtype)
    return cos, keep_mask(r_ids, r_pos, r_valid, tb.cols(c_ids_ref[span]),
                          tb.cols(c_valid_ref[span]))

  if mapping.fast is not None:
    def add(t, total):
      cos, keep = tile(t)
      return total + jnp.sum(jnp.where(keep, mapping.fast.weight(cos), 0.0), axis=1)

    total = loop(0, g.steps, add, jnp.zeros((block,), dtype))
    shift = jnp.full((block,), mapping.fast.shift, dtype)
  else:
    def fold(t, carry):
      m, total = carry
      cos, keep = tile(t)
      logits = jnp.where(keep, mapping.fn(cos, theta), -jnp.inf)
      new_m = jnp.maximum(m, jnp.max(logits, axis=1))
      # A row with no candidate yet keeps m = -inf: shift by 0 there to avoid inf - inf.
      safe = jnp.where(new_m > -jnp.inf, new_m, 0.0)
      total = total * jnp.exp(m - safe) + jnp.sum(
          jnp.where(keep, jnp.exp(logits - safe[:, None]), 0.0), axis=1)
      return new_m, total

    shift, total = loop(0, g.steps, fold,
                        (jnp.full((block,), -jnp.inf, dtype), jnp.zeros((block,), dtype)))
  nonempty = total != 0  # a NaN candidate gives NaN, not an empty row
  lse_ref[...] = jnp.where(nonempty, shift + jnp.log(jnp.where(nonempty, total, 1.0)),
                           -jnp.inf)


def _split_out(block: int, dim: int | None, parts: int):
  """Program `(i, s)`'s block of a `[splits, M]` (or `[splits, M, dim]`) output; of `[M]` (or
  `[M, dim]`) without splits."""
  if parts == 1:
    return tb.own_block(block, dim)
  if dim is None:
    return pl.BlockSpec((pl.squeezed, block), lambda i, s: (s, i))
  return pl.BlockSpec((pl.squeezed, block, dim), lambda i, s: (s, i, 0))


def _grid(launch: Launch, tiles_: Tiles, own: int, other: int) -> tuple[int, int]:
  """(blocks of the program's own side, splits of the other side's blocks)."""
  blocks = own // launch.block
  return blocks, splits(blocks, other // launch.block, tiles_.min_programs)


def forward(mapping: KernelMapping, tiles_: Tiles, theta, a: Side, b: Side) -> jax.Array:
  """Each row of `a`: the logsumexp of its negatives among the rows of `b`."""
  (m, d), k, launch = a.vectors.shape, b.vectors.shape[0], tiles_.forward
  blocks, parts = _grid(launch, tiles_, m, k)
  g = tb.geometry(launch, d, k // launch.block // parts, a.vectors)
  row, vec = tb.own_block(launch.block, d), tb.own_block(launch.block)
  lse = tb.call(
      functools.partial(_forward_kernel, mapping, g), launch, grid=(blocks, parts),
      in_specs=[tb.whole(theta.shape), row, vec, vec, vec, vec, tb.whole((k, d))]
      + [tb.whole((k,))] * 3,
      out_specs=_split_out(launch.block, None, parts),
      out_shape=jax.ShapeDtypeStruct((parts, m)[parts == 1:], stats_dtype(a.vectors)),
      name="info_nce_lse")(theta, *tb.anchor_arrays(a), *tb.candidate_arrays(b))
  return lse if parts == 1 else jax.nn.logsumexp(lse, axis=0)


def _grad_kernel(mapping: KernelMapping, g: tb.Geometry, own_rows: bool, columns: bool,
                 theta_from_columns: bool, theta_ref, r_ref, r_scale_ref, r_ids_ref, r_pos_ref,
                 r_valid_ref, r_lse_ref, r_g_ref, c_ref, c_scale_ref, c_ids_ref, c_valid_ref,
                 c_lse_ref, c_g_ref, out_ref, *dtheta_ref):
  """`dU_i = sum_j dS_ij V_j` for one row block (`own_rows`) with its share of `dtheta`, or
  `dV_j = sum_i dS_ij^T U_i` for one column block; tiles in the rows' orientation."""
  theta = load_theta(mapping, theta_ref)

  def row_values(index):
    lse, g_ = without_empty(tb.rows(r_lse_ref[index]), tb.rows(r_g_ref[index]))
    return (tb.rows(r_scale_ref[index]), tb.rows(r_ids_ref[index]), tb.rows(r_pos_ref[index]),
            tb.rows(r_valid_ref[index]), lse, g_)

  def col_values(index):
    lse, g_ = (without_empty(tb.cols(c_lse_ref[index]), tb.cols(c_g_ref[index])) if columns
               else (None, None))
    return (tb.cols(c_scale_ref[index]), tb.cols(c_ids_ref[index]), None,
            tb.cols(c_valid_ref[index]), lse, g_)

  own_ref, other_ref = (r_ref, c_ref) if own_rows else (c_ref, r_ref)
  # The program's own block and its values, loaded once (the block only when D is whole).
  own = tb.whole_block(g, own_ref, tb.ALL)
  own_values = (row_values if own_rows else col_values)(tb.ALL)
  if not g.whole:
    tb.zero(out_ref, g)
  first = _first(g)

  def body(t, carry):
    acc, dtheta = carry
    span = tb.span(g, first + t)
    r_index, c_index = (tb.ALL, span) if own_rows else (span, tb.ALL)
    other = tb.whole_block(g, other_ref, span)  # one load for the tile and for the product
    r_scale, r_ids, r_pos, r_valid, r_lse, r_g = own_values if own_rows else row_values(span)
    c_scale, c_ids, _, c_valid, c_lse, c_g = col_values(span) if own_rows else own_values
    raw = tb.products(g, r_ref, r_index, c_ref, c_index, *((own, other) if own_rows
                                                           else (other, own)))
    keep = keep_mask(r_ids, r_pos, r_valid, c_ids, c_valid)
    dcos, dth = tile_cotangent(mapping, theta, tb.scaled(g, raw, r_scale, c_scale), keep, r_lse,
                               r_g, c_lse, c_g, columns=columns,
                               theta_from_columns=theta_from_columns)
    # Raw rows: G_i = sum_j dS_ij r_j z_j, the gradient for the unit rows (and so for columns).
    lhs = dcos * (c_scale if own_rows else r_scale) if g.scaled else dcos
    acc = tb.add_product(g, acc, lhs.astype(other_ref.dtype), other, other_ref, span, out_ref,
                         transposed=not own_rows)
    if dth is not None and own_rows:
      dtheta = tuple(x + y for x, y in zip(dtheta, dth, strict=True))
    return acc, dtheta

  acc = jnp.zeros((g.block, g.block_d), jnp.float32) if g.whole else None
  zeros = tuple(jnp.zeros((), jnp.float32) for _ in range(mapping.num_theta))
  acc, dtheta = loop(0, g.steps, body, (acc, zeros))
  if g.whole:
    out_ref[...] = acc.astype(out_ref.dtype)
  for ref in dtheta_ref:
    tb.write_dtheta(ref, dtheta)


def _grads(mapping: KernelMapping, tiles_: Tiles, theta, rows: Side, cols: Side, r_lse, r_g,
           c_lse, c_g, *, own_rows: bool, columns: bool, theta_from_columns: bool = False):
  (m, d), k, launch = rows.vectors.shape, cols.vectors.shape[0], tiles_.backward
  own, other = (m, k) if own_rows else (k, m)
  blocks, parts = _grid(launch, tiles_, own, other)
  g = tb.geometry(launch, d, other // launch.block // parts, rows.vectors)
  block, dtype = launch.block, stats_dtype(rows.vectors)
  mine, theirs = (tb.own_block(block, d), tb.whole((other, d)))
  row_specs = [mine] + [tb.own_block(block)] * 6 if own_rows else [theirs] + [tb.whole((m,))] * 6
  col_specs = [theirs] + [tb.whole((k,))] * 5 if own_rows else [mine] + [tb.own_block(block)] * 5
  width = theta.shape[0]
  out_specs, out_shape = [_split_out(block, d, parts)], [jax.ShapeDtypeStruct(
      (parts, own, d)[parts == 1:], dtype)]
  if own_rows:
    out_specs.append(pl.BlockSpec((1, width), lambda i, s: (i * parts + s, 0)))
    out_shape.append(jax.ShapeDtypeStruct((blocks * parts, width), theta.dtype))
  out = tb.call(
      functools.partial(_grad_kernel, mapping, g, own_rows, columns, theta_from_columns), launch,
      grid=(blocks, parts), in_specs=[tb.whole(theta.shape), *row_specs, *col_specs],
      out_specs=out_specs, out_shape=out_shape,
      name="info_nce_lse_row_grad" if own_rows else "info_nce_lse_col_grad")(
          theta, *tb.anchor_arrays(rows), r_lse, r_g, *tb.candidate_arrays(cols), c_lse, c_g)
  grads = out[0] if parts == 1 else jnp.sum(out[0], axis=0)
  return grads, jnp.sum(out[1], axis=0) if own_rows else None


def row_grads(mapping: KernelMapping, tiles_: Tiles, theta, rows: Side, cols: Side, r_lse, r_g,
              c_lse, c_g, *, columns: bool, theta_from_columns: bool):
  """`(G_rows, dtheta)`: the row blocks' gradients with respect to their unit rows (in the
  statistics' dtype), and the mapping's summed over row blocks."""
  return _grads(mapping, tiles_, theta, rows, cols, r_lse, r_g, c_lse, c_g, own_rows=True,
                columns=columns, theta_from_columns=theta_from_columns)


def col_grads(mapping: KernelMapping, tiles_: Tiles, theta, rows: Side, cols: Side, r_lse, r_g,
              c_lse, c_g, *, columns: bool) -> jax.Array:
  """`G_cols`: the column blocks' gradients with respect to their unit rows."""
  return _grads(mapping, tiles_, theta, rows, cols, r_lse, r_g, c_lse, c_g, own_rows=False,
                columns=columns)[0]
