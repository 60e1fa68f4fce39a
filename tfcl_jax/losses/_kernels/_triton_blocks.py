r"""What the Triton kernels share: Pallas's Triton backend, a tile's geometry, its blocks and
products, and the arrays a side passes to a kernel.

* `backend`, `unavailable`: Pallas's Triton backend, imported when a kernel is built (JAX
  deprecates it from 0.11.2 and will remove it), and why the kernels cannot run, if so;
* `Geometry`: a kernel's `block` rows per tile, `D` in `chunks` of `block_d` (held whole in one
  product when there is one chunk), `steps` blocks of the other side per program;
* `products`, `add_product`: a tile `S = A B^T` (`D` walked in chunks, the matrix product's
  reduction loop) and `acc + dS B` or `acc + dS^T B` (whole `D` into a register block, else chunk
  by chunk into the program's own output block).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from types import ModuleType

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from tfcl_jax.losses._engine._layout import inverse_norms
from tfcl_jax.losses._engine._tiles import Side, is_raw
from tfcl_jax.losses._kernels._kernel_math import INDEX, compiled_or_interpreted, loop
from tfcl_jax.losses._kernels._triton_tiles import Launch

PLATFORMS = ("cuda", "rocm")
TRITON = "jax.experimental.pallas.triton"
ALL = slice(None)


def backend() -> ModuleType:
  """Pallas's Triton backend, imported when a kernel is built, not with this module: it is
  deprecated from jax 0.11.2 and will be removed, and its absence must leave `tfcl_jax` and
  `implementation="xla"` working (`unavailable` says why the kernels cannot run)."""
  return importlib.import_module(TRITON)


@functools.cache
def unavailable() -> str | None:
  """Why the Triton kernels cannot run with the installed jax, or None; checked once per
  process. The backend must import (Pallas's interpreter runs its primitives on a CPU too)
  and, where JAX's default backend is a GPU, compile a kernel there."""
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
  except Exception as error:  # noqa: BLE001 - whatever the cause, the kernels cannot run
    return (f"jax {jax.__version__} cannot compile a kernel with {TRITON} on "
            f"{jax.devices()[0].device_kind} ({type(error).__name__}: {error})")
  return None


@dataclasses.dataclass(frozen=True)
class Geometry:
  """Static tile geometry: `block` rows per program and per step, `D` in `chunks` of
  `block_d` columns (the similarity products in steps of `block_k`), `steps` blocks of the
  other side per program; `scaled`: raw rows with inverse norms."""

  block: int
  block_d: int
  chunks: int
  steps: int
  scaled: bool
  block_k: int

  @property
  def whole(self) -> bool:
    return self.chunks == 1


def geometry(launch: Launch, dim: int, steps: int, vectors) -> Geometry:
  block_k = min(launch.block_k or launch.block_d, launch.block_d)
  return Geometry(launch.block, launch.block_d, dim // launch.block_d, steps, is_raw(vectors),
                  block_k)


def span(g: Geometry, j):
  return pl.ds(pl.multiple_of(j * g.block, g.block), g.block)


def columns(g: Geometry, c, width: int | None = None):
  """The `c`-th step of `width` columns through `D` (default `block_d`)."""
  width = g.block_d if width is None else width
  return pl.ds(pl.multiple_of(c * width, width), width)


def every_column(ref):
  """All of `ref`'s columns as an index whose start has the kernels' index type (an atomic
  add's indices must share one type, and a Python 0 is int64 under `jax_enable_x64`)."""
  return pl.ds(jnp.asarray(0, INDEX), ref.shape[-1])


def over_chunks(g: Geometry, body, init):
  """`body(c, carry)` for each chunk `c` of `D`, as a loop: one chunk's buffers serve them all
  (unrolled, every chunk's operands would take their own shared memory)."""
  return loop(0, g.chunks, body, init)


_NT = (((1,), (1,)), ((), ()))  # `a b^T`
_NN = (((1,), (0,)), ((), ()))  # `a b`
_TN = (((0,), (0,)), ((), ()))  # `a^T b`


def _dot(a, b, dims) -> jax.Array:
  return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def products(g: Geometry, a_ref, a_span, b_ref, b_span, a, b) -> jax.Array:
  """`A B^T` of the blocks `a_ref[a_span]` and `b_ref[b_span]`: `a` and `b` are those blocks
  already loaded (whole `D`), else `D` is walked in steps of `block_k` (the reduction loop)."""
  if g.whole:
    return _dot(a, b, _NT)

  def add(c, acc):
    d = columns(g, c, g.block_k)
    return acc + _dot(a_ref[a_span, d], b_ref[b_span, d], _NT)

  steps = g.chunks * (g.block_d // g.block_k)
  return loop(0, steps, add, jnp.zeros((g.block, g.block), jnp.float32))


def scaled(g: Geometry, raw, r_scale, c_scale) -> jax.Array:
  # Scaling after the product: the unit rows are never rounded to the inputs' precision.
  return (raw * r_scale * c_scale if g.scaled else raw).astype(jnp.float32)


def whole_block(g: Geometry, ref, index):
  return ref[index, :] if g.whole else None


def zero(out_ref, g: Geometry):
  def clear(c, carry):
    out_ref[:, columns(g, c)] = jnp.zeros((g.block, g.block_d), out_ref.dtype)
    return carry

  over_chunks(g, clear, 0)


def add_product(g: Geometry, acc, lhs, other, other_ref, other_span, out_ref, *,
                transposed: bool):
  """`acc + lhs @ B` (`lhs^T @ B` when `transposed`), `B` the block `other_ref[other_span]`:
  with `D` whole, `other` is that block loaded and `acc` a register block (a loop carry); else
  `D` is walked in chunks into the program's own output block `out_ref`, which no other program
  writes (a `[block, D]` float32 accumulator would not fit in registers)."""
  dims = _TN if transposed else _NN
  if g.whole:
    assert other is not None  # loaded whole by the caller
    return acc + _dot(lhs, other, dims)

  def add(c, carry):
    d = columns(g, c)
    out_ref[:, d] = out_ref[:, d] + _dot(lhs, other_ref[other_span, d], dims)
    return carry

  over_chunks(g, add, 0)
  return acc


def share(g: Geometry, lhs, other, other_ref, other_span, store, *, transposed: bool):
  """`store(d, lhs @ B[:, d])` (`lhs^T`, when `transposed`) for `D` whole (`d` every column,
  `other` the loaded block) or for each chunk `d`: a tile's share of another program's rows."""
  dims = _TN if transposed else _NN
  if g.whole:
    store(None, _dot(lhs, other, dims))
    return

  def add(c, carry):
    d = columns(g, c)
    store(d, _dot(lhs, other_ref[other_span, d], dims))
    return carry

  over_chunks(g, add, 0)


def write_dtheta(ref, dtheta):
  """A program's parameter gradients into its `[1, width]` block, zeros past them (or all
  zeros: None, a closed form's)."""
  dtheta = dtheta or ()
  for k in range(ref.shape[1]):
    ref[0, k] = (dtheta[k] if k < len(dtheta) else jnp.zeros((), ref.dtype)).astype(ref.dtype)


def rows(x):
  return x[:, None]


def cols(x):
  return x[None, :]


def call(kernel, launch: Launch, **kwargs):
  return compiled_or_interpreted(
      kernel, platforms=PLATFORMS,
      compiler_params=backend().CompilerParams(num_warps=launch.num_warps,
                                               num_stages=launch.num_stages),
      **kwargs)


def own_block(block: int, dim: int | None = None):
  """The grid's first index's block of rows (`[block]` or `[block, dim]`)."""
  shape = (block,) if dim is None else (block, dim)
  return pl.BlockSpec(shape, lambda i, *_: (i,) + (0,) * (len(shape) - 1))


def whole(shape):
  return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


def anchor_arrays(side: Side):
  return (side.vectors, inverse_norms(side.vectors),
          *(x.astype(INDEX) for x in (side.ids, side.positive_ids, side.valid)))


def candidate_arrays(side: Side):
  return (side.vectors, inverse_norms(side.vectors),
          *(x.astype(INDEX) for x in (side.ids, side.valid)))
