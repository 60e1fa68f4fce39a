r"""The fused InfoNCE kernels for TPUs (Mosaic): the column blocks as a sequential grid axis.

The same computation as the Triton kernels (`_kernel_triton`; the tile math both share is in
`_kernel_math`: `keep_mask`, `tile_cotangent`), in TPU's programming model: a grid
`(row blocks, column blocks)` whose second axis is walked in order on one core (`"arbitrary"`),
its `BlockSpec`s bringing one `[block, D]` tile of each side into VMEM per step (pipelined by
Mosaic), the running statistics and gradient accumulators in VMEM scratch, initialised at the
first column block and written out at the last. Per-row
values are `[block, 1]` blocks and per-column values `[1, block]` blocks (TPU tiles are
`8 x 128`: `block` is a multiple of 128); the mapping's scalars are in SMEM. The backward has a
row kernel (`dU`, and the mapping's parameter gradients, packed into the lanes of an `[8, 128]`
block per row block) and a column kernel (`dV`) with its grid transposed.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tfcl_jax.losses._engine._tiles import Side
from tfcl_jax.losses._kernels._kernel_math import (
  INDEX,
  KernelMapping,
  compiled_or_interpreted,
  keep_mask,
  load_theta,
  tile_cotangent,
  without_empty,
)

LANES = 128  # a TPU vector register is 8 x 128: blocks of rows are multiples of 128
DEFAULT_BLOCK = 256
PLATFORMS = ("tpu",)
_PACKED = (8, LANES)  # one row block's parameter gradients, in the lanes of row 0


@dataclasses.dataclass(frozen=True)
class Tiles:
  """`block` rows per grid step on each side; `D` is held whole (VMEM holds `[256, 768]`)."""

  block: int

  @property
  def columns(self) -> tuple[str, str]:
    return ("separate", "separate")  # no kernels that serve both sides of a tile

  def padded_dim(self, dim: int) -> int:
    return dim

  def blocks(self) -> set[int]:
    return {self.block}


def tiles(num_rows: int, num_cols: int, dim: int, block_size: int | None,
          dtype=None) -> Tiles:
  """`block`: `block_size` (default 256) rounded down to a multiple of 128, at least 128, at
  most the rows rounded up to a multiple of 128; `dtype` is unused (the Triton backend's tiles
  depend on it).

  Examples:
    >>> from tfcl_jax.losses._kernels import _kernel_tpu
    >>> _kernel_tpu.tiles(4096, 4096, 768, None), _kernel_tpu.tiles(100, 100, 8, None)
    (Tiles(block=256), Tiles(block=128))
  """
  del dim, dtype
  block = DEFAULT_BLOCK if block_size is None else block_size // LANES * LANES
  largest = -(-max(num_rows, num_cols) // LANES) * LANES
  return Tiles(max(LANES, min(block, largest)))


def _cos(r_ref, c_ref) -> jax.Array:
  return jax.lax.dot_general(r_ref[...], c_ref[...], (((1,), (1,)), ((), ())),
                             preferred_element_type=jnp.float32)


def _forward_kernel(mapping: KernelMapping, theta_ref, r_ref, r_ids_ref, r_pos_ref, r_valid_ref,
                   c_ref, c_ids_ref, c_valid_ref, lse_ref, m_ref, s_ref):
  """Grid `(i, j)`: folds tile `(i, j)` into row block `i`'s `(max, sum)`; `lse` at the end."""
  j = pl.program_id(1)
  start = mapping.fast.shift if mapping.fast is not None else -jnp.inf

  @pl.when(j == 0)
  def _():
    m_ref[...] = jnp.full(m_ref.shape, start, m_ref.dtype)
    s_ref[...] = jnp.zeros(s_ref.shape, s_ref.dtype)

  theta = load_theta(mapping, theta_ref)
  cos = _cos(r_ref, c_ref).astype(s_ref.dtype)
  keep = keep_mask(r_ids_ref[...], r_pos_ref[...], r_valid_ref[...], c_ids_ref[...],
                   c_valid_ref[...])
  if mapping.fast is not None:
    s_ref[...] += jnp.sum(jnp.where(keep, mapping.fast.weight(cos), 0.0), axis=1, keepdims=True)
  else:
    logits = jnp.where(keep, mapping.fn(cos, theta), -jnp.inf)
    m = m_ref[...]
    new_m = jnp.maximum(m, jnp.max(logits, axis=1, keepdims=True))
    safe = jnp.where(new_m > -jnp.inf, new_m, 0.0)
    s_ref[...] = s_ref[...] * jnp.exp(m - safe) + jnp.sum(
        jnp.where(keep, jnp.exp(logits - safe), 0.0), axis=1, keepdims=True)
    m_ref[...] = new_m

  @pl.when(j == pl.num_programs(1) - 1)
  def _():
    total = s_ref[...]
    nonempty = total != 0  # a NaN candidate gives NaN, not an empty row
    shift = m_ref[...] if mapping.fast is None else jnp.full(total.shape, start, total.dtype)
    lse_ref[...] = jnp.where(nonempty, shift + jnp.log(jnp.where(nonempty, total, 1.0)),
                             -jnp.inf)


def _pack(values, shape) -> jax.Array:
  """Scalars in the first lanes of row 0 of an `[8, 128]` block, zeros elsewhere."""
  lane = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
  row = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
  packed = jnp.zeros(shape, jnp.float32)
  for k, value in enumerate(values):
    packed = jnp.where((row == 0) & (lane == k), value.astype(jnp.float32), packed)
  return packed


def _tile_cotangent(mapping: KernelMapping, columns: bool, theta_from_columns: bool, theta_ref,
                    r_ref, r_ids_ref, r_pos_ref, r_valid_ref, r_lse_ref, r_g_ref, c_ref, c_ids_ref,
                    c_valid_ref, c_lse_ref, c_g_ref, dtype):
  """`(dS, dtheta)` of the grid step's tile, from the row and column blocks' refs."""
  cos = _cos(r_ref, c_ref).astype(dtype)
  keep = keep_mask(r_ids_ref[...], r_pos_ref[...], r_valid_ref[...], c_ids_ref[...],
                   c_valid_ref[...])
  r_lse, r_g = without_empty(r_lse_ref[...], r_g_ref[...])
  c_lse, c_g = without_empty(c_lse_ref[...], c_g_ref[...]) if columns else (None, None)
  return tile_cotangent(mapping, load_theta(mapping, theta_ref), cos, keep, r_lse, r_g, c_lse, c_g,
                        columns=columns, theta_from_columns=theta_from_columns)


def _row_grad_kernel(mapping: KernelMapping, columns: bool, theta_from_columns: bool, theta_ref,
                    r_ref, r_ids_ref, r_pos_ref, r_valid_ref, r_lse_ref, r_g_ref, c_ref,
                    c_ids_ref, c_valid_ref, c_lse_ref, c_g_ref, dr_ref, dtheta_ref, acc_ref,
                    dtheta_acc_ref):
  """Grid `(i, j)`: `dU_i += dS_ij V_j`; row block `i`'s share of `dtheta`."""
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _():
    acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)
    dtheta_acc_ref[...] = jnp.zeros(dtheta_acc_ref.shape, dtheta_acc_ref.dtype)

  dcos, dtheta = _tile_cotangent(mapping, columns, theta_from_columns, theta_ref, r_ref, r_ids_ref,
                                 r_pos_ref, r_valid_ref, r_lse_ref, r_g_ref, c_ref, c_ids_ref,
                                 c_valid_ref, c_lse_ref, c_g_ref, dr_ref.dtype)
  acc_ref[...] += jnp.dot(dcos.astype(c_ref.dtype), c_ref[...],
                          preferred_element_type=jnp.float32)
  if dtheta is not None:
    dtheta_acc_ref[...] += _pack(dtheta, dtheta_acc_ref.shape)

  @pl.when(j == pl.num_programs(1) - 1)
  def _():
    dr_ref[...] = acc_ref[...].astype(dr_ref.dtype)
    dtheta_ref[...] = dtheta_acc_ref[...].astype(dtheta_ref.dtype)


def _col_grad_kernel(mapping: KernelMapping, columns: bool, theta_ref, c_ref, c_ids_ref,
                    c_valid_ref, c_lse_ref, c_g_ref, r_ref, r_ids_ref, r_pos_ref, r_valid_ref,
                    r_lse_ref, r_g_ref, dc_ref, acc_ref):
  """Grid `(j, i)`: `dV_j += dS_ij^T U_i` (tiles in the row kernel's orientation)."""
  i = pl.program_id(1)

  @pl.when(i == 0)
  def _():
    acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

  dcos, _ = _tile_cotangent(mapping, columns, False, theta_ref, r_ref, r_ids_ref, r_pos_ref,
                            r_valid_ref, r_lse_ref, r_g_ref, c_ref, c_ids_ref, c_valid_ref,
                            c_lse_ref, c_g_ref, dc_ref.dtype)
  acc_ref[...] += jax.lax.dot_general(dcos.astype(r_ref.dtype), r_ref[...],
                                      (((0,), (0,)), ((), ())),
                                      preferred_element_type=jnp.float32)

  @pl.when(i == pl.num_programs(1) - 1)
  def _():
    dc_ref[...] = acc_ref[...].astype(dc_ref.dtype)


def _call(kernel, *, grid, scratch_shapes, **kwargs):
  return compiled_or_interpreted(
      kernel, platforms=PLATFORMS,
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=0, grid=grid, in_specs=kwargs.pop("in_specs"),
          out_specs=kwargs.pop("out_specs"), scratch_shapes=scratch_shapes),
      **kwargs)


def _smem():
  return pl.BlockSpec(memory_space=pltpu.SMEM)


def _by_rows(block: int, dim: int, axis: int):
  """A row block `[block, dim]` of the grid's `axis`-th index."""
  return pl.BlockSpec((block, dim), lambda *index: (index[axis], 0))


def _by_cols(block: int, axis: int):
  """A column block `[1, block]` of the grid's `axis`-th index."""
  return pl.BlockSpec((1, block), lambda *index: (0, index[axis]))


def _row_values(side: Side):
  return tuple(x.astype(INDEX)[:, None] for x in (side.ids, side.positive_ids, side.valid))


def _col_values(side: Side):
  return tuple(x.astype(INDEX)[None, :] for x in (side.ids, side.valid))


def forward(mapping: KernelMapping, tiles_: Tiles, theta, a: Side, b: Side) -> jax.Array:
  """Each row of `a`: the logsumexp of its negatives among the rows of `b`."""
  (m, d), k, block = a.vectors.shape, b.vectors.shape[0], tiles_.block
  rows, cols = _by_rows(block, d, 0), _by_rows(block, d, 1)
  row_value, col_value = _by_rows(block, 1, 0), _by_cols(block, 1)
  lse = _call(
      functools.partial(_forward_kernel, mapping), grid=(m // block, k // block),
      in_specs=[_smem(), rows, row_value, row_value, row_value, cols, col_value, col_value],
      out_specs=row_value, out_shape=jax.ShapeDtypeStruct((m, 1), a.vectors.dtype),
      scratch_shapes=[pltpu.VMEM((block, 1), jnp.float32)] * 2,
      name="info_nce_lse")(theta, a.vectors, *_row_values(a), b.vectors, *_col_values(b))
  return lse[:, 0]


def row_grads(mapping: KernelMapping, tiles_: Tiles, theta, rows: Side, cols: Side, r_lse, r_g,
              c_lse, c_g, *, columns: bool, theta_from_columns: bool):
  """`(dU, dtheta)`: the row blocks' gradients, and the mapping's summed over row blocks."""
  (m, d), k, block = rows.vectors.shape, cols.vectors.shape[0], tiles_.block
  row_block, col_block = _by_rows(block, d, 0), _by_rows(block, d, 1)
  row_value, col_value = _by_rows(block, 1, 0), _by_cols(block, 1)
  kernel = functools.partial(_row_grad_kernel, mapping, columns, theta_from_columns)
  blocks = m // block
  drows, dtheta = _call(
      kernel, grid=(blocks, k // block),
      in_specs=[_smem(), row_block, row_value, row_value, row_value, row_value, row_value,
                col_block, col_value, col_value, col_value, col_value],
      out_specs=[row_block, pl.BlockSpec(_PACKED, lambda i, j: (i, 0))],
      out_shape=[jax.ShapeDtypeStruct((m, d), rows.vectors.dtype),
                 jax.ShapeDtypeStruct((blocks * _PACKED[0], LANES), jnp.float32)],
      scratch_shapes=[pltpu.VMEM((block, d), jnp.float32), pltpu.VMEM(_PACKED, jnp.float32)],
      name="info_nce_lse_row_grad")(
          theta, rows.vectors, *_row_values(rows), r_lse[:, None], r_g[:, None], cols.vectors,
          *_col_values(cols), c_lse[None, :], c_g[None, :])
  dtheta = jnp.sum(dtheta[::_PACKED[0], :theta.shape[0]], axis=0).astype(theta.dtype)
  return drows, dtheta


def col_grads(mapping: KernelMapping, tiles_: Tiles, theta, rows: Side, cols: Side, r_lse, r_g,
              c_lse, c_g, *, columns: bool) -> jax.Array:
  """`dV`: the column blocks' gradients (grid `(column block, row block)`)."""
  (m, d), k, block = rows.vectors.shape, cols.vectors.shape[0], tiles_.block
  col_block, row_block = _by_rows(block, d, 0), _by_rows(block, d, 1)
  col_value, row_value = _by_cols(block, 0), _by_rows(block, 1, 1)
  return _call(
      functools.partial(_col_grad_kernel, mapping, columns), grid=(k // block, m // block),
      in_specs=[_smem(), col_block, col_value, col_value, col_value, col_value, row_block,
                row_value, row_value, row_value, row_value, row_value],
      out_specs=col_block, out_shape=jax.ShapeDtypeStruct((k, d), cols.vectors.dtype),
      scratch_shapes=[pltpu.VMEM((block, d), jnp.float32)],
      name="info_nce_lse_col_grad")(
          theta, cols.vectors, *_col_values(cols), c_lse[None, :], c_g[None, :], rows.vectors,
          *_row_values(rows), r_lse[:, None], r_g[:, None])
