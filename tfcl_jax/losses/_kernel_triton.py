r"""The fused InfoNCE kernels for GPUs (Triton): one program per row (or column) block.

A program holds one block of `block` rows and walks every block of the other side,
FlashAttention-2's layout: the tile `S = U_i V_j^T` is formed by a loop over `[block, block_d]`
chunks of the embedding dimension (so `D` = 768 never sits in fast memory whole), the map is
applied inside the tile, and the tile is folded into per-row statistics or, backward, chunk by
chunk into the program's own block of the gradient. No program writes another's output: no
atomics.

* `forward`: `lse_i = log sum_{j negative of i} exp(f(S_ij))`, an online logsumexp, or a plain
  sum of `w(S_ij) = exp(f(S_ij) - shift)` for maps with a closed form (`Mapping.exp_form`;
  Eq. 11's `w = (1 + c) / (1 - c)`);
* `row_grads`, `col_grads`: each tile recomputed and its cotangent (`_kernel_math`), then
  `dU_i = sum_j dS_ij V_j` (row programs, with the map's parameter gradients) and
  `dV_j = sum_i dS_ij^T U_i` (column programs).

Every shape a kernel touches is a power of two (Triton's rule): `N` is padded to whole blocks
with rows that are never anyone's candidate, and `D` to whole chunks with zeros. Triton's
block references are pointers into global memory: the other side is read tile by tile where
the loop needs it, never staged whole. Tile sizes and launch options were chosen by compiling
the kernels offline for sm_75-90 (`benchmarks/kernel_resources.py`): no register spills on
sm_90, at most 40 KiB of shared memory. They are not timed on a GPU.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from tfcl_jax.losses._kernel_math import (
    KernelMap,
    compiled_or_interpreted,
    keep_mask,
    load_theta,
    tile_cotangent,
    without_empty,
)
from tfcl_jax.losses._tiles import Side

DEFAULT_BLOCK = 64  # rows per program and per step
SMALLEST_BLOCK = 16  # Triton's `dot` needs every side >= 16
BLOCK_D = 32  # embedding columns per chunk of a tile
NUM_WARPS = 8
NUM_STAGES = 2
PLATFORMS = ("cuda", "rocm")


@dataclasses.dataclass(frozen=True)
class Tiles:
  """`block` rows per program and per step; `D` walked in chunks of `block_d`."""

  block: int
  block_d: int

  def padded_dim(self, dim: int) -> int:
    return -(-dim // self.block_d) * self.block_d


def _next_power_of_two(n: int) -> int:
  return 1 << max(0, n - 1).bit_length()


def _floor_power_of_two(n: int) -> int:
  return 1 << (n.bit_length() - 1)


def tiles(num_rows: int, num_cols: int, dim: int, block_size: int | None) -> Tiles:
  """The kernels' tiles, powers of two: `block` is `block_size` rounded down to a power of
  two (default 64), at most the padded number of rows, at least 16;
  `block_d = min(32, next power of two >= D)`, at least 16.

  Examples:
    >>> from tfcl_jax.losses import _kernel_triton
    >>> _kernel_triton.tiles(4096, 4096, 768, None)
    Tiles(block=64, block_d=32)
    >>> _kernel_triton.tiles(21, 21, 6, 16)
    Tiles(block=16, block_d=16)
  """
  block_d = min(BLOCK_D, max(SMALLEST_BLOCK, _next_power_of_two(dim)))
  block = DEFAULT_BLOCK if block_size is None else _floor_power_of_two(block_size)
  block = min(block, _next_power_of_two(max(num_rows, num_cols)))
  return Tiles(max(block, SMALLEST_BLOCK), block_d)


@dataclasses.dataclass(frozen=True)
class _Geometry:
  """Static tile geometry: `block` rows per program and per step, `D` in `chunks` of
  `block_d` columns, `steps` blocks of the other side."""

  block: int
  block_d: int
  chunks: int
  steps: int


def _columns(geometry: _Geometry, c) -> pl.Slice | slice:
  return pl.ds(pl.multiple_of(c * geometry.block_d, geometry.block_d), geometry.block_d)


def _over_chunks(geometry: _Geometry, body, init):
  """`body(c, carry)` for each chunk `c` of `D`: a loop, so that one chunk's buffers serve
  them all (unrolled, every chunk's operands would take their own shared memory)."""
  if geometry.chunks == 1:
    return body(0, init)
  return jax.lax.fori_loop(0, geometry.chunks, body, init)


def _tile_cos(a_ref, a_start, b_ref, b_start, geometry: _Geometry) -> jax.Array:
  """`S = A B^T` for the row blocks of `a_ref` and `b_ref` starting at `a_start`, `b_start`."""
  rows_a, rows_b = pl.ds(a_start, geometry.block), pl.ds(b_start, geometry.block)

  def add(c, cos):
    d = _columns(geometry, c)
    return cos + jax.lax.dot_general(a_ref[rows_a, d], b_ref[rows_b, d],
                                     (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32)

  return _over_chunks(geometry, add, jnp.zeros((geometry.block, geometry.block), jnp.float32))


def _zero(out_ref, geometry: _Geometry):
  def clear(c, carry):
    out_ref[:, _columns(geometry, c)] = jnp.zeros((geometry.block, geometry.block_d),
                                                  out_ref.dtype)
    return carry

  _over_chunks(geometry, clear, 0)


def _accumulate(out_ref, product, geometry: _Geometry):
  """`out += product(d)` chunk by chunk: the program's own output block is its accumulator
  (Triton has no scratch memory; no other program writes this block)."""
  def add(c, carry):
    d = _columns(geometry, c)
    out_ref[:, d] = out_ref[:, d] + product(d).astype(out_ref.dtype)
    return carry

  _over_chunks(geometry, add, 0)


def _rows(x):
  return x[:, None]


def _cols(x):
  return x[None, :]


def _forward_kernel(kmap: KernelMap, geometry: _Geometry, theta_ref, r_ref, r_ids_ref, r_pos_ref,
                   r_valid_ref, c_ref, c_ids_ref, c_valid_ref, lse_ref):
  """One row block's logsumexp over every column block (grid: row blocks)."""
  block, dtype = geometry.block, lse_ref.dtype
  theta = load_theta(kmap, theta_ref)
  r_ids, r_pos, r_valid = (_rows(r[...]) for r in (r_ids_ref, r_pos_ref, r_valid_ref))

  def tile(j):
    start = j * block
    cos = _tile_cos(r_ref, 0, c_ref, start, geometry).astype(dtype)
    span = pl.ds(start, block)
    return cos, keep_mask(r_ids, r_pos, r_valid, _cols(c_ids_ref[span]),
                          _cols(c_valid_ref[span]))

  if kmap.fast is not None:
    def add(j, total):
      cos, keep = tile(j)
      return total + jnp.sum(jnp.where(keep, kmap.fast.weight(cos), 0.0), axis=1)

    total = jax.lax.fori_loop(0, geometry.steps, add, jnp.zeros((block,), dtype))
    shift = jnp.full((block,), kmap.fast.shift, dtype)
  else:
    def fold(j, carry):
      m, total = carry
      cos, keep = tile(j)
      logits = jnp.where(keep, kmap.fn(cos, theta), -jnp.inf)
      new_m = jnp.maximum(m, jnp.max(logits, axis=1))
      # A row with no candidate yet keeps m = -inf: shift by 0 there to avoid inf - inf.
      safe = jnp.where(new_m > -jnp.inf, new_m, 0.0)
      total = total * jnp.exp(m - safe) + jnp.sum(
          jnp.where(keep, jnp.exp(logits - safe[:, None]), 0.0), axis=1)
      return new_m, total

    shift, total = jax.lax.fori_loop(
        0, geometry.steps, fold,
        (jnp.full((block,), -jnp.inf, dtype), jnp.zeros((block,), dtype)))
  nonempty = total > 0
  lse_ref[...] = jnp.where(nonempty, shift + jnp.log(jnp.where(nonempty, total, 1.0)),
                           -jnp.inf)


def _row_grad_kernel(kmap: KernelMap, geometry: _Geometry, columns: bool,
                    theta_from_columns: bool, theta_ref, r_ref, r_ids_ref, r_pos_ref,
                    r_valid_ref, r_lse_ref, r_g_ref, c_ref, c_ids_ref, c_valid_ref, c_lse_ref,
                    c_g_ref, dr_ref, dtheta_ref):
  """`dU_i = sum_j dS_ij V_j` for one row block, and its share of `dtheta`."""
  block, dtype = geometry.block, dr_ref.dtype
  theta = load_theta(kmap, theta_ref)
  r_ids, r_pos, r_valid = (_rows(r[...]) for r in (r_ids_ref, r_pos_ref, r_valid_ref))
  r_lse, r_g = without_empty(_rows(r_lse_ref[...]), _rows(r_g_ref[...]))
  _zero(dr_ref, geometry)

  def body(j, dtheta):
    start = j * block
    span = pl.ds(start, block)
    cos = _tile_cos(r_ref, 0, c_ref, start, geometry).astype(dtype)
    keep = keep_mask(r_ids, r_pos, r_valid, _cols(c_ids_ref[span]), _cols(c_valid_ref[span]))
    c_lse, c_g = (without_empty(_cols(c_lse_ref[span]), _cols(c_g_ref[span])) if columns
                  else (None, None))
    dcos, dth = tile_cotangent(kmap, theta, cos, keep, r_lse, r_g, c_lse, c_g,
                               columns=columns, theta_from_columns=theta_from_columns)
    dcos = dcos.astype(c_ref.dtype)
    _accumulate(dr_ref, lambda d: jnp.dot(dcos, c_ref[span, d],
                                          preferred_element_type=jnp.float32), geometry)
    if dth is None:
      return dtheta
    return tuple(t + x for t, x in zip(dtheta, dth, strict=True))

  dtheta = jax.lax.fori_loop(0, geometry.steps, body,
                             tuple(jnp.zeros((), dtype) for _ in range(kmap.num_theta)))
  for k, value in enumerate(dtheta):
    dtheta_ref[0, k] = value


def _col_grad_kernel(kmap: KernelMap, geometry: _Geometry, columns: bool, theta_ref, c_ref,
                    c_ids_ref, c_valid_ref, c_lse_ref, c_g_ref, r_ref, r_ids_ref, r_pos_ref,
                    r_valid_ref, r_lse_ref, r_g_ref, dc_ref):
  """`dV_j = sum_i dS_ij^T U_i` for one column block (the tiles in the row kernel's
  orientation, so both kernels compute the same `dS`)."""
  block, dtype = geometry.block, dc_ref.dtype
  theta = load_theta(kmap, theta_ref)
  c_ids, c_valid = _cols(c_ids_ref[...]), _cols(c_valid_ref[...])
  c_lse, c_g = (without_empty(_cols(c_lse_ref[...]), _cols(c_g_ref[...])) if columns
                else (None, None))
  _zero(dc_ref, geometry)

  def body(i, carry):
    start = i * block
    span = pl.ds(start, block)
    cos = _tile_cos(r_ref, start, c_ref, 0, geometry).astype(dtype)
    keep = keep_mask(_rows(r_ids_ref[span]), _rows(r_pos_ref[span]), _rows(r_valid_ref[span]),
                     c_ids, c_valid)
    r_lse, r_g = without_empty(_rows(r_lse_ref[span]), _rows(r_g_ref[span]))
    dcos, _ = tile_cotangent(kmap, theta, cos, keep, r_lse, r_g, c_lse, c_g,
                             columns=columns, theta_from_columns=False)
    dcos = dcos.astype(r_ref.dtype)
    _accumulate(dc_ref, lambda d: jax.lax.dot_general(
        dcos, r_ref[span, d], (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32),
        geometry)
    return carry

  jax.lax.fori_loop(0, geometry.steps, body, 0)


def _call(kernel, **kwargs):
  return compiled_or_interpreted(
      kernel, platforms=PLATFORMS,
      compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES),
      **kwargs)


def _block_rows(block: int, dim: int | None = None):
  shape = (block,) if dim is None else (block, dim)
  return pl.BlockSpec(shape, lambda i: (i,) + (0,) * (len(shape) - 1))


def _whole(shape):
  return pl.BlockSpec(shape, lambda i: (0,) * len(shape))


def _side_arrays(side: Side):
  return side.vectors, side.ids, side.positive_ids, side.valid.astype(jnp.int32)


def forward(kmap: KernelMap, tiles_: Tiles, theta, a: Side, b: Side) -> jax.Array:
  """Each row of `a`: the logsumexp of its negatives among the rows of `b`."""
  (m, d), k = a.vectors.shape, b.vectors.shape[0]
  geometry = _Geometry(tiles_.block, tiles_.block_d, d // tiles_.block_d, k // tiles_.block)
  row, vec = _block_rows(tiles_.block, d), _block_rows(tiles_.block)
  return _call(
      functools.partial(_forward_kernel, kmap, geometry), grid=(m // tiles_.block,),
      in_specs=[_whole(theta.shape), row, vec, vec, vec, _whole((k, d)), _whole((k,)),
                _whole((k,))],
      out_specs=vec, out_shape=jax.ShapeDtypeStruct((m,), a.vectors.dtype),
      name="info_nce_lse")(theta, *_side_arrays(a), b.vectors, b.ids,
                           b.valid.astype(jnp.int32))


def row_grads(kmap: KernelMap, tiles_: Tiles, theta, rows: Side, cols: Side, r_lse, r_g, c_lse,
              c_g, *, columns: bool, theta_from_columns: bool):
  """`(dU, dtheta)`: the row blocks' gradients, and the map's summed over row blocks."""
  (m, d), k = rows.vectors.shape, cols.vectors.shape[0]
  geometry = _Geometry(tiles_.block, tiles_.block_d, d // tiles_.block_d, k // tiles_.block)
  row, vec = _block_rows(tiles_.block, d), _block_rows(tiles_.block)
  blocks, width = m // tiles_.block, theta.shape[0]
  kernel = functools.partial(_row_grad_kernel, kmap, geometry, columns, theta_from_columns)
  drows, dtheta = _call(
      kernel, grid=(blocks,),
      in_specs=[_whole(theta.shape), row, vec, vec, vec, vec, vec, _whole((k, d)),
                _whole((k,)), _whole((k,)), _whole((k,)), _whole((k,))],
      out_specs=[row, pl.BlockSpec((1, width), lambda i: (i, 0))],
      out_shape=[jax.ShapeDtypeStruct((m, d), rows.vectors.dtype),
                 jax.ShapeDtypeStruct((blocks, width), theta.dtype)],
      name="info_nce_lse_row_grad")(theta, *_side_arrays(rows), r_lse, r_g, cols.vectors,
                                    cols.ids, cols.valid.astype(jnp.int32), c_lse, c_g)
  return drows, jnp.sum(dtheta, axis=0)


def col_grads(kmap: KernelMap, tiles_: Tiles, theta, rows: Side, cols: Side, r_lse, r_g, c_lse,
              c_g, *, columns: bool) -> jax.Array:
  """`dV`: the column blocks' gradients."""
  (m, d), k = rows.vectors.shape, cols.vectors.shape[0]
  geometry = _Geometry(tiles_.block, tiles_.block_d, d // tiles_.block_d, m // tiles_.block)
  col, vec = _block_rows(tiles_.block, d), _block_rows(tiles_.block)
  return _call(
      functools.partial(_col_grad_kernel, kmap, geometry, columns),
      grid=(k // tiles_.block,),
      in_specs=[_whole(theta.shape), col, vec, vec, vec, vec, _whole((m, d)), _whole((m,)),
                _whole((m,)), _whole((m,)), _whole((m,)), _whole((m,))],
      out_specs=col, out_shape=jax.ShapeDtypeStruct((k, d), cols.vectors.dtype),
      name="info_nce_lse_col_grad")(theta, cols.vectors, cols.ids,
                                    cols.valid.astype(jnp.int32), c_lse, c_g,
                                    *_side_arrays(rows), r_lse, r_g)
