"""Normalisation and the layout of rows and candidates for every InfoNCE mode.

One place turns `(z1, z2, negatives, symmetric, where)`, once `_arguments` has checked them,
into the sides of the similarity matrix, their ids and masks, and the positive cosines; the
single-device and the sharded losses both start here.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks
from tfcl_jax.losses._engine._tiles import Side, is_raw, stats_dtype

# The L2 normalisation's floor on a row's norm (PyTorch's `F.normalize(eps=1e-12)`, rounded down
# to a power of two so that pre-scaled rows share one floor): a row of smaller norm is divided by
# the floor, a zero row maps to zero (cosine 0 with everything).
_NORM_FLOOR = 2.0 ** -40  # 9.09e-13


def norm_floor(dtype: jax.typing.DTypeLike) -> float:
  """The floor on a row's norm for inputs of `dtype`: `2^-40` (9.1e-13), or `2^-14` (6.1e-5,
  float16's smallest normal number) for float16.

  Norms are computed in float32 at least, so every row keeps its direction down to the floor:
  in float16, every row with a normal entry. A row of smaller norm is divided by the floor
  (`z / floor`, PyTorch's `F.normalize` convention): a zero row maps to zero, cosine 0 with
  every row, and its gradient is `1 / floor` times its unit row's, `2^40`, or `2^14` for
  float16 inputs, whose largest finite value is 65504: finite for unit-row gradients up to 4.

  Examples:
    >>> from tfcl_jax import losses
    >>> losses.norm_floor("float32") == 2.0 ** -40, losses.norm_floor("float16")
    (True, 6.103515625e-05)
  """
  return 2.0 ** -14 if jnp.dtype(dtype) == jnp.float16 else _NORM_FLOOR


def _power_of_two(exponent: jax.Array, dtype) -> jax.Array:
  """`2^exponent` exactly, for integer `exponent` in `[-2 max_exp + 2, 2 max_exp - 2]` of `dtype`,
  as a product of two normal powers of two (a single factor would be subnormal beyond
  `2^-min_exp`, which XLA may flush to zero)."""
  info = jnp.finfo(dtype)
  bits = jnp.dtype(dtype).itemsize * 8
  integer = {32: jnp.int32, 64: jnp.int64}[bits]
  bias = int(info.maxexp) - 1

  def normal(k):
    return jax.lax.bitcast_convert_type((k.astype(integer) + bias) << int(info.nmant), dtype)

  half = exponent // 2
  return normal(half) * normal(exponent - half)


def scaled_rows(z: jax.Array, *, eps: float, axis: int = -1) -> tuple[jax.Array, jax.Array]:
  """`(r, floor)`: `r = z / 2^e` per row, `2^e` the power of two just above the row's largest
  entry (at least the one above `eps`), and `floor = eps / 2^e`, the floor in `r`'s units.

  Dividing by a power of two is exact, so `r / max(||r||, floor) = z / max(||z||, eps)`; but the
  squares of `r`'s entries are at most 1, so `||r||` neither overflows (rows beyond ~1e19 in
  float32) nor underflows (rows below ~1e-19). One more reduction per row: the largest entry.
  Where `eps` is a power of two, `floor <= 1/2 <= ||r||` for every row of norm `>= eps`, and
  `floor = 1/2` for the others: the kernels take `r` and `1 / max(||r||, 1/2)`.
  `z` must be float32 or float64 (the compute dtypes); `2^e` carries no gradient.
  """
  dtype = z.dtype
  largest = jax.lax.stop_gradient(jnp.max(jnp.abs(z), axis=axis, keepdims=True))
  _, exponent = jnp.frexp(largest)  # largest = m 2^e, m in [1/2, 1); inf, NaN: e = 0
  # A zero row takes the floor's exponent, as every row below the floor does.
  floor_exponent = int(np.frexp(eps)[1])
  exponent = jnp.where(largest > 0, jnp.maximum(exponent, floor_exponent), floor_exponent)
  r = z * _power_of_two(-exponent, dtype)
  return r, eps * _power_of_two(-exponent, dtype)


def l2_normalize(z: jax.typing.ArrayLike, *, axis: int = -1,
                 eps: float = _NORM_FLOOR) -> jax.Array:
  r"""`z / max(||z||, eps)` along `axis`, exact at every scale: finite values and gradients at
  z = 0.

  Cosines do not depend on the norm, and neither does this: rows are scaled by a power of two
  before squaring (`scaled_rows`), so a row of norm 1e-30 or 1e30 in float32 comes out as the
  same unit row as at norm 1. A row of norm below `eps` is divided by `eps` (PyTorch's
  `F.normalize` convention): a zero row stays zero.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax import losses
    >>> losses.l2_normalize(jnp.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]
    >>> row = jnp.array([3.0, 4.0])
    >>> losses.l2_normalize(jnp.stack([row * 2.0**100, row * 2.0**-30])).tolist()
    [[0.6000000238418579, 0.800000011920929], [0.6000000238418579, 0.800000011920929]]

  Args:
    z: a float array.
    axis: the axis of the vectors' entries.
    eps: the floor on the norm, a float > 0.
  """
  z = jnp.asarray(z)
  r, floor = scaled_rows(z, eps=eps, axis=axis)
  squared_norm = jnp.sum(r * r, axis=axis, keepdims=True)
  return r * jax.lax.rsqrt(jnp.maximum(squared_norm, floor * floor))


def unit_rows(z: jax.Array, dtype) -> jax.Array:
  """`z` in the compute `dtype`, L2-normalised with the floor of its own dtype."""
  return l2_normalize(z.astype(dtype), eps=norm_floor(z.dtype))


#: The floor on the norm of raw rows as `raw_rows` scales them (`norm_floor` in their units).
RAW_ROW_FLOOR = 0.5


def raw_rows(z: jax.Array) -> jax.Array:
  """Raw 16-bit rows for the tiles and the fused kernels, scaled by a power of two (exact,
  `scaled_rows`): their entries lie below 1 in magnitude, their products neither overflow nor
  underflow, and `r / max(||r||, RAW_ROW_FLOOR)` is `z / max(||z||, norm_floor(z.dtype))` at every
  scale."""
  r, _ = scaled_rows(z.astype(jnp.float32), eps=norm_floor(z.dtype))
  return r.astype(z.dtype)


def operand_dtype(*dtypes) -> jnp.dtype:
  """The dtype the tile products take for inputs of `dtypes`: their common dtype when it is a
  16-bit float (bfloat16, float16: raw rows, products accumulated in float32), else the compute
  dtype (float32 at least: unit rows)."""
  common = jnp.result_type(*dtypes)
  return common if jnp.dtype(common).itemsize < 4 else _checks.compute_dtype(*dtypes)


def operand_rows(z: jax.Array, dtype) -> jax.Array:
  """The rows of `z` as the tiles take them for the operand `dtype` (`operand_dtype`): raw rows
  (`raw_rows`) of a 16-bit dtype, normalised inside the engine with float32 norms applied after
  each product; else unit rows (`unit_rows`)."""
  if jnp.dtype(dtype).itemsize < 4:
    return raw_rows(z.astype(dtype))
  return unit_rows(z, dtype)


def inverse_norms(vectors: jax.Array) -> jax.Array:
  """`1 / max(||r||, RAW_ROW_FLOOR)` in float32 for raw rows `r` (`raw_rows`: the floor of
  `losses.l2_normalize` at every scale), ones for unit rows."""
  if not is_raw(vectors):
    return jnp.ones(vectors.shape[:1], stats_dtype(vectors))
  r = vectors.astype(jnp.float32)
  return jax.lax.rsqrt(jnp.maximum(jnp.sum(r * r, axis=1), RAW_ROW_FLOOR * RAW_ROW_FLOOR))


def unit(vectors: jax.Array) -> jax.Array:
  """Unit rows: raw rows normalised in float32 (`RAW_ROW_FLOOR`), unit rows as they are."""
  if not is_raw(vectors):
    return vectors
  return _normalize_raw(vectors.astype(jnp.float32))


def _normalize_raw(r: jax.Array) -> jax.Array:
  return l2_normalize(r, eps=RAW_ROW_FLOOR)


def through_norm(vectors: jax.Array, unit_grad: jax.Array) -> jax.Array:
  """The cotangent of a side's `vectors` from the gradient `unit_grad` of its unit rows: itself
  for unit rows; for raw rows, carried through their normalisation (`unit`) in float32 and
  rounded once, to the rows' dtype."""
  if not is_raw(vectors):
    return unit_grad
  _, vjp = jax.vjp(_normalize_raw, vectors.astype(unit_grad.dtype))
  return vjp(unit_grad)[0].astype(vectors.dtype)


def candidates_per_anchor(n: int, negatives: str, bank: jax.Array | None = None) -> int:
  """Candidates per anchor of a batch of `n` pairs (the static count, padding included):
  `n` for `"cross"`, `2n - 1` for `"all"`, plus the bank's `K` rows. The `N` that the mapping
  `free_n` takes from the loss."""
  count = 2 * n - 1 if negatives == "all" else n
  return count + (0 if bank is None else bank.shape[0])


class Layout(NamedTuple):
  """The sides of the similarity matrix for one mode, and the positives' cosines.

  `rows`: the anchors; `columns`: the candidates (None when the matrix is `rows rows^T`);
  `kind`: the engine's matrix kind; `positive_cos`: `[M]` per anchor row (and per column for
  the two-tower loss, appended after the rows).
  """

  rows: Side
  columns: Side | None
  kind: str
  positive_cos: jax.Array


def layout(z1: jax.Array, z2: jax.Array, *, negatives: str, symmetric: bool,
           valid: jax.Array | None, offset: int | jax.Array = 0) -> Layout:
  """Rows and candidates of InfoNCE (see `info_nce`) for the views `z1`, `z2` of `[n, D]`, as
  the tiles take them in the views' common dtype (`operand_rows`: raw 16-bit rows, or unit rows
  in float32 or float64); the positives' cosines in float32 at least.

  Ids are `offset + 0 .. n-1` for the pairs (`cross`), or `offset + 0 .. 2n-1` for the rows
  of `concat([u1, u2])` (`all`); `offset` places a device's rows in a sharded batch.
  """
  dtype = operand_dtype(z1.dtype, z2.dtype)
  v1, v2 = operand_rows(z1, dtype), operand_rows(z2, dtype)
  n = v1.shape[0]
  valid = jnp.ones((n,), bool) if valid is None else valid
  positive_cos = jnp.sum(unit(v1) * unit(v2), axis=-1)
  if negatives == "cross":
    ids = offset + jnp.arange(n, dtype=jnp.int32)
    rows, columns = Side(v1, ids, ids, valid), Side(v2, ids, ids, valid)
    if symmetric:
      return Layout(rows, columns, "rows_and_columns", jnp.concatenate([positive_cos] * 2))
    return Layout(rows, columns, "rows", positive_cos)
  ids = offset + jnp.arange(2 * n, dtype=jnp.int32)
  positive_ids = jnp.concatenate([ids[n:], ids[:n]])
  both = Side(jnp.concatenate([v1, v2]), ids, positive_ids, jnp.concatenate([valid, valid]))
  return Layout(both, None, "symmetric", jnp.concatenate([positive_cos] * 2))


def bank_side(bank: jax.Array, where: jax.Array | None, row_dtype) -> Side:
  """Extra negatives as candidate columns, never an anchor's self or positive: raw rows when
  the bank and the anchors (`row_dtype`, their vectors' dtype) share a 16-bit dtype, else unit
  rows (`operand_rows`).

  Rows masked out by `where` are zeroed: they are no candidates, and whatever they hold (a NaN
  in an unfilled queue slot) must not reach the anchors' gradient through the tile products.
  """
  k = bank.shape[0]
  ids = jnp.full((k,), -3, jnp.int32)
  vectors = operand_rows(bank, operand_dtype(bank.dtype, row_dtype))
  if where is None:
    valid = jnp.ones((k,), bool)
  else:
    valid, vectors = where, jnp.where(where[:, None], vectors, jnp.zeros((), vectors.dtype))
  return Side(jax.lax.stop_gradient(vectors), ids, ids, valid)


def anchor_valid(layout_: Layout) -> jax.Array:
  """`[rows]` (plus `[columns]` for the two-tower loss) bool: which per-row losses count."""
  if layout_.kind == "rows_and_columns":
    assert layout_.columns is not None  # the two-tower kind has a column side
    return jnp.concatenate([layout_.rows.valid, layout_.columns.valid])
  return layout_.rows.valid


def reduce(per_row: jax.Array, valid: jax.Array, reduction: str, *, masked: bool) -> jax.Array:
  """Zeroes the losses of invalid anchors and reduces (`mean` over valid anchors)."""
  per_row = jnp.where(valid, per_row, 0.0)
  if reduction == "none":
    return per_row
  if reduction == "sum":
    return jnp.sum(per_row)
  count = jnp.maximum(jnp.sum(valid), 1) if masked else per_row.shape[0]
  return jnp.sum(per_row) / count
