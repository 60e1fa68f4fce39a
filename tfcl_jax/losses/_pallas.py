r"""A fused Pallas kernel for InfoNCE's logsumexp: the mapping applied inside the tile.

The XLA engine (`_engine.tile_reduce`) scans tiles as separate XLA ops; here one kernel per row
block walks the column blocks, computes `S = U_i V_j^T`, applies the mapping `f` elementwise
(any `Mapping` whose params are scalars: fixed tau, Eq. 11's free map, learnable `exp(t)`,
DySTreSS, annealed) and keeps an online logsumexp, as FlashAttention does for attention. The
backward recomputes each tile, applies `f'` (by `jax.jvp` of the map, inside the kernel) and
accumulates `dU`, `dV` and the map's parameter gradients in two kernels (row blocks, column
blocks). Inf-CL's kernels assume logits linear in the similarity; nothing here does.

On a GPU the kernel lowers through Triton; elsewhere `interpret=True` runs the same kernel in
Pallas's interpreter (slow, for tests). The negatives are the engine's (`_tiles.mask`): both
rows valid, and the candidate neither the anchor itself nor its positive.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from tfcl_jax.losses._engine import balanced_tile, pad_side
from tfcl_jax.losses._tiles import Side

KINDS = ("rows", "rows_and_columns", "symmetric")


def _mask(r_valid, r_ids, r_pos, c_valid, c_ids):
  """`_tiles.mask`: column j is a negative of row i (valid, neither i nor i's positive)."""
  return (r_valid[:, None] & c_valid[None, :]
          & (c_ids[None, :] != r_ids[:, None]) & (c_ids[None, :] != r_pos[:, None]))


def _map(fn, treedef, cos, theta):
  *leaves, step = [theta[k] for k in range(theta.shape[0])]
  return fn(cos, jax.tree.unflatten(treedef, leaves), step)


def _forward_kernel(fn, treedef, block_cols, num_col_blocks,
                    theta_ref, r_ref, r_valid_ref, r_ids_ref, r_pos_ref,
                    c_ref, c_valid_ref, c_ids_ref, lse_ref):
  rows = r_ref[...]
  theta = theta_ref[...]
  r_valid, r_ids, r_pos = r_valid_ref[...], r_ids_ref[...], r_pos_ref[...]

  def body(j, carry):
    m, s = carry
    span = pl.ds(j * block_cols, block_cols)
    cos = rows @ c_ref[span, :].T
    logits = _map(fn, treedef, cos, theta)
    keep = _mask(r_valid, r_ids, r_pos, c_valid_ref[span], c_ids_ref[span])
    logits = jnp.where(keep, logits, -jnp.inf)
    new_m = jnp.maximum(m, jnp.max(logits, axis=1))
    safe_m = jnp.where(jnp.isfinite(new_m), new_m, 0.0)
    s = s * jnp.exp(jnp.where(jnp.isfinite(m), m - safe_m, -jnp.inf)) + jnp.sum(
        jnp.where(keep, jnp.exp(logits - safe_m[:, None]), 0.0), axis=1)
    return new_m, s

  init = (jnp.full((rows.shape[0],), -jnp.inf, rows.dtype), jnp.zeros((rows.shape[0],), rows.dtype))
  m, s = jax.lax.fori_loop(0, num_col_blocks, body, init)
  lse_ref[...] = jnp.where(s > 0, jnp.where(jnp.isfinite(m), m, 0.0) + jnp.log(s), -jnp.inf)


def _tile_grads(fn, treedef, rows, cols, keep, lse, g, theta):
  """`dS` (the cotangent of the cosines) and the map's parameter cotangent of one tile."""
  cos = rows @ cols.T
  logits, vjp = jax.vjp(lambda c, th: _map(fn, treedef, c, th), cos, theta)
  finite = jnp.isfinite(lse)
  weight = jnp.where(keep & finite[:, None],
                     jnp.exp(logits - jnp.where(finite, lse, 0.0)[:, None]), 0.0) * g[:, None]
  dcos, dtheta = vjp(weight.astype(logits.dtype))
  return jnp.where(keep, dcos, 0.0), dtheta


def _row_grad_kernel(fn, treedef, block_cols, num_col_blocks,
                     theta_ref, r_ref, r_valid_ref, r_ids_ref, r_pos_ref, lse_ref, g_ref,
                     c_ref, c_valid_ref, c_ids_ref, drows_ref, dtheta_ref):
  rows, theta = r_ref[...], theta_ref[...]
  r_valid, r_ids, r_pos = r_valid_ref[...], r_ids_ref[...], r_pos_ref[...]
  lse, g = lse_ref[...], g_ref[...]

  def body(j, carry):
    drows, dtheta = carry
    span = pl.ds(j * block_cols, block_cols)
    cols = c_ref[span, :]
    keep = _mask(r_valid, r_ids, r_pos, c_valid_ref[span], c_ids_ref[span])
    dcos, dth = _tile_grads(fn, treedef, rows, cols, keep, lse, g, theta)
    return drows + dcos @ cols, dtheta + dth

  drows, dtheta = jax.lax.fori_loop(0, num_col_blocks, body,
                                    (jnp.zeros_like(rows), jnp.zeros_like(theta)))
  drows_ref[...] = drows
  dtheta_ref[...] = dtheta[None, :]


def _col_grad_kernel(fn, treedef, block_rows, num_row_blocks,
                     theta_ref, c_ref, c_valid_ref, c_ids_ref,
                     r_ref, r_valid_ref, r_ids_ref, r_pos_ref, lse_ref, g_ref, dcols_ref):
  cols, theta = c_ref[...], theta_ref[...]
  c_valid, c_ids = c_valid_ref[...], c_ids_ref[...]

  def body(i, dcols):
    span = pl.ds(i * block_rows, block_rows)
    rows = r_ref[span, :]
    keep = _mask(r_valid_ref[span], r_ids_ref[span], r_pos_ref[span], c_valid, c_ids)
    dcos, _ = _tile_grads(fn, treedef, rows, cols, keep, lse_ref[span], g_ref[span], theta)
    return dcols + dcos.T @ rows

  dcols_ref[...] = jax.lax.fori_loop(0, num_row_blocks, body, jnp.zeros_like(cols))


def _vec(block):
  return pl.BlockSpec((block,), lambda i: (i,))


def _mat(block, dim):
  return pl.BlockSpec((block, dim), lambda i: (i, 0))


def _whole(shape):
  return pl.BlockSpec(shape, lambda i: (0,) * len(shape))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def _row_lse(fn, treedef, block_rows, block_cols, interpret, theta, r, r_valid, r_ids, r_pos,
             c, c_valid, c_ids):
  return _row_lse_fwd(fn, treedef, block_rows, block_cols, interpret, theta, r, r_valid, r_ids,
                      r_pos, c, c_valid, c_ids)[0]


def _row_lse_fwd(fn, treedef, block_rows, block_cols, interpret, theta, r, r_valid, r_ids, r_pos,
                 c, c_valid, c_ids):
  (m, d), k = r.shape, c.shape[0]
  kernel = functools.partial(_forward_kernel, fn, treedef, block_cols, k // block_cols)
  lse = pl.pallas_call(
      kernel, grid=(m // block_rows,),
      in_specs=[_whole(theta.shape), _mat(block_rows, d), _vec(block_rows), _vec(block_rows),
                _vec(block_rows), _whole((k, d)), _whole((k,)), _whole((k,))],
      out_specs=_vec(block_rows), out_shape=jax.ShapeDtypeStruct((m,), r.dtype),
      interpret=interpret)(theta, r, r_valid, r_ids, r_pos, c, c_valid, c_ids)
  return lse, (theta, r, r_valid, r_ids, r_pos, c, c_valid, c_ids, lse)


def _row_lse_bwd(fn, treedef, block_rows, block_cols, interpret, residuals, g):
  theta, r, r_valid, r_ids, r_pos, c, c_valid, c_ids, lse = residuals
  (m, d), k = r.shape, c.shape[0]
  g = jnp.where(jnp.isfinite(lse), g, 0.0).astype(r.dtype)
  row_kernel = functools.partial(_row_grad_kernel, fn, treedef, block_cols, k // block_cols)
  drows, dtheta = pl.pallas_call(
      row_kernel, grid=(m // block_rows,),
      in_specs=[_whole(theta.shape), _mat(block_rows, d), _vec(block_rows), _vec(block_rows),
                _vec(block_rows), _vec(block_rows), _vec(block_rows), _whole((k, d)),
                _whole((k,)), _whole((k,))],
      out_specs=[_mat(block_rows, d), pl.BlockSpec((1, theta.shape[0]), lambda i: (i, 0))],
      out_shape=[jax.ShapeDtypeStruct((m, d), r.dtype),
                 jax.ShapeDtypeStruct((m // block_rows, theta.shape[0]), theta.dtype)],
      interpret=interpret)(theta, r, r_valid, r_ids, r_pos, lse, g, c, c_valid, c_ids)
  col_kernel = functools.partial(_col_grad_kernel, fn, treedef, block_rows, m // block_rows)
  dcols = pl.pallas_call(
      col_kernel, grid=(k // block_cols,),
      in_specs=[_whole(theta.shape), _mat(block_cols, d), _vec(block_cols), _vec(block_cols),
                _whole((m, d)), _whole((m,)), _whole((m,)), _whole((m,)), _whole((m,)),
                _whole((m,))],
      out_specs=_mat(block_cols, d), out_shape=jax.ShapeDtypeStruct((k, d), c.dtype),
      interpret=interpret)(theta, c, c_valid, c_ids, r, r_valid, r_ids, r_pos, lse, g)
  # The step (theta's last entry) is a schedule's input, not a parameter: no gradient, as in
  # the XLA engine.
  dtheta = jnp.sum(dtheta, axis=0).at[-1].set(0.0)
  return (dtheta, drows, None, None, None, dcols, None, None)


_row_lse.defvjp(_row_lse_fwd, _row_lse_bwd)


def supports(mapping) -> bool:
  """Whether the kernel runs `mapping`: a `Mapping` whose trainable params are scalars."""
  from tfcl_jax import mappings  # noqa: PLC0415

  return isinstance(mapping, mappings.Mapping) and all(
      jnp.ndim(leaf) == 0 for leaf in jax.tree.leaves(mapping.params))


def pallas_reduce(rows: Side, columns: Side | None, *, mapping, kind: str,
                  block_size: int | None, interpret: bool | None = None):
  """`_engine.tile_reduce`'s contract (`LogSumExp` only) computed by the Pallas kernel.

  `(row_lse, col_lse)`: each row's (and, for `"rows_and_columns"`, each column's) logsumexp
  over its scored candidates; `-inf` for a row without any.
  """
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  leaves, treedef = jax.tree.flatten(dict(mapping.params))
  dtype = rows.vectors.dtype
  step = jnp.asarray(0 if mapping.step is None else mapping.step, dtype)
  theta = jnp.stack([jnp.asarray(leaf, dtype) for leaf in leaves] + [step])

  def fn(cos, params, step):
    return mapping.fn(cos, params, step)

  def one(a: Side, b: Side) -> jax.Array:
    block = 128 if block_size is None else block_size
    block_a, block_b = balanced_tile(block, a.ids.shape[0]), balanced_tile(block, b.ids.shape[0])
    pa, pb = pad_side(a, block_a), pad_side(b, block_b)
    lse = _row_lse(fn, treedef, block_a, block_b, interpret, theta, pa.vectors, pa.valid,
                   pa.ids, pa.positive_ids, pb.vectors, pb.valid, pb.ids)
    return lse[:a.ids.shape[0]]

  if kind == "symmetric":
    return one(rows, rows), None
  row_lse = one(rows, columns)
  if kind == "rows":
    return row_lse, None
  swapped = Side(columns.vectors, columns.ids, columns.ids, columns.valid)
  anchors = Side(rows.vectors, rows.ids, rows.positive_ids, rows.valid)
  return row_lse, one(swapped, anchors)
