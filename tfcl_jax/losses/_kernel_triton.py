r"""The fused InfoNCE kernels for GPUs (Triton): one program per row (or column) block.

A program holds one block of `block` rows and walks every block of the other side,
FlashAttention-2's layout:

* its own block of embeddings is loaded once, before the loop, and each tile
  `S = U_i V_j^T` is one matrix product over the whole embedding dimension when `D` (padded to
  a power of two) is at most `WHOLE_D` (256 for bfloat16 inputs, 128 for float32); wider
  embeddings are walked in chunks of `CHUNK_D`;
* the mapping is applied inside the tile, and the tile is folded into per-row statistics or,
  backward, into the program's gradient block, which is a loop carry (registers) when `D` is
  held whole and the program's own output block beyond that;
* here no program writes another's output: no atomics.

Kernels:

* `forward`: `lse_i = log sum_{j negative of i} exp(f(S_ij))`, an online logsumexp, or a plain
  sum of `w(S_ij) = exp(f(S_ij) - shift)` for mappings with a closed form (`Mapping.exp_form`;
  Eq. 11's `w = (1 + c) / (1 - c)`);
* `row_grads`: each tile recomputed and its cotangent (`_kernel_math`), then
  `dU_i = sum_j dS_ij V_j` with the mapping's parameter gradients (the anchors' gradient against a
  bank of extra negatives, which takes none).

The kernels that serve both sides of a tile, writing across programs, are
`_kernel_triton_pairs`'s: `negatives="all"`'s symmetric tiles, the two-tower loss's row and
column statistics from one pass, and one backward for both sides.

Raw rows (bfloat16 inputs, `_pallas`): a side's vectors may be the raw rows `z` with float32
inverse norms `r = 1 / ||z||`, so that `S_ij = r_i r_j (z_i . z_j)`: the products run on
bfloat16 tensor cores with float32 accumulation and no normalised vector is ever rounded to
bfloat16. Backward, the products take `dS_ij r_j` in bfloat16 and give the gradient with
respect to the unit rows, `G_i = sum_j dS_ij u_j`, in float32; `_pallas` carries it through
the normalisation. Float32 sides are unit rows (`r = 1`), and their products are TF32, as
XLA's default on the same GPUs.

Every shape a kernel touches is a power of two (Triton's rule): `N` is padded to whole blocks
with rows that are never anyone's candidate, and `D` with zeros. Tiles and launch options are
`_triton_tiles`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from types import ModuleType

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from tfcl_jax.losses._kernel_math import (
    INDEX,
    KernelMapping,
    compiled_or_interpreted,
    keep_mask,
    load_theta,
    loop,
    tile_cotangent,
    without_empty,
)
from tfcl_jax.losses._tiles import Side
from tfcl_jax.losses._triton_tiles import (  # noqa: F401 - `tiles`: the backend's, for _pallas
    Tiles,
    inverse_norms,
    is_raw,
    stats_dtype,
    tiles,
)

PLATFORMS = ("cuda", "rocm")
TRITON = "jax.experimental.pallas.triton"


def backend() -> ModuleType:
  """Pallas's Triton backend, imported when a kernel is built, not with this module: it is
  deprecated since jax 0.11 and will be removed, and its absence must leave `tfcl_jax` and
  `implementation="xla"` working (`unavailable` says why the kernels cannot run)."""
  return importlib.import_module(TRITON)


@functools.cache
def unavailable() -> str | None:
  """Why these kernels cannot run with the installed jax, or None; checked once per process.

  The Triton backend must import (Pallas's interpreter runs its primitives on a CPU too) and,
  where JAX's default backend is a GPU, compile a kernel there.
  """
  try:
    triton = backend()
  except ImportError as error:
    return f"jax {jax.__version__} cannot import {TRITON} ({error})"
  if jax.default_backend() != "gpu":
    return None

  def add_one(x_ref, out_ref):
    out_ref[...] = x_ref[...] + 1.0

  x = jax.ShapeDtypeStruct((16,), jnp.float32)
  try:
    jax.jit(pl.pallas_call(add_one, out_shape=x, compiler_params=triton.CompilerParams(
        num_warps=1, num_stages=1))).lower(x).compile()
  except Exception as error:  # noqa: BLE001 - whatever the cause, these kernels cannot run
    return (f"jax {jax.__version__} cannot compile a kernel with {TRITON} on "
            f"{jax.devices()[0].device_kind} ({type(error).__name__}: {error})")
  return None


@dataclasses.dataclass(frozen=True)
class _Geometry:
  """Static tile geometry: `block` rows per program and per step, `D` in `chunks` of
  `block_d` columns, `steps` blocks of the other side; `scaled`: raw rows with inverse
  norms."""

  block: int
  block_d: int
  chunks: int
  steps: int
  scaled: bool

  @property
  def whole(self) -> bool:
    return self.chunks == 1


def _geometry(tiles_: Tiles, dim: int, other: int, vectors, block_d: int | None = None
              ) -> _Geometry:
  block_d = block_d or tiles_.block_d
  return _Geometry(tiles_.block, block_d, dim // block_d, other // tiles_.block,
                   is_raw(vectors))


def _span(g: _Geometry, j):
  return pl.ds(pl.multiple_of(j * g.block, g.block), g.block)


def _columns(g: _Geometry, c):
  return pl.ds(pl.multiple_of(c * g.block_d, g.block_d), g.block_d)


def _over_chunks(g: _Geometry, body, init):
  """`body(c, carry)` for each chunk `c` of `D`, as a loop: one chunk's buffers serve them all
  (unrolled, every chunk's operands would take their own shared memory)."""
  return loop(0, g.chunks, body, init)


def _dot_t(a, b) -> jax.Array:
  """`a b^T` with float32 accumulation."""
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _raw_products(g: _Geometry, a_ref, a_span, b_ref, b_span, a, b) -> jax.Array:
  """`A B^T` of the blocks `a_ref[a_span]` and `b_ref[b_span]`: `a` and `b` are those blocks
  already loaded (whole `D`), else `D` is walked in chunks."""
  if g.whole:
    return _dot_t(a, b)

  def add(c, acc):
    d = _columns(g, c)
    return acc + _dot_t(a_ref[a_span, d], b_ref[b_span, d])

  return _over_chunks(g, add, jnp.zeros((g.block, g.block), jnp.float32))


def _cos(g: _Geometry, raw, r_scale, c_scale) -> jax.Array:
  # Scaling after the product: the unit rows are never rounded to the inputs' precision.
  return raw * r_scale * c_scale if g.scaled else raw


def _whole_block(g: _Geometry, ref, span):
  return ref[span, :] if g.whole else None


def _zero(out_ref, g: _Geometry):
  def clear(c, carry):
    out_ref[:, _columns(g, c)] = jnp.zeros((g.block, g.block_d), out_ref.dtype)
    return carry

  _over_chunks(g, clear, 0)


def _accumulate(out_ref, product, g: _Geometry):
  """`out += product(d)` chunk by chunk, for `D > WHOLE_D` where a `[block, D]` float32
  accumulator would not fit in registers: the program's own output block is its accumulator
  (no other program writes it)."""
  def add(c, carry):
    d = _columns(g, c)
    out_ref[:, d] = out_ref[:, d] + product(d)
    return carry

  _over_chunks(g, add, 0)


def _add_product(acc, lhs, cols, c_ref, span, out_ref, g: _Geometry):
  """`acc + lhs @ columns`: with the columns loaded whole (`cols`) into the loop carry `acc`,
  else chunk by chunk into the program's own output block `out_ref` (`_accumulate`)."""
  if g.whole:
    assert cols is not None  # loaded whole by the caller
    return acc + jnp.dot(lhs, cols, preferred_element_type=jnp.float32)
  _accumulate(out_ref, lambda d: jnp.dot(lhs, c_ref[span, d],
                                         preferred_element_type=jnp.float32), g)
  return acc


def _rows(x):
  return x[:, None]


def _cols(x):
  return x[None, :]


_ALL = slice(None)


def _forward_kernel(mapping: KernelMapping, g: _Geometry, theta_ref, r_ref, r_scale_ref, r_ids_ref,
                   r_pos_ref, r_valid_ref, c_ref, c_scale_ref, c_ids_ref, c_valid_ref, lse_ref):
  """One row block's logsumexp over every column block (grid: row blocks)."""
  block, dtype = g.block, lse_ref.dtype
  theta = load_theta(mapping, theta_ref)
  r_ids, r_pos, r_valid = (_rows(r[...]) for r in (r_ids_ref, r_pos_ref, r_valid_ref))
  r_scale = _rows(r_scale_ref[...])
  rows = _whole_block(g, r_ref, _ALL)  # loaded once, for every column block

  def tile(j):
    span = _span(g, j)
    raw = _raw_products(g, r_ref, _ALL, c_ref, span, rows, _whole_block(g, c_ref, span))
    cos = _cos(g, raw, r_scale, _cols(c_scale_ref[span])).astype(dtype)
    return cos, keep_mask(r_ids, r_pos, r_valid, _cols(c_ids_ref[span]),
                          _cols(c_valid_ref[span]))

  if mapping.fast is not None:
    def add(j, total):
      cos, keep = tile(j)
      return total + jnp.sum(jnp.where(keep, mapping.fast.weight(cos), 0.0), axis=1)

    total = loop(0, g.steps, add, jnp.zeros((block,), dtype))
    shift = jnp.full((block,), mapping.fast.shift, dtype)
  else:
    def fold(j, carry):
      m, total = carry
      cos, keep = tile(j)
      logits = jnp.where(keep, mapping.fn(cos, theta), -jnp.inf)
      new_m = jnp.maximum(m, jnp.max(logits, axis=1))
      # A row with no candidate yet keeps m = -inf: shift by 0 there to avoid inf - inf.
      safe = jnp.where(new_m > -jnp.inf, new_m, 0.0)
      total = total * jnp.exp(m - safe) + jnp.sum(
          jnp.where(keep, jnp.exp(logits - safe[:, None]), 0.0), axis=1)
      return new_m, total

    shift, total = loop(
        0, g.steps, fold, (jnp.full((block,), -jnp.inf, dtype), jnp.zeros((block,), dtype)))
  nonempty = total > 0
  lse_ref[...] = jnp.where(nonempty, shift + jnp.log(jnp.where(nonempty, total, 1.0)),
                           -jnp.inf)


def _finish(g: _Geometry, out_ref, acc):
  if g.whole:
    out_ref[...] = acc.astype(out_ref.dtype)


def _row_grad_kernel(mapping: KernelMapping, g: _Geometry, columns: bool, theta_from_columns: bool,
                    theta_ref, r_ref, r_scale_ref, r_ids_ref, r_pos_ref, r_valid_ref, r_lse_ref,
                    r_g_ref, c_ref, c_scale_ref, c_ids_ref, c_valid_ref, c_lse_ref, c_g_ref,
                    dr_ref, dtheta_ref):
  """`dU_i = sum_j dS_ij V_j` for one row block, and its share of `dtheta`."""
  dtype = dtheta_ref.dtype
  theta = load_theta(mapping, theta_ref)
  r_ids, r_pos, r_valid = (_rows(r[...]) for r in (r_ids_ref, r_pos_ref, r_valid_ref))
  r_lse, r_g = without_empty(_rows(r_lse_ref[...]), _rows(r_g_ref[...]))
  r_scale = _rows(r_scale_ref[...])
  rows = _whole_block(g, r_ref, _ALL)
  if not g.whole:
    _zero(dr_ref, g)

  def body(j, carry):
    acc, dtheta = carry
    span = _span(g, j)
    cols = _whole_block(g, c_ref, span)  # one load for the tile and for the product
    c_scale = _cols(c_scale_ref[span])
    cos = _cos(g, _raw_products(g, r_ref, _ALL, c_ref, span, rows, cols), r_scale,
               c_scale).astype(dtype)
    keep = keep_mask(r_ids, r_pos, r_valid, _cols(c_ids_ref[span]), _cols(c_valid_ref[span]))
    c_lse, c_g = (without_empty(_cols(c_lse_ref[span]), _cols(c_g_ref[span])) if columns
                  else (None, None))
    dcos, dth = tile_cotangent(mapping, theta, cos, keep, r_lse, r_g, c_lse, c_g,
                               columns=columns, theta_from_columns=theta_from_columns)
    # Raw columns: G_i = sum_j dS_ij r_j z_j, the gradient for the unit rows.
    dcos = (dcos * c_scale if g.scaled else dcos).astype(c_ref.dtype)
    acc = _add_product(acc, dcos, cols, c_ref, span, dr_ref, g)
    if dth is not None:
      dtheta = tuple(t + x for t, x in zip(dtheta, dth, strict=True))
    return acc, dtheta

  acc = jnp.zeros((g.block, g.block_d), jnp.float32) if g.whole else None
  acc, dtheta = loop(
      0, g.steps, body, (acc, tuple(jnp.zeros((), dtype) for _ in range(mapping.num_theta))))
  _finish(g, dr_ref, acc)
  for k, value in enumerate(dtheta):
    dtheta_ref[0, k] = value


def _call(kernel, tiles_: Tiles, **kwargs):
  return compiled_or_interpreted(
      kernel, platforms=PLATFORMS,
      compiler_params=backend().CompilerParams(num_warps=tiles_.num_warps,
                                               num_stages=tiles_.num_stages),
      **kwargs)


def _block_rows(block: int, dim: int | None = None):
  shape = (block,) if dim is None else (block, dim)
  return pl.BlockSpec(shape, lambda i: (i,) + (0,) * (len(shape) - 1))


def _whole(shape):
  return pl.BlockSpec(shape, lambda i: (0,) * len(shape))


def _anchor_arrays(side: Side):
  return (side.vectors, inverse_norms(side.vectors), *_indices(side.ids, side.positive_ids,
                                                                side.valid))


def _candidate_arrays(side: Side):
  return (side.vectors, inverse_norms(side.vectors), *_indices(side.ids, side.valid))


def _indices(*arrays):
  return tuple(x.astype(INDEX) for x in arrays)


def forward(mapping: KernelMapping, tiles_: Tiles, theta, a: Side, b: Side) -> jax.Array:
  """Each row of `a`: the logsumexp of its negatives among the rows of `b`."""
  (m, d), k = a.vectors.shape, b.vectors.shape[0]
  g = _geometry(tiles_, d, k, a.vectors)
  row, vec = _block_rows(tiles_.block, d), _block_rows(tiles_.block)
  return _call(
      functools.partial(_forward_kernel, mapping, g), tiles_, grid=(m // tiles_.block,),
      in_specs=[_whole(theta.shape), row, vec, vec, vec, vec, _whole((k, d)), _whole((k,)),
                _whole((k,)), _whole((k,))],
      out_specs=vec, out_shape=jax.ShapeDtypeStruct((m,), stats_dtype(a.vectors)),
      name="info_nce_lse")(theta, *_anchor_arrays(a), *_candidate_arrays(b))


def row_grads(mapping: KernelMapping, tiles_: Tiles, theta, rows: Side, cols: Side, r_lse, r_g,
              c_lse, c_g, *, columns: bool, theta_from_columns: bool):
  """`(G_rows, dtheta)`: the row blocks' gradients with respect to their unit rows (in the
  statistics' dtype), and the mapping's summed over row blocks."""
  (m, d), k = rows.vectors.shape, cols.vectors.shape[0]
  g = _geometry(tiles_, d, k, rows.vectors)
  row, vec = _block_rows(tiles_.block, d), _block_rows(tiles_.block)
  blocks, width = m // tiles_.block, theta.shape[0]
  kernel = functools.partial(_row_grad_kernel, mapping, g, columns, theta_from_columns)
  drows, dtheta = _call(
      kernel, tiles_, grid=(blocks,),
      in_specs=[_whole(theta.shape), row, vec, vec, vec, vec, vec, vec, _whole((k, d)),
                _whole((k,)), _whole((k,)), _whole((k,)), _whole((k,)), _whole((k,))],
      out_specs=[row, pl.BlockSpec((1, width), lambda i: (i, 0))],
      out_shape=[jax.ShapeDtypeStruct((m, d), stats_dtype(rows.vectors)),
                 jax.ShapeDtypeStruct((blocks, width), theta.dtype)],
      name="info_nce_lse_row_grad")(theta, *_anchor_arrays(rows), r_lse, r_g,
                                    *_candidate_arrays(cols), c_lse, c_g)
  return drows, jnp.sum(dtheta, axis=0)
