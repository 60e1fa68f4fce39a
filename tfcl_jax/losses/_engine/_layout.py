"""Checks, normalisation and the layout of rows and candidates for every InfoNCE mode.

One place turns `(z1, z2, negatives, symmetric, where)` into the sides of the similarity
matrix, their ids and masks, and the positive cosines; the single-device and the sharded
losses both start here.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from tfcl_jax import _checks, mappings
from tfcl_jax.losses._engine._tiles import Side

NEGATIVES = ("cross", "all")
REDUCTIONS = ("mean", "sum", "none")

# The L2 normalisation's floor on a row's norm (PyTorch's `F.normalize(eps=1e-12)`, rounded down
# to a power of two so that the kernels' pre-scaled rows share one floor): a row of smaller norm
# is divided by the floor, a zero row maps to zero (cosine 0 with everything).
_NORM_FLOOR = 2.0 ** -40  # 9.09e-13


def norm_floor(dtype: jax.typing.DTypeLike) -> float:
  """The floor on a row's norm for inputs of `dtype`: `2^-40` (9.1e-13), or `2^-7` for float16.

  Rows of norm at least the floor are normalised exactly at every scale the dtype holds; a row
  of smaller norm is divided by the floor (`z / floor`, PyTorch's `F.normalize` convention), so a
  zero row maps to zero, cosine 0 with every row, with gradient `1 / floor`: `2^40`, or 128 for
  float16 inputs, whose largest finite value is 65504.

  Examples:
    >>> from tfcl_jax import losses
    >>> losses.norm_floor("float32") == 2.0 ** -40, losses.norm_floor("float16")
    (True, 0.0078125)
  """
  return 2.0 ** -7 if jnp.dtype(dtype) == jnp.float16 else _NORM_FLOOR


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
  """Raw 16-bit rows for the fused kernels, scaled by a power of two (exact, `scaled_rows`):
  their entries lie below 1 in magnitude, their products neither overflow nor underflow, and
  `r / max(||r||, RAW_ROW_FLOOR)` is `z / max(||z||, norm_floor(z.dtype))` at every scale."""
  r, _ = scaled_rows(z.astype(jnp.float32), eps=norm_floor(z.dtype))
  return r.astype(z.dtype)


def check_bias_row(bias, n: int, *, rows: str) -> jax.Array:
  """`bias` as `[n]` floats, one per row of `rows` (a candidate's logit bias).

  Raises:
    TypeError: not floats; ValueError: another shape (both name `candidate_bias`).
  """
  bias = jnp.asarray(bias)
  if not jnp.issubdtype(bias.dtype, jnp.floating):
    raise TypeError(f"candidate_bias must be a float array, got dtype {bias.dtype}.")
  if bias.shape != (n,):
    raise ValueError(f"candidate_bias must have shape ({n},) (one per row of {rows}), got "
                     f"{bias.shape}.")
  return bias


def check_where(where, n: int, *, name: str = "where") -> jax.Array | None:
  if where is None:
    return None
  where = jnp.asarray(where)
  if where.dtype != jnp.bool_:
    raise TypeError(f"{name} must be a boolean mask, got dtype {where.dtype}.")
  if where.shape != (n,):
    raise ValueError(f"{name} must have shape ({n},), got {where.shape}.")
  return where


def check_block_size(block_size: int | None) -> int | None:
  """Checks `block_size`: None (automatic) or an int > 0.

  Examples:
    >>> from tfcl_jax.losses import check_block_size
    >>> check_block_size(512), check_block_size(None)
    (512, None)
  """
  if block_size is None:
    return None
  return _checks.positive_int(block_size, name="block_size (or None: automatic)")


def check_embeddings(z, *, name: str, rows: str = "N") -> jax.Array:
  """Checks float embeddings `[rows, D]` with `D >= 1`: a cosine needs at least one feature.

  Every loss's inputs go through here (and `check_pair`), so an empty feature axis fails
  with its name instead of deep inside the tiles.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.losses._engine import _layout
    >>> _layout.check_embeddings(jnp.zeros((8, 0)), name="z1")
    Traceback (most recent call last):
    ...
    ValueError: z1 must have D >= 1 features (shape [N, D]), got shape (8, 0).

  Raises:
    TypeError: `z` is not floating.
    ValueError: `z` is not rank 2, or has no features.
  """
  z = _checks.float_matrix(z, name=name)
  if z.shape[1] < 1:
    raise ValueError(f"{name} must have D >= 1 features (shape [{rows}, D]), got shape "
                     f"{z.shape}.")
  return z


def check_pair(z1, z2, *, local: bool = False, names: tuple[str, str] = ("z1", "z2")
               ) -> tuple[jax.Array, jax.Array]:
  """Checks two views `[N, D]`, `D >= 1`, of the same shape (`local`: a device's share, N >= 1);
  errors call them `names`."""
  first, second = names
  z1 = check_embeddings(z1, name=first)
  z2 = check_embeddings(z2, name=second)
  if z1.shape != z2.shape:
    raise ValueError(f"{first} and {second} must have the same shape [N, D], got {z1.shape} and "
                     f"{z2.shape}.")
  if not local and z1.shape[0] < 2:
    raise ValueError(f"{first} and {second} need N >= 2 pairs to have a negative, got "
                     f"N = {z1.shape[0]}.")
  return z1, z2


#: The values of the losses' `check_finite`: off, checks of concrete values, or checks that
#: `jax.experimental.checkify` reports from inside a trace.
CHECK_FINITE = (False, True, "checkify")


def check_finite_mode(check_finite) -> bool | str:
  """`check_finite` checked: one of `CHECK_FINITE`.

  Raises:
    ValueError: any other value.
  """
  if not any(check_finite is value or (isinstance(value, str) and check_finite == value)
             for value in CHECK_FINITE):
    raise ValueError(f"check_finite must be one of {CHECK_FINITE}, got {check_finite!r}.")
  return check_finite


def _traced(what: str) -> ValueError:
  return ValueError(
      f"check_finite=True checks concrete values, but {what} is traced (the loss is inside "
      "jax.jit, grad, vmap or another transformation). A check inside a trace is reported only "
      "through jax.experimental.checkify: pass check_finite='checkify' and wrap the traced "
      "function, error, value = checkify.checkify(jax.jit(f))(...), then error.throw() raises "
      "the first failed check.")


def check_finite(x: jax.Array, *, name: str, mode: bool | str) -> None:
  """`check_finite` of the losses: every value of `x` is finite (no NaN, no inf).

  Concrete `x` (called outside any transformation) raises at once. A traced `x` adds a
  `jax.experimental.checkify` check under `mode="checkify"`, reported by the function that
  `checkify.checkify` wraps; under `mode=True` it is refused, since JAX can report a check
  inside a trace only through checkify.

  Raises:
    ValueError: concrete `x` holds a NaN or an inf (names `name` and the first bad row); a
      traced `x` under `mode=True` (says how to check it).
  """
  if _checks.is_concrete(x):
    bad = ~np.isfinite(np.asarray(x))
    if bad.any():
      row = int(np.argwhere(bad)[0][0])
      raise ValueError(f"{name} must be finite (check_finite), got {int(bad.sum())} "
                       f"NaN/inf value(s), the first in row {row}.")
    return
  if mode != "checkify":
    raise _traced(name)
  checkify.check(jnp.all(jnp.isfinite(x)), f"{name} must be finite (check_finite), got "
                 "NaN/inf value(s).")


def check_parameters(mapping: mappings.Mapping, *, mode: bool | str) -> None:
  """`check_finite` of the losses: the mapping's parameters meet its declared conditions.

  `Mapping.parameter_checks`: a traced `tau` finite and > 0, a learnable `t` finite, ...
  A concrete condition raises at once; a traced one adds a `jax.experimental.checkify` check
  under `mode="checkify"` and is refused under `mode=True`, as `check_finite` does. Without it
  a traced `tau = 0` gives a non-finite loss and `tau < 0` a finite but meaningless one.

  Raises:
    ValueError: a concrete parameter fails its condition (names the parameter and the mapping);
      a traced one under `mode=True`.
  """
  for check in mapping.parameter_checks():
    # `{}` is checkify's slot for the traced value; braces of the names are escaped.
    condition = f"{check.name} must be {check.requirement} (check_finite)"
    message = (condition.replace("{", "{{").replace("}", "}}") + ", got {} (mapping "
               + repr(mapping.spec).replace("{", "{{").replace("}", "}}") + ").")
    if _checks.is_concrete(check.valid):
      if not bool(check.valid):
        raise ValueError(message.format(np.asarray(check.value)))
    elif mode != "checkify":
      raise _traced(f"the parameter {check.name} of mapping {mapping.spec!r}")
    else:
      checkify.check(check.valid, message, check.value)


def loss_mapping(mapping: mappings.MappingLike | None, *, num_candidates: int
                 ) -> mappings.Mapping:
  """A loss's `mapping` as a `Mapping` (`mappings.as_mapping`), refusing what would silently
  not train or not follow its schedule.

  Refused, each with the fix in the message:

  - a spec string of a mapping with trainable params (`"learnable_free=100"`): a string cannot
    hold them, the loss would rebuild them at their initial values on every call;
  - a built mapping with trainable params that was never bound (`mapping=m` rather than
    `m.bind(params=p["loss"])`) and whose params are not traced: the loss sees constants, and
    the gradient on them is 0 (a mapping passed through `jax.grad` as an argument has traced
    params and trains: it passes). `m.bind(params=m.params)` holds them fixed on purpose;
  - a spec string of a scheduled mapping (`"anneal=log:0.5"`), or a built one without a bound
    step: it would run at step 0 on every call. `m.bind(step=step)` gives it the step.

  Raises:
    ValueError: one of the above, naming the mapping and the fix.
  """
  built = mappings.as_mapping(mapping, num_candidates=num_candidates)
  spec = built.spec
  if isinstance(mapping, str) and built.learnable:
    names = sorted(built.params)
    raise ValueError(
        f"mapping={mapping!r} has trainable params {names}, which a spec string cannot hold: "
        f"the loss would use their initial values on every call and never train them. Build "
        f"the mapping once, m = mappings.from_spec({spec!r}), keep m.params with the trainable "
        f"params (e.g. params['loss']) and pass mapping=m.bind(params=params['loss']) (the "
        f"README's quickstart), or name the loss by its loss spec, losses.from_spec({spec!r}), "
        f"whose params go into the train state; to evaluate at the initial values on purpose, "
        f"pass mapping=m.bind(params=m.params).")
  if built.learnable and not built.bound and all(
      _checks.is_concrete(leaf) for leaf in jax.tree.leaves(built.params)):
    raise ValueError(
        f"mapping {spec!r} has trainable params {sorted(built.params)} but was passed unbound: "
        f"the loss would use the values it was built with, and the gradient on them would be 0 "
        f"(they would never train). Keep m.params with the trainable params (e.g. "
        f"params['loss']) and pass mapping=m.bind(params=params['loss']) inside the loss "
        f"function (the README's quickstart); to hold them fixed on purpose (evaluation, a "
        f"frozen scale), pass mapping=m.bind(params=m.params).")
  if built.scheduled and built.step is None:
    where = (f"mapping={mapping!r} is a spec string, which cannot carry the training step"
             if isinstance(mapping, str) else f"mapping {spec!r} was passed without a step")
    raise ValueError(
        f"{where}: the schedule would stay at step 0 on every call and never anneal. Build it "
        f"once, m = mappings.from_spec({spec!r}), and pass mapping=m.bind(step=step) with the "
        f"train state's step (losses.from_spec({spec!r}) takes step= when called); to evaluate "
        f"at step 0 on purpose, pass mapping=m.bind(step=0).")
  return built


def check_mode(negatives: str, symmetric: bool, reduction: str) -> None:
  _checks.one_of(negatives, NEGATIVES, name="negatives")
  _checks.one_of(reduction, REDUCTIONS, name="reduction")
  if not isinstance(symmetric, (bool, np.bool_)):
    raise TypeError(f"symmetric must be a bool, got {symmetric!r}.")
  if symmetric and negatives == "all":
    raise ValueError(
        'symmetric=True is for negatives="cross" (CLIP\'s two-tower loss); negatives="all" '
        "already scores every row of both views as an anchor.")


def check_extra(extra_negatives, extra_where, dim: int):
  """Checks a bank of extra negatives `[K, D]` and its optional mask `[K]`."""
  if extra_negatives is None:
    if extra_where is not None:
      raise ValueError("extra_where was given without extra_negatives.")
    return None, None
  bank = _checks.float_matrix(extra_negatives, name="extra_negatives")
  if bank.shape[1] != dim:
    raise ValueError(f"extra_negatives must have shape [K, {dim}] (the embeddings' D), got "
                     f"{bank.shape}.")
  return bank, check_where(extra_where, bank.shape[0], name="extra_where")


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
  their unit rows `u1`, `u2` in the views' common dtype (`unit_rows`).

  Ids are `offset + 0 .. n-1` for the pairs (`cross`), or `offset + 0 .. 2n-1` for the rows
  of `concat([u1, u2])` (`all`); `offset` places a device's rows in a sharded batch.
  """
  dtype = _checks.compute_dtype(z1.dtype, z2.dtype)
  u1, u2 = unit_rows(z1, dtype), unit_rows(z2, dtype)
  n = u1.shape[0]
  valid = jnp.ones((n,), bool) if valid is None else valid
  positive_cos = jnp.sum(u1 * u2, axis=-1)
  if negatives == "cross":
    ids = offset + jnp.arange(n, dtype=jnp.int32)
    rows, columns = Side(u1, ids, ids, valid), Side(u2, ids, ids, valid)
    if symmetric:
      return Layout(rows, columns, "rows_and_columns", jnp.concatenate([positive_cos] * 2))
    return Layout(rows, columns, "rows", positive_cos)
  ids = offset + jnp.arange(2 * n, dtype=jnp.int32)
  positive_ids = jnp.concatenate([ids[n:], ids[:n]])
  both = Side(jnp.concatenate([u1, u2]), ids, positive_ids, jnp.concatenate([valid, valid]))
  return Layout(both, None, "symmetric", jnp.concatenate([positive_cos] * 2))


def bank_side(bank: jax.Array, where: jax.Array | None, dtype) -> Side:
  """Extra negatives as candidate columns: unit rows, never an anchor's self or positive."""
  k = bank.shape[0]
  ids = jnp.full((k,), -3, jnp.int32)
  valid = jnp.ones((k,), bool) if where is None else where
  return Side(jax.lax.stop_gradient(unit_rows(bank, dtype)), ids, ids, valid)


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
