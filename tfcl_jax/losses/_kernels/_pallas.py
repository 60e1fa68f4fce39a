r"""The fused path of InfoNCE's logsumexp (`implementation="pallas"`): Triton kernels on GPUs,
Mosaic kernels on TPUs, the same kernels interpreted on a CPU.

`info_nce(..., implementation="pallas")` hands the logsumexp of every row's (and, for CLIP's
two-tower loss, every column's) negatives to Pallas kernels built as FlashAttention-2's: the
forward walks the column blocks of each row block with the mapping applied inside the tile
and an online logsumexp; the backward recomputes each tile. The backward takes two kernels,
one over row blocks (`dU`, and the mapping's parameter gradients) and one over column blocks
(`dV`), no program writing another's output. On GPUs a tile can also serve both of its sides
(`_kernel_triton_pairs`: `"all"`'s symmetric tiles, the two directions of the two-tower loss
in one pass, one backward kernel), its column side sent as partial results that XLA sums or
by atomic adds; `_triton_tiles.COLUMN_SIDE` chooses, forward and backward (by default: pairs
with partial sums forward, separate kernels backward, no atomics). Two backends:

* GPUs (`_kernel_triton`): Pallas's Triton backend, named by its compiler parameters
  (`pallas.triton.CompilerParams`; a `pallas_call` without them meant Mosaic GPU up to jax
  0.11.1 and means Triton from 0.11.2). Triton's block refs are pointers into global memory,
  so a program loads its own block once and reads the other side tile by tile where its loop
  needs it (Triton pipelines those loads); Mosaic GPU stages every block of a `BlockSpec` in
  shared memory (228 KiB on an H100), where the whole other side would not fit. Triton also
  compiles for AMD GPUs (`rocm`). JAX deprecates this backend from 0.11.2 and will remove it:
  where it cannot be imported, or cannot compile a kernel on the GPU, the kernels are refused
  with an error naming `implementation="xla"` (`_triton_blocks.unavailable`). With bfloat16
  inputs the Triton kernels take the raw rows and their float32 inverse norms
  (`_layout.raw_rows`, as the engine lays bfloat16 inputs out): bfloat16 products, cosines as
  exact as float32's.
* TPUs (`_kernel_tpu`): Mosaic, the column blocks a sequential grid axis with the statistics
  and accumulators in VMEM, as JAX's own TPU flash attention.

Which backend runs, and whether it is compiled or interpreted, follows the platform the program
is lowered for (`jax.lax.platform_dependent`), not the host: lowered for `cuda`/`rocm` or
`tpu` on any host, the program holds the compiled kernels' custom calls; run on a CPU, the
Triton backend goes through Pallas's interpreter (slow: for tests). One JAX limit: a program
lowered for several platforms at once (`jax.export(..., platforms=("cpu", "cuda"))`) cannot
hold the kernels, since JAX lowers each kernel's call for every platform of the set; lower for
one platform at a time.

`N` is padded to whole blocks with rows that are no one's candidate (and, for Triton, `D` to
a power of two or to whole chunks with zeros): exact, one O(N D) copy. The mapping's parameters,
the step and any scalar the mapping closes over travel to the kernels as one vector `theta`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.core
import jax.numpy as jnp

from tfcl_jax.losses._engine import _arguments, _layout, _tiled
from tfcl_jax.losses._engine._tiles import LogSumExp, Side, stats_dtype
from tfcl_jax.losses._kernels import (
  _kernel_tpu,
  _kernel_triton,
  _kernel_triton_pairs,
  _triton_blocks,
  _triton_tiles,
)
from tfcl_jax.losses._kernels._kernel_math import INDEX, KernelMapping
from tfcl_jax.losses._kernels._protocol import Kernels, PairKernels, Tiles

BACKENDS: dict[str, Kernels] = {"triton": _kernel_triton, "mosaic_tpu": _kernel_tpu}
PAIRS: dict[str, PairKernels] = {"triton": _kernel_triton_pairs}
SMALLEST_BLOCK = _triton_tiles.SMALLEST_BLOCK


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Static description of one fused computation: the backend's kernels (`_protocol.Kernels`)
  called with the traced mapping and the tiles they chose."""

  backend: str
  kernel_mapping: KernelMapping
  kind: str
  tiles: Tiles
  column_grad: bool
  step_index: int  # theta's entry that holds the step

  @property
  def kernels(self) -> Kernels:
    return BACKENDS[self.backend]

  def forward(self, theta, a: Side, b: Side) -> jax.Array:
    return self.kernels.forward(self.kernel_mapping, self.tiles, theta, a, b)

  def row_grads(self, theta, rows: Side, cols: Side, r_lse, r_g, c_lse, c_g, *, columns: bool,
                theta_from_columns: bool):
    return self.kernels.row_grads(self.kernel_mapping, self.tiles, theta, rows, cols, r_lse, r_g,
                                  c_lse, c_g, columns=columns,
                                  theta_from_columns=theta_from_columns)

  def col_grads(self, theta, rows: Side, cols: Side, r_lse, r_g, c_lse, c_g, *, columns: bool):
    return self.kernels.col_grads(self.kernel_mapping, self.tiles, theta, rows, cols, r_lse, r_g,
                                  c_lse, c_g, columns=columns)

  def pairs(self, direction: int) -> _Pairs | None:
    """The backend's kernels that serve both sides of a tile and how they send a tile's column
    side (`_triton_tiles.COLUMN_SIDE`, `direction` 0 forward, 1 backward), or None where the
    row and column kernels serve them (`"separate"`, and the TPU backend)."""
    column_side = self.tiles.columns[direction]
    pairs = PAIRS.get(self.backend)
    if pairs is None or column_side == "separate":
      return None
    return _Pairs(pairs, self, column_side)


@dataclasses.dataclass(frozen=True)
class _Pairs:
  """A plan's pair kernels (`_protocol.PairKernels`), the column side sent as `column_side`."""

  kernels: PairKernels
  plan: _Plan
  column_side: str

  def symmetric_forward(self, theta, side: Side) -> jax.Array:
    return self.kernels.symmetric_forward(self.plan.kernel_mapping, self.plan.tiles, theta, side,
                                          column_side=self.column_side)

  def two_sided_forward(self, theta, rows: Side, cols: Side):
    return self.kernels.two_sided_forward(self.plan.kernel_mapping, self.plan.tiles, theta, rows,
                                          cols, column_side=self.column_side)

  def symmetric_grads(self, theta, side: Side, lse, g):
    return self.kernels.symmetric_grads(self.plan.kernel_mapping, self.plan.tiles, theta, side,
                                        lse, g, column_side=self.column_side)

  def both_grads(self, theta, rows: Side, cols: Side, r_lse, r_g, c_lse, c_g, *, columns: bool):
    return self.kernels.both_grads(self.plan.kernel_mapping, self.plan.tiles, theta, rows, cols,
                                   r_lse, r_g, c_lse, c_g, columns=columns,
                                   column_side=self.column_side)


def _as_anchors(side: Side) -> Side:
  """A candidate side as anchors: in-batch candidates share their positive's id."""
  return Side(side.vectors, side.ids, side.ids, side.valid)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _lse(plan: _Plan, theta, rows: Side, cols: Side | None):
  pairs = plan.pairs(0)
  fast = plan.kernel_mapping.fast is not None  # sums with a fixed shift add across programs exactly
  if plan.kind == "symmetric":
    if pairs is not None and fast:
      return pairs.symmetric_forward(theta, rows), None
    return plan.forward(theta, rows, rows), None
  assert cols is not None  # "rows" and "rows_and_columns" have a column side
  if plan.kind == "rows_and_columns" and pairs is not None and fast:
    return pairs.two_sided_forward(theta, rows, cols)
  row_lse = plan.forward(theta, rows, cols)
  if plan.kind == "rows":
    return row_lse, None
  return row_lse, plan.forward(theta, _as_anchors(cols), rows)


def _lse_bwd(plan, residuals, cotangents):
  theta, rows, cols, (row_lse, col_lse) = residuals
  row_g, col_g = cotangents
  pairs = plan.pairs(1)
  dcols = None
  if plan.kind == "symmetric" and pairs is not None:
    drows, dtheta = pairs.symmetric_grads(theta, rows, row_lse, row_g)
  elif plan.kind == "symmetric":
    # S = U U^T: dU = (G + G^T) U, the column term being row j's own statistics.
    drows, dtheta = plan.row_grads(theta, rows, rows, row_lse, row_g, row_lse, row_g,
                                   columns=True, theta_from_columns=False)
  else:
    two_sided = plan.kind == "rows_and_columns"
    if not two_sided:
      col_lse = col_g = jnp.zeros(cols.ids.shape, row_lse.dtype)
    if plan.column_grad and pairs is not None:
      drows, dcols, dtheta = pairs.both_grads(theta, rows, cols, row_lse, row_g, col_lse, col_g,
                                              columns=two_sided)
    else:
      drows, dtheta = plan.row_grads(theta, rows, cols, row_lse, row_g, col_lse, col_g,
                                     columns=two_sided, theta_from_columns=two_sided)
      if plan.column_grad:
        dcols = plan.col_grads(theta, rows, cols, row_lse, row_g, col_lse, col_g,
                               columns=two_sided)
    dcols = None if dcols is None else _no_grad(cols, _layout.through_norm(cols.vectors, dcols))
  # The step is a schedule's input, not a parameter.
  dtheta = dtheta.at[plan.step_index].set(0.0)
  return dtheta, _no_grad(rows, _layout.through_norm(rows.vectors, drows)), dcols


def _no_grad(side: Side, dvectors) -> Side:
  """The cotangent of `side`: `dvectors` for its vectors; None (JAX's cotangent for the
  integer and boolean leaves) elsewhere."""
  return Side(dvectors, None, None, None)  # pyright: ignore[reportArgumentType]


_save_inputs = _tiled.saving_inputs(_lse)


def _lse_fwd(plan, theta, rows, cols):
  # A second derivative differentiates this rule and the backward, and the kernels have no rules.
  _arguments.refuse_second_order(theta, rows, cols, loss="info_nce(implementation='pallas')")
  return _save_inputs(plan, theta, rows, cols)


_lse.defvjp(_lse_fwd, _lse_bwd)


def supports(mapping) -> bool:
  """Whether the kernels run `mapping`: a `Mapping` whose trainable params are scalars."""
  from tfcl_jax import mappings  # noqa: PLC0415

  return isinstance(mapping, mappings.Mapping) and all(
      jnp.ndim(leaf) == 0 for leaf in jax.tree.leaves(mapping.params))


def _typed(x, dtype) -> jax.Array:
  """A scalar as the kernels hold it, whether `jax_enable_x64` is on or off: floats in the
  tile math's `dtype`, integers as the kernels' index type (int32)."""
  x = jnp.asarray(x)
  if jnp.issubdtype(x.dtype, jnp.floating):
    return x.astype(dtype)
  return x.astype(INDEX) if jnp.issubdtype(x.dtype, jnp.integer) else x


def _kernel_mapping(mapping, dtype, tile_shapes) -> tuple[KernelMapping, jax.Array, int]:
  """The mapping as the kernels call it, `theta` and the step's index in it.

  `theta`: the mapping's parameters, the step and the scalars it closes over (e.g. a scheduled
  `tau` computed outside, which then gets its gradient), as one vector of `dtype` (padded to
  a power of two). A kernel holds no arrays but its inputs: a mapping that closes over a
  non-scalar array is refused. Every scalar enters the tile math as `_typed` makes it (float32
  and int32 with x64 on, as with it off).
  """
  params = jax.tree.map(lambda x: _typed(x, dtype), dict(mapping.params))
  step = _typed(mapping.bound_step(), dtype)
  # One jaxpr per tile shape the kernels use (a mapping may broadcast to its input's shape), of
  # the mapping in its kernel form (`MappingFunction.kernel_form`: Eq. 11 with a scale,
  # `learnable_free` or a solved scale, as one log of the odds).
  kernel_form = mapping.kernel_form().fn

  def fn(cos, params, step):
    return kernel_form(cos, params, step)

  traced = {shape: jax.make_jaxpr(fn)(jnp.zeros(shape, dtype), params, step)
            for shape in tile_shapes}
  closed = next(iter(traced.values()))
  shapes = [jnp.shape(c) for c in closed.consts]
  if any(shape != () for shape in shapes):
    raise ValueError(f"implementation='pallas' needs a mapping that closes over scalars only; "
                     f"{mapping.spec!r} closes over arrays of shapes {shapes}. Use "
                     "implementation='xla'.")
  leaves = jax.tree.leaves(params)
  scalars = [*leaves, step, *closed.consts]
  dtypes = [_typed(x, dtype).dtype for x in scalars]
  num_args = len(leaves) + 1

  def kernel_fn(cos, theta):
    values = [t.astype(dt) for t, dt in zip(theta, dtypes, strict=True)]
    jaxpr = traced[cos.shape].jaxpr
    return jax.core.eval_jaxpr(jaxpr, values[num_args:], cos, *values[:num_args])[0].astype(
        cos.dtype)

  width = 1 << max(0, len(scalars) - 1).bit_length()
  theta = jnp.stack([jnp.asarray(x, dtype) for x in scalars]
                    + [jnp.zeros((), dtype)] * (width - len(scalars)))
  try:
    for shape in tile_shapes:
      jax.eval_shape(kernel_fn, jnp.zeros(shape, dtype), tuple(theta))
  except TypeError as error:
    raise ValueError(f"implementation='pallas' computes the mapping in {jnp.dtype(dtype).name}; "
                     f"{mapping.spec!r} closes over a value of another dtype that it uses as is "
                     f"({error}). Use implementation='xla'.") from error
  fast = LogSumExp().fast_form(mapping, jnp.dtype(dtype))
  return KernelMapping(kernel_fn, fast, len(scalars)), theta, len(leaves)


def _pad(side: Side, block: int, padded_dim: int) -> Side:
  side = _tiled.pad_side(side, block)
  extra = padded_dim - side.vectors.shape[1]
  return side._replace(vectors=jnp.pad(side.vectors, [(0, 0), (0, extra)])) if extra else side


def _unit(side: Side) -> Side:
  """A side of raw rows as unit rows in float32 (for the kernels that take unit rows only)."""
  return side._replace(vectors=_layout.unit(side.vectors))


def _fused(backend: str, rows: Side, columns: Side | None, mapping, kind: str,
           block_size: int | None, column_grad: bool):
  # Raw rows need the Triton kernels and bfloat16 raw rows on both sides (not so against a
  # float32 bank, nor for float16 inputs).
  if backend != "triton" or any(side is not None and side.vectors.dtype != jnp.bfloat16
                                for side in (rows, columns)):
    rows, columns = _unit(rows), None if columns is None else _unit(columns)
  num_rows, dim = rows.vectors.shape
  num_cols = num_rows if columns is None else columns.ids.shape[0]
  tiles = BACKENDS[backend].tiles(num_rows, num_cols, dim, block_size, rows.vectors.dtype)
  blocks = tiles.blocks()
  kernel_mapping, theta, step_index = _kernel_mapping(
      mapping, stats_dtype(rows.vectors), [(block, block) for block in blocks])
  plan = _Plan(backend, kernel_mapping, kind, tiles, column_grad, step_index)
  padded_dim = tiles.padded_dim(dim)
  padded_rows = _pad(rows, tiles.block, padded_dim)
  padded_cols = None if columns is None else _pad(columns, tiles.block, padded_dim)
  if padded_cols is not None and not column_grad:
    padded_cols = padded_cols._replace(vectors=jax.lax.stop_gradient(padded_cols.vectors))
  return _tiled.unpadded(_lse(plan, theta, padded_rows, padded_cols), rows, columns)


def pallas_reduce(rows: Side, columns: Side | None, *, mapping, kind: str,
                  block_size: int | None, column_grad: bool = True, backend: str | None = None):
  """`_tiled.tile_reduce`'s contract (`LogSumExp` only) computed by the fused kernels.

  `(row_lse, col_lse)`: each row's (and, for `"rows_and_columns"`, each column's) logsumexp
  over its negatives; `-inf` for a row without any. `backend`: None for the platform's
  (Mosaic on TPU, Triton elsewhere), or `"triton"` / `"mosaic_tpu"` to run that backend on
  every platform (interpreted on a CPU: how the tests check the TPU kernels).
  """
  if kind not in _tiled.KINDS:
    raise ValueError(f"kind must be one of {_tiled.KINDS}, got {kind!r}.")
  if block_size is not None and block_size < SMALLEST_BLOCK:
    raise ValueError(f"block_size must be >= {SMALLEST_BLOCK} with implementation='pallas' "
                     f"(Triton's smallest matrix product), got {block_size}.")
  if backend is not None and backend not in BACKENDS:
    raise ValueError(f"backend must be one of {sorted(BACKENDS)} or None, got {backend!r}.")
  if _tiled.has_scale(rows, columns):
    raise ValueError("implementation='pallas' takes a mapping's scalars, not a scale per anchor "
                     "(mappings.perplexity_free); use implementation='xla'.")
  for side in (rows, columns):
    if side is not None and jnp.dtype(side.vectors.dtype).itemsize > 4:
      raise ValueError(f"implementation='pallas' computes in float32 (bfloat16, float16 or "
                       f"float32 embeddings); got {jnp.dtype(side.vectors.dtype).name} ones. Use "
                       "implementation='xla' (the default), which computes in their dtype.")

  if backend != "mosaic_tpu" and (problem := _triton_blocks.unavailable()) is not None:
    if backend is not None or jax.default_backend() != "tpu":
      raise ValueError(
          f"implementation='pallas' runs Pallas's Triton backend on GPUs (and in Pallas's "
          f"interpreter on CPUs), and {problem}. Use implementation='xla' (the default), which "
          "needs no Pallas backend.")
    backend = "mosaic_tpu"  # the Triton branch cannot even be traced

  def fused(backend, rows, columns):
    return _fused(backend, rows, columns, mapping, kind, block_size, column_grad)

  if backend is not None:
    return fused(backend, rows, columns)
  return jax.lax.platform_dependent(rows, columns,
                                    tpu=functools.partial(fused, "mosaic_tpu"),
                                    default=functools.partial(fused, "triton"))
