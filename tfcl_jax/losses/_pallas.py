r"""The fused Pallas path of InfoNCE's in-batch logsumexp: Triton on GPUs, interpreted on CPU.

`info_nce(..., implementation="pallas")` hands the logsumexp of every row's (and, for CLIP's
two-tower loss, every column's) negatives to the kernels of `_kernel`: a grid over row blocks,
each program walking the column blocks with the mapping applied inside the tile and an online
logsumexp (FlashAttention-2's forward); the backward recomputes each tile in two kernels, one
over row blocks (`dU`, and the map's parameter gradients) and one over column blocks (`dV`),
so that no two programs write the same output (no atomics). Only `[block, block_d]` tiles
and one block of accumulators live in fast memory; `D` is walked in chunks of `block_d`.

Which compiler, and why. On GPUs the kernels are compiled by Triton, chosen explicitly
(`pallas.triton.CompilerParams`) rather than by JAX's default GPU backend: Triton's block
refs are pointers into global memory, so the other side's `[K, D]` matrix is read tile by
tile where the loop needs it, and the same kernel runs on NVIDIA and AMD GPUs. Mosaic GPU,
JAX's default, stages every block of a `BlockSpec` in shared memory (228 KiB on an H100):
the whole other side would have to fit there, and the pipelining it needs instead is
Hopper/Blackwell-specific. Triton requires power-of-two shapes: the tile side `block` is a
power of two, `N` is padded to whole blocks with rows that are no one's candidate and `D` to
whole chunks with zeros (one O(N D) copy; exact).

Where it runs. The choice between the compiled kernel and Pallas's interpreter follows the
platform the program is lowered for (`jax.lax.platform_dependent`), not the host:
lowering for `cuda` or `rocm` on a CPU host yields the Triton kernels' custom calls, and
running on a CPU interprets the same kernels (slow: for tests). On TPU the call runs the XLA
engine (`_engine.tile_reduce`), same numbers: these kernels are written for Triton's
programming model (a sequential loop per program over refs in global memory); a Mosaic TPU
version would walk the column blocks as a sequential grid axis with VMEM accumulators
instead, and is not written. One JAX limit: a program lowered for several platforms at once
(`jax.export(..., platforms=("cpu", "cuda"))`) cannot hold the kernel, since JAX lowers the
Triton call for every platform in the set; lower for one platform at a time.

Tile sizes are starting points, not measured on a GPU (none was available): `block = 64`
rows (FlashAttention-2's forward uses 64-128 on A100/H100), `block_d = 64`, 4 warps, 2
pipeline stages; for wide embeddings the block shrinks so that one program's gradient
accumulators (`block x D` float32) stay within 16 K values.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from tfcl_jax.losses import _engine
from tfcl_jax.losses._kernel import (
    Geometry,
    KernelMap,
    col_grad_kernel,
    forward_kernel,
    row_grad_kernel,
)
from tfcl_jax.losses._tiles import LogSumExp, Side

KINDS = ("rows", "rows_and_columns", "symmetric")

DEFAULT_BLOCK = 64  # rows per program and per step
SMALLEST_BLOCK = 16  # Triton's `dot` needs every side >= 16
_BLOCK_D = 32  # embedding columns per chunk of a tile
_NUM_WARPS = 8
_NUM_STAGES = 2


def _next_power_of_two(n: int) -> int:
  return 1 << max(0, n - 1).bit_length()


def _floor_power_of_two(n: int) -> int:
  return 1 << (n.bit_length() - 1)


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Static description of one fused computation."""

  kmap: KernelMap
  kind: str
  block: int
  block_d: int
  column_grad: bool
  step_index: int  # theta's entry that holds the step


def tile_geometry(num_rows: int, num_cols: int, dim: int, block_size: int | None
                  ) -> tuple[int, int]:
  """`(block, block_d)`: the kernels' tile side and embedding chunk, powers of two.

  `block` is `block_size` rounded down to a power of two (default 64), at most the padded
  number of rows, at least 16; `block_d = min(32, next power of two >= D)`, at least 16.

  Examples:
    >>> from tfcl_jax.losses._pallas import tile_geometry
    >>> tile_geometry(4096, 4096, 128, None), tile_geometry(4096, 4096, 768, None)
    ((64, 32), (64, 32))
    >>> tile_geometry(21, 21, 6, 16)
    (16, 16)
  """
  block_d = min(_BLOCK_D, max(SMALLEST_BLOCK, _next_power_of_two(dim)))
  block = DEFAULT_BLOCK if block_size is None else _floor_power_of_two(block_size)
  block = min(block, _next_power_of_two(max(num_rows, num_cols)))
  return max(block, SMALLEST_BLOCK), block_d


def _pallas_call(kernel, *, grid, in_specs, out_specs, out_shape, name):
  """`pl.pallas_call` compiled by Triton where the program is lowered for a GPU, and
  interpreted where it is lowered for the CPU."""

  def run(interpret, *args):
    params = {} if interpret else {"compiler_params": pltriton.CompilerParams(
        num_warps=_NUM_WARPS, num_stages=_NUM_STAGES)}
    return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                          out_shape=out_shape, interpret=interpret, name=name, **params)(*args)

  def call(*args):
    return jax.lax.platform_dependent(*args, cpu=functools.partial(run, True),
                                      cuda=functools.partial(run, False),
                                      rocm=functools.partial(run, False))

  return call


def _block_rows(block: int, dim: int | None = None):
  shape = (block,) if dim is None else (block, dim)
  return pl.BlockSpec(shape, lambda i: (i,) + (0,) * (len(shape) - 1))


def _whole(shape):
  return pl.BlockSpec(shape, lambda i: (0,) * len(shape))


def _side_arrays(side: Side):
  return side.vectors, side.ids, side.positive_ids, side.valid.astype(jnp.int32)


def _forward(plan: _Plan, theta, a: Side, b: Side) -> jax.Array:
  """Each row of `a`: the logsumexp of its negatives among the rows of `b`."""
  (m, d), k = a.vectors.shape, b.vectors.shape[0]
  geometry = Geometry(plan.block, plan.block_d, d // plan.block_d, k // plan.block)
  row, vec = _block_rows(plan.block, d), _block_rows(plan.block)
  return _pallas_call(
      functools.partial(forward_kernel, plan.kmap, geometry), grid=(m // plan.block,),
      in_specs=[_whole(theta.shape), row, vec, vec, vec, _whole((k, d)), _whole((k,)),
                _whole((k,))],
      out_specs=vec, out_shape=jax.ShapeDtypeStruct((m,), a.vectors.dtype),
      name="info_nce_lse")(theta, *_side_arrays(a), b.vectors, b.ids,
                           b.valid.astype(jnp.int32))


def _row_grads(plan: _Plan, theta, rows: Side, cols: Side, r_lse, r_g, c_lse, c_g, *,
               columns: bool, theta_from_columns: bool):
  (m, d), k = rows.vectors.shape, cols.vectors.shape[0]
  geometry = Geometry(plan.block, plan.block_d, d // plan.block_d, k // plan.block)
  row, vec = _block_rows(plan.block, d), _block_rows(plan.block)
  blocks, width = m // plan.block, theta.shape[0]
  kernel = functools.partial(row_grad_kernel, plan.kmap, geometry, columns, theta_from_columns)
  drows, dtheta = _pallas_call(
      kernel, grid=(blocks,),
      in_specs=[_whole(theta.shape), row, vec, vec, vec, vec, vec, _whole((k, d)),
                _whole((k,)), _whole((k,)), _whole((k,)), _whole((k,))],
      out_specs=[row, pl.BlockSpec((1, width), lambda i: (i, 0))],
      out_shape=[jax.ShapeDtypeStruct((m, d), rows.vectors.dtype),
                 jax.ShapeDtypeStruct((blocks, width), theta.dtype)],
      name="info_nce_lse_row_grad")(theta, *_side_arrays(rows), r_lse, r_g, cols.vectors,
                                    cols.ids, cols.valid.astype(jnp.int32), c_lse, c_g)
  return drows, jnp.sum(dtheta, axis=0)


def _col_grads(plan: _Plan, theta, rows: Side, cols: Side, r_lse, r_g, c_lse, c_g, *,
               columns: bool):
  (m, d), k = rows.vectors.shape, cols.vectors.shape[0]
  geometry = Geometry(plan.block, plan.block_d, d // plan.block_d, m // plan.block)
  col, vec = _block_rows(plan.block, d), _block_rows(plan.block)
  return _pallas_call(
      functools.partial(col_grad_kernel, plan.kmap, geometry, columns),
      grid=(k // plan.block,),
      in_specs=[_whole(theta.shape), col, vec, vec, vec, vec, _whole((m, d)), _whole((m,)),
                _whole((m,)), _whole((m,)), _whole((m,)), _whole((m,))],
      out_specs=col, out_shape=jax.ShapeDtypeStruct((k, d), cols.vectors.dtype),
      name="info_nce_lse_col_grad")(theta, cols.vectors, cols.ids,
                                    cols.valid.astype(jnp.int32), c_lse, c_g,
                                    *_side_arrays(rows), r_lse, r_g)


def _as_anchors(side: Side) -> Side:
  """A candidate side as anchors: in-batch candidates share their positive's id."""
  return Side(side.vectors, side.ids, side.ids, side.valid)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _lse(plan: _Plan, theta, rows: Side, cols: Side | None):
  if plan.kind == "symmetric":
    return _forward(plan, theta, rows, rows), None
  row_lse = _forward(plan, theta, rows, cols)
  if plan.kind == "rows":
    return row_lse, None
  return row_lse, _forward(plan, theta, _as_anchors(cols), rows)


def _lse_fwd(plan, theta, rows, cols):
  out = _lse(plan, theta, rows, cols)
  return out, (theta, rows, cols, out)


def _lse_bwd(plan, residuals, cotangents):
  theta, rows, cols, (row_lse, col_lse) = residuals
  row_g, col_g = cotangents
  dcols = None
  if plan.kind == "symmetric":
    # S = U U^T: dU = (G + G^T) U, the column term being row j's own statistics.
    drows, dtheta = _row_grads(plan, theta, rows, rows, row_lse, row_g, row_lse, row_g,
                               columns=True, theta_from_columns=False)
  else:
    two_sided = plan.kind == "rows_and_columns"
    if not two_sided:
      col_lse = col_g = jnp.zeros(cols.ids.shape, row_lse.dtype)
    drows, dtheta = _row_grads(plan, theta, rows, cols, row_lse, row_g, col_lse, col_g,
                               columns=two_sided, theta_from_columns=two_sided)
    if plan.column_grad:
      dcols = Side(_col_grads(plan, theta, rows, cols, row_lse, row_g, col_lse, col_g,
                              columns=two_sided), None, None, None)
  # The step is a schedule's input, not a parameter.
  dtheta = dtheta.at[plan.step_index].set(0.0)
  return dtheta, Side(drows, None, None, None), dcols


_lse.defvjp(_lse_fwd, _lse_bwd)


def supports(mapping) -> bool:
  """Whether the kernel runs `mapping`: a `Mapping` whose trainable params are scalars."""
  from tfcl_jax import mappings  # noqa: PLC0415

  return isinstance(mapping, mappings.Mapping) and all(
      jnp.ndim(leaf) == 0 for leaf in jax.tree.leaves(mapping.params))


def _kernel_map(mapping, dtype, tile_shape) -> tuple[KernelMap, jax.Array, int]:
  """The map as the kernels call it, and `theta`: its parameters, the scalars it closes over
  (e.g. a scheduled `tau` computed outside, which then gets its gradient) and the step, as one
  vector of `dtype`. A kernel holds no arrays but its inputs: a map that closes over a
  non-scalar array is refused."""
  params = jax.tree.map(jnp.asarray, dict(mapping.params))
  step = mapping.bound_step()
  closed = jax.make_jaxpr(mapping.fn)(jnp.zeros(tile_shape, dtype), params, step)
  shapes = [jnp.shape(c) for c in closed.consts]
  if any(shape != () for shape in shapes):
    raise ValueError(f"implementation='pallas' needs a mapping that closes over scalars only; "
                     f"{mapping.spec!r} closes over arrays of shapes {shapes}. Use "
                     "implementation='xla'.")
  leaves = jax.tree.leaves(params)
  scalars = [*leaves, step, *closed.consts]
  dtypes = [jnp.asarray(x).dtype for x in scalars]
  num_args = len(leaves) + 1

  def kernel_fn(cos, theta):
    values = [t.astype(dt) for t, dt in zip(theta, dtypes, strict=True)]
    return jax.core.eval_jaxpr(closed.jaxpr, values[num_args:], cos, *values[:num_args])[0]

  width = _next_power_of_two(len(scalars))
  theta = jnp.stack([jnp.asarray(x, dtype) for x in scalars]
                    + [jnp.zeros((), dtype)] * (width - len(scalars)))
  fast = LogSumExp.fast_form(mapping, jnp.dtype(dtype))
  return KernelMap(kernel_fn, fast, len(scalars)), theta, len(leaves)


def _pad(side: Side, block: int, padded_dim: int) -> Side:
  side = _engine.pad_side(side, block)
  extra = padded_dim - side.vectors.shape[1]
  return side._replace(vectors=jnp.pad(side.vectors, [(0, 0), (0, extra)])) if extra else side


def _fused(rows: Side, columns: Side | None, mapping, kind: str, block_size: int | None,
           column_grad: bool):
  num_rows, dim = rows.vectors.shape
  num_cols = num_rows if columns is None else columns.ids.shape[0]
  block, block_d = tile_geometry(num_rows, num_cols, dim, block_size)
  padded_dim = -(-dim // block_d) * block_d
  dtype = rows.vectors.dtype
  kmap, theta, step_index = _kernel_map(mapping, dtype, (block, block))
  plan = _Plan(kmap, kind, block, block_d, column_grad, step_index)
  padded_rows = _pad(rows, block, padded_dim)
  padded_cols = None if columns is None else _pad(columns, block, padded_dim)
  if padded_cols is not None and not column_grad:
    padded_cols = padded_cols._replace(vectors=jax.lax.stop_gradient(padded_cols.vectors))
  row_lse, col_lse = _lse(plan, theta, padded_rows, padded_cols)
  return row_lse[:num_rows], None if col_lse is None else col_lse[:num_cols]


def pallas_reduce(rows: Side, columns: Side | None, *, mapping, kind: str,
                  block_size: int | None, column_grad: bool = True):
  """`_engine.tile_reduce`'s contract (`LogSumExp` only) computed by the fused kernels.

  `(row_lse, col_lse)`: each row's (and, for `"rows_and_columns"`, each column's) logsumexp
  over its negatives; `-inf` for a row without any. Lowered for TPU, the XLA engine.
  """
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
  if block_size is not None and block_size < SMALLEST_BLOCK:
    raise ValueError(f"block_size must be >= {SMALLEST_BLOCK} with implementation='pallas' "
                     f"(Triton's smallest matrix product), got {block_size}.")

  def fused(rows, columns):
    return _fused(rows, columns, mapping, kind, block_size, column_grad)

  def xla(rows, columns):
    return _engine.tile_reduce(rows, columns, mapping=mapping, kind=kind,
                               block_size=block_size, column_grad=column_grad)

  return jax.lax.platform_dependent(rows, columns, tpu=xla, default=fused)
