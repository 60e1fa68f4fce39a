r"""What the fused InfoNCE kernels share: the mapping as a kernel sees it, the tile's mask and
cotangent, and the choice between a compiled kernel and Pallas's interpreter.

The tile math is written once, on `[block, 1]` row values and `[1, block]` column values, and
traced into the Triton kernels (`_kernel_triton`) and the Mosaic TPU kernels (`_kernel_tpu`):

* `keep_mask`: the pair `(i, j)` is a negative of row `i` (`_tiles.mask`);
* `tile_cotangent`: `dS_ij = f'(S_ij) (g_i exp(f_ij - lse_i) + h_j exp(f_ij - lse'_j))`, the
  second term when the columns have statistics of their own (CLIP's two-tower loss, NT-Xent's
  symmetric matrix), and the mapping's parameter cotangent `sum dlogits df/dtheta`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


@dataclasses.dataclass(frozen=True)
class KernelMapping:
  """The mapping as the kernels see it: static callables over scalars loaded from `theta`.

  `fn(cos, theta)` with `theta` a tuple of scalars (the mapping's parameters, the step, then the
  scalars it closes over); `fast` the mapping's `ExpForm` or None.
  """

  fn: Callable[[jax.Array, tuple[jax.Array, ...]], jax.Array]
  fast: Any
  num_theta: int


INDEX = jnp.int32  # every id, block index and loop counter in a kernel, with x64 on or off


def loop(lower, upper, body, init):
  """`jax.lax.fori_loop` with an int32 counter: Python bounds would make it int64 under
  `jax_enable_x64`, and a kernel's indices must share one integer type."""
  return jax.lax.fori_loop(jnp.asarray(lower, INDEX), jnp.asarray(upper, INDEX), body, init)


def load_theta(mapping: KernelMapping, theta_ref) -> tuple[jax.Array, ...]:
  # One scalar load each: Triton lowers `ref[k]`, not slices of a loaded vector.
  return tuple(theta_ref[k] for k in range(mapping.num_theta))


def keep_mask(r_ids, r_pos, r_valid, c_ids, c_valid) -> jax.Array:
  """`_tiles.mask` from a row block's `[block, 1]` and a column block's `[1, block]` ids and
  validity: both rows valid and the column neither the anchor nor its positive."""
  return (r_valid != 0) & (c_valid != 0) & (c_ids != r_ids) & (c_ids != r_pos)


def without_empty(lse, g):
  """`(lse, g)` with rows that have no negatives (`lse = -inf`) taking no gradient."""
  ok = lse > -jnp.inf
  return jnp.where(ok, lse, 0.0), jnp.where(ok, g, 0.0)


def tile_cotangent(mapping: KernelMapping, theta, cos, keep, r_lse, r_g, c_lse, c_g, *,
                   columns: bool, theta_from_columns: bool):
  """`(dS, dtheta)` of one tile; the rows' `lse`, `g` are `[block, 1]`, the columns' `[1, block]`.

  `dS` takes the column term when `columns`; `dtheta` (None for closed forms, which have no
  parameters) takes it only when `theta_from_columns` (a symmetric matrix's column term is
  another tile's row term).
  """
  if mapping.fast is not None:
    shift = mapping.fast.shift
    scale = r_g * jnp.exp(shift - r_lse)
    if columns:
      scale = scale + c_g * jnp.exp(shift - c_lse)
    return jnp.where(keep, scale * mapping.fast.weight_grad(cos), 0.0), None
  logits, vjp = jax.vjp(mapping.fn, cos, theta)
  logits = jnp.where(keep, logits, -jnp.inf)
  row_term = r_g * jnp.exp(logits - r_lse)
  if not columns:
    dcos, dtheta = vjp(row_term)
    return dcos, dtheta
  col_term = c_g * jnp.exp(logits - c_lse)
  dcos, dtheta = vjp(row_term + col_term)
  if not theta_from_columns:
    _, dtheta = vjp(row_term)
  return dcos, dtheta


def compiled_or_interpreted(kernel, *, platforms: Sequence[str], compiler_params, **kwargs):
  """`pl.pallas_call(kernel, **kwargs)` compiled with `compiler_params` where the program is
  lowered for one of `platforms`, and run by Pallas's interpreter where it is lowered for the
  CPU (`jax.lax.platform_dependent`: decided at lowering, not by the host)."""

  def run(interpret, *args):
    params = {} if interpret else {"compiler_params": compiler_params}
    return pl.pallas_call(kernel, interpret=interpret, **kwargs, **params)(*args)

  def call(*args):
    compiled = functools.partial(run, False)
    return jax.lax.platform_dependent(*args, cpu=functools.partial(run, True),
                                      **{platform: compiled for platform in platforms})

  return call
