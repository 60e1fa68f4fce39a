r"""The bodies of the fused InfoNCE kernels: one program per row (or column) block.

A program holds one block of `block` rows and walks every block of the other side,
FlashAttention-2's layout: the tile `S = U_i V_j^T` is formed by a loop over `[block, block_d]`
chunks of the embedding dimension (so `D` = 768 never sits in fast memory whole), the map is
applied inside the tile, and the tile is folded into per-row statistics or, backward, chunk by
chunk into the program's own block of the gradient. No program writes another's output: no
atomics.

* forward (`forward_kernel`): `lse_i = log sum_{j negative of i} exp(f(S_ij))`, an online
  logsumexp, or a plain sum of `w(S_ij) = exp(f(S_ij) - shift)` for maps with a closed form
  (`Mapping.exp_form`; Eq. 11's `w = (1 + c) / (1 - c)`);
* backward (`row_grad_kernel`, `col_grad_kernel`): each tile recomputed, its cotangent
  `dS_ij = f'(S_ij) (g_i exp(f_ij - lse_i) + h_j exp(f_ij - lse'_j))` (the second term when the
  columns have statistics of their own: CLIP's two-tower loss, NT-Xent's symmetric matrix),
  then `dU_i = sum_j dS_ij V_j` (row programs) and `dV_j = sum_i dS_ij^T U_i` (column
  programs); the map's scalar parameters get `sum dlogits df/dtheta` from the row programs.

Every shape a kernel touches is a power of two (Triton's rule): the caller pads `N` to whole
blocks with rows that are never anyone's candidate, and `D` to whole chunks with zeros.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


@dataclasses.dataclass(frozen=True)
class KernelMap:
  """The mapping as the kernels see it: static callables over scalars loaded from `theta`.

  `fn(cos, theta)` with `theta` a tuple of scalars (the map's parameters, the step, then the
  scalars it closes over); `fast` the map's `ExpForm` or None.
  """

  fn: Callable[[jax.Array, tuple[jax.Array, ...]], jax.Array]
  fast: Any
  num_theta: int


@dataclasses.dataclass(frozen=True)
class Geometry:
  """Static tile geometry: `block` rows per program and per step, `D` in `chunks` of
  `block_d` columns, `steps` blocks of the other side."""

  block: int
  block_d: int
  chunks: int
  steps: int


def _load_theta(kmap: KernelMap, theta_ref) -> tuple[jax.Array, ...]:
  # One scalar load each: Triton lowers `ref[k]`, not slices of a loaded vector.
  return tuple(theta_ref[k] for k in range(kmap.num_theta))


def _columns(geometry: Geometry, c) -> pl.Slice:
  return pl.ds(pl.multiple_of(c * geometry.block_d, geometry.block_d), geometry.block_d)


def _over_chunks(geometry: Geometry, body, init):
  """`body(c, carry)` for each chunk `c` of `D`: a loop, so that one chunk's buffers serve
  them all (unrolled, every chunk's operands would take their own shared memory)."""
  if geometry.chunks == 1:
    return body(0, init)
  return jax.lax.fori_loop(0, geometry.chunks, body, init)


def _tile_cos(a_ref, a_start, b_ref, b_start, geometry: Geometry) -> jax.Array:
  """`S = A B^T` for the row blocks of `a_ref` and `b_ref` starting at `a_start`, `b_start`."""
  rows_a, rows_b = pl.ds(a_start, geometry.block), pl.ds(b_start, geometry.block)

  def add(c, cos):
    d = _columns(geometry, c)
    return cos + jax.lax.dot_general(a_ref[rows_a, d], b_ref[rows_b, d],
                                     (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32)

  return _over_chunks(geometry, add, jnp.zeros((geometry.block, geometry.block), jnp.float32))


def _zero(out_ref, geometry: Geometry):
  def clear(c, carry):
    out_ref[:, _columns(geometry, c)] = jnp.zeros((geometry.block, geometry.block_d),
                                                  out_ref.dtype)
    return carry

  _over_chunks(geometry, clear, 0)


def _accumulate(out_ref, product, geometry: Geometry):
  """`out += product(d)` chunk by chunk: the program's own output block is its accumulator
  (Triton has no scratch memory; no other program writes this block)."""
  def add(c, carry):
    d = _columns(geometry, c)
    out_ref[:, d] = out_ref[:, d] + product(d).astype(out_ref.dtype)
    return carry

  _over_chunks(geometry, add, 0)


def _keep(r_ids, r_pos, r_valid, c_ids, c_valid) -> jax.Array:
  """`_tiles.mask`: both rows valid and the column neither the anchor nor its positive."""
  return ((r_valid[:, None] != 0) & (c_valid[None, :] != 0)
          & (c_ids[None, :] != r_ids[:, None]) & (c_ids[None, :] != r_pos[:, None]))


def forward_kernel(kmap: KernelMap, geometry: Geometry, theta_ref, r_ref, r_ids_ref, r_pos_ref,
                   r_valid_ref, c_ref, c_ids_ref, c_valid_ref, lse_ref):
  """One row block's logsumexp over every column block (grid: row blocks)."""
  block, dtype = geometry.block, lse_ref.dtype
  theta = _load_theta(kmap, theta_ref)
  r_ids, r_pos, r_valid = r_ids_ref[...], r_pos_ref[...], r_valid_ref[...]

  def tile(j):
    start = j * block
    cos = _tile_cos(r_ref, 0, c_ref, start, geometry).astype(dtype)
    span = pl.ds(start, block)
    return cos, _keep(r_ids, r_pos, r_valid, c_ids_ref[span], c_valid_ref[span])

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


def _scale(lse, g):
  """`(lse, g)` with rows that have no negatives (`lse = -inf`) taking no gradient."""
  ok = lse > -jnp.inf
  return jnp.where(ok, lse, 0.0), jnp.where(ok, g, 0.0)


def _tile_cotangent(kmap: KernelMap, theta, cos, keep, r_lse, r_g, c_lse, c_g, *,
                    columns: bool, theta_from_columns: bool):
  """`(dS, dtheta)` of one tile.

  `dS = f'(S) (g_i exp(f - lse_i) + h_j exp(f - lse'_j))`, the column term when `columns`;
  `dtheta` (None for closed forms, which have no parameters) takes the column term only when
  `theta_from_columns` (a symmetric matrix's column term is another tile's row term).
  """
  if kmap.fast is not None:
    shift = kmap.fast.shift
    scale = (r_g * jnp.exp(shift - r_lse))[:, None]
    if columns:
      scale = scale + (c_g * jnp.exp(shift - c_lse))[None, :]
    return jnp.where(keep, scale * kmap.fast.weight_grad(cos), 0.0), None
  logits, vjp = jax.vjp(kmap.fn, cos, theta)
  logits = jnp.where(keep, logits, -jnp.inf)
  row_term = r_g[:, None] * jnp.exp(logits - r_lse[:, None])
  if not columns:
    dcos, dtheta = vjp(row_term)
    return dcos, dtheta
  col_term = c_g[None, :] * jnp.exp(logits - c_lse[None, :])
  dcos, dtheta = vjp(row_term + col_term)
  if not theta_from_columns:
    _, dtheta = vjp(row_term)
  return dcos, dtheta


def row_grad_kernel(kmap: KernelMap, geometry: Geometry, columns: bool,
                    theta_from_columns: bool, theta_ref, r_ref, r_ids_ref, r_pos_ref,
                    r_valid_ref, r_lse_ref, r_g_ref, c_ref, c_ids_ref, c_valid_ref, c_lse_ref,
                    c_g_ref, dr_ref, dtheta_ref):
  """`dU_i = sum_j dS_ij V_j` for one row block, and its share of `dtheta`."""
  block, dtype = geometry.block, dr_ref.dtype
  theta = _load_theta(kmap, theta_ref)
  r_ids, r_pos, r_valid = r_ids_ref[...], r_pos_ref[...], r_valid_ref[...]
  r_lse, r_g = _scale(r_lse_ref[...], r_g_ref[...])
  _zero(dr_ref, geometry)

  def body(j, dtheta):
    start = j * block
    span = pl.ds(start, block)
    cos = _tile_cos(r_ref, 0, c_ref, start, geometry).astype(dtype)
    keep = _keep(r_ids, r_pos, r_valid, c_ids_ref[span], c_valid_ref[span])
    c_lse, c_g = _scale(c_lse_ref[span], c_g_ref[span]) if columns else (None, None)
    dcos, dth = _tile_cotangent(kmap, theta, cos, keep, r_lse, r_g, c_lse, c_g,
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


def col_grad_kernel(kmap: KernelMap, geometry: Geometry, columns: bool, theta_ref, c_ref,
                    c_ids_ref, c_valid_ref, c_lse_ref, c_g_ref, r_ref, r_ids_ref, r_pos_ref,
                    r_valid_ref, r_lse_ref, r_g_ref, dc_ref):
  """`dV_j = sum_i dS_ij^T U_i` for one column block (the tiles in the row kernel's
  orientation, so both kernels compute the same `dS`)."""
  block, dtype = geometry.block, dc_ref.dtype
  theta = _load_theta(kmap, theta_ref)
  c_ids, c_valid = c_ids_ref[...], c_valid_ref[...]
  c_lse, c_g = _scale(c_lse_ref[...], c_g_ref[...]) if columns else (None, None)
  _zero(dc_ref, geometry)

  def body(i, carry):
    start = i * block
    span = pl.ds(start, block)
    cos = _tile_cos(r_ref, start, c_ref, 0, geometry).astype(dtype)
    keep = _keep(r_ids_ref[span], r_pos_ref[span], r_valid_ref[span], c_ids, c_valid)
    r_lse, r_g = _scale(r_lse_ref[span], r_g_ref[span])
    dcos, _ = _tile_cotangent(kmap, theta, cos, keep, r_lse, r_g, c_lse, c_g,
                              columns=columns, theta_from_columns=False)
    dcos = dcos.astype(r_ref.dtype)
    _accumulate(dc_ref, lambda d: jax.lax.dot_general(
        dcos, r_ref[span, d], (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32),
        geometry)
    return carry

  jax.lax.fori_loop(0, geometry.steps, body, 0)
