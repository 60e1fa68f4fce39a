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
from tfcl_jax.losses._tiles import Side

NEGATIVES = ("cross", "all")
REDUCTIONS = ("mean", "sum", "none")

# Squared-norm floor of the L2 normalisation: a zero vector maps to zero
# (cosine 0 with everything) with finite gradients (at most 1/sqrt(floor)) instead of 0/0.
_NORM_EPS = 1e-12


def norm_floor(dtype: jax.typing.DTypeLike) -> float:
  """Squared-norm floor for inputs of `dtype`: 1e-12, or float16's smallest normal (6e-5).

  The gradient at a zero vector is `1/sqrt(floor)`: 1e6, or 128 for float16, whose
  largest finite value is 65504.

  Examples:
    >>> from tfcl_jax import losses
    >>> losses.norm_floor("float32"), round(losses.norm_floor("float16"), 7)
    (1e-12, 6.1e-05)
  """
  return max(_NORM_EPS, float(jnp.finfo(dtype).tiny))


def l2_normalize(z: jax.typing.ArrayLike, *, axis: int = -1, eps: float = _NORM_EPS) -> jax.Array:
  r"""`z / sqrt(max(||z||^2, eps))` along `axis`: finite values and gradients at z = 0.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax import losses
    >>> losses.l2_normalize(jnp.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]
  """
  z = jnp.asarray(z)
  squared_norm = jnp.sum(z * z, axis=axis, keepdims=True)
  return z * jax.lax.rsqrt(jnp.maximum(squared_norm, eps))


def unit_rows(z: jax.Array, dtype) -> jax.Array:
  """`z` in the compute `dtype`, L2-normalised with the floor of its own dtype."""
  return l2_normalize(z.astype(dtype), eps=norm_floor(z.dtype))


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
    >>> from tfcl_jax.losses import _layout
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
  """A loss's `mapping` as a `Mapping` (`mappings.as_mapping`); a spec string of a mapping with
  trainable params is refused.

  A string cannot hold parameters: the mapping would be built afresh at their initial values on
  every call (`learnable_free=100`'s `t = 0`, the temperature-free mapping itself) and nothing
  would ever train them. The error says how to hold them.

  Raises:
    ValueError: `mapping` is a spec string of a mapping with trainable params.
  """
  built = mappings.as_mapping(mapping, num_candidates=num_candidates)
  if isinstance(mapping, str) and built.learnable:
    spec, names = built.spec, sorted(built.params)
    raise ValueError(
        f"mapping={mapping!r} has trainable params {names}, which a spec string cannot hold: "
        f"the loss would use their initial values on every call and never train them. Build "
        f"the mapping once, m = mappings.from_spec({spec!r}), keep m.params with the trainable "
        f"params (e.g. params['loss']) and pass mapping=m.bind(params=params['loss']) (the "
        f"README's quickstart), or name the loss by its loss spec, losses.from_spec({spec!r}), "
        f"whose params go into the train state; to evaluate at the initial values, pass "
        f"mapping=mappings.from_spec({spec!r}).")
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


def layout(u1: jax.Array, u2: jax.Array, *, negatives: str, symmetric: bool,
           valid: jax.Array | None, offset: int | jax.Array = 0) -> Layout:
  """Rows and candidates of InfoNCE (see `info_nce`) for unit `u1`, `u2` of `[n, D]`.

  Ids are `offset + 0 .. n-1` for the pairs (`cross`), or `offset + 0 .. 2n-1` for the rows
  of `concat([u1, u2])` (`all`); `offset` places a device's rows in a sharded batch.
  """
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
