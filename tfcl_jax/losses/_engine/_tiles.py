"""One tile of a contrastive loss: cosines, the candidate mask, and the tile's share of the
row (and column) statistics, forward and backward.

A tile is `a @ b.T` for a block of anchors `a` and a block of candidates `b` (`cosines`): a
product in the rows' own dtype accumulated in float32 at least, unit rows as they are, raw
16-bit rows scaled by their float32 inverse norms after the product. Everything that differs
between losses lives in a `TileReduction` (InfoNCE's `LogSumExp`; SigLIP's `SigmoidSum` and
SupCon's `PositiveSum` in `_sums`); everything that differs between mappings lives in the
mapping (`Mapping.fn`, and its `exp_form` when it has one). A fused kernel replaces `forward`
and `backward` one for one.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from tfcl_jax.mappings import ExpForm


class Side(NamedTuple):
  """Rows of one side of the similarity matrix.

  `vectors: [M, D]` unit rows (float32, float64), or raw rows of a 16-bit float (`is_raw`:
  `_layout.raw_rows`, normalised by `inverse_norm`); `ids: [M] int32` identities;
  `positive_ids: [M] int32` the id of
  each row's positive (excluded from its negatives, as is its own id); `valid: [M] bool`;
  `bias: [M]` or None, added to a row's logit wherever the row is a candidate (the
  sampling-bias correction `-log q_j` of Yi et al. 2019); it takes no gradient. `scale: [M]` or
  None, the row's multiplier `s_i > 0` of its logits wherever the row is the anchor (a per-anchor
  scale solved from the batch, `mappings.perplexity_free`); it takes no gradient either.
  `LogSumExp` and `PositiveSum` multiply the anchor's logits, `s_i f(c)` (a constant added to
  every logit of an anchor cancels in their losses); `SigmoidSum` scales them about the mapping's
  value at `c = 0` (`anchor_logits`), so that the sigmoid loss's bias `b`, folded into its
  mapping, stays outside the scale: `s_i 2 artanh(c) + b`. `inverse_norm: [M]` float32 or None,
  `1 / max(||r||, floor)` of raw rows: set by the engine inside its custom VJP
  (`_tiled.with_inverse_norms`), None elsewhere and for unit rows.
  """

  vectors: jax.Array
  ids: jax.Array
  positive_ids: jax.Array
  valid: jax.Array
  bias: jax.Array | None = None
  scale: jax.Array | None = None
  inverse_norm: jax.Array | None = None


def is_raw(vectors: jax.Array) -> bool:
  """Whether a side's vectors are raw rows (16-bit floats, `_layout.raw_rows`) rather than unit
  rows."""
  return jnp.dtype(vectors.dtype).itemsize < 4


def stats_dtype(vectors: jax.Array):
  """The dtype of the tile math, of the statistics and of the products' accumulation for a
  side's `vectors`: float32 at least (float64 for float64 unit rows)."""
  return jnp.promote_types(vectors.dtype, jnp.float32)


def _product(x: jax.Array, y: jax.Array, contract: int) -> jax.Array:
  """`x [m, n] . y` over `x`'s axis 1 and `y`'s axis `contract`, in the operands' dtype,
  accumulated in float32 at least (`preferred_element_type`)."""
  return jax.lax.dot_general(x, y, (((1,), (contract,)), ((), ())),
                             preferred_element_type=jnp.promote_types(x.dtype, jnp.float32))


def cosines(a: Side, b: Side) -> jax.Array:
  """`[m, k]` the tile's cosines `u_i . u_j`: the product of the two blocks' vectors in their
  dtype, accumulated in float32 at least; for raw rows, scaled after the product by the rows'
  float32 inverse norms, so the cosines carry no rounding beyond the inputs' own and the
  accumulation's."""
  cos = _product(a.vectors, b.vectors, 1)
  if a.inverse_norm is None:
    return cos
  assert b.inverse_norm is not None, "both sides of a tile hold raw rows, or neither"
  return cos * a.inverse_norm[:, None] * b.inverse_norm[None, :]


def weighted_rows(weights: jax.Array, b: Side) -> jax.Array:
  """`[m, D]` `sum_j w_ij u_j` for a tile's cotangent `weights [m, k]` and the unit rows `u` of
  `b`, accumulated in float32 at least: for raw rows, the weights times `b`'s inverse norms are
  rounded to the rows' dtype and multiplied with the raw rows. float16's five exponent bits hold
  2^-24 to 65504, where a softmax's weights span many more decades: each row of weights is
  first scaled by a power of two that brings its largest to [1/2, 1) (exact), and the product's
  row scaled back in float32."""
  if b.inverse_norm is not None:
    weights = weights * b.inverse_norm[None, :]
  if b.vectors.dtype != jnp.float16:
    return _product(weights.astype(b.vectors.dtype), b.vectors, 0)
  largest = jnp.max(jnp.abs(weights), axis=1)
  _, exponent = jnp.frexp(jnp.where(largest > 0, largest, 1.0))  # inf, NaN: exponent 0
  scaled = jnp.ldexp(weights, -exponent[:, None])
  return jnp.ldexp(_product(scaled.astype(jnp.float16), b.vectors, 0), exponent[:, None])


class MappingArgs(NamedTuple):
  """A mapping made pure: `fn(cos, params, step, *consts)` and its array arguments.

  `consts` are traced values `fn` closed over (e.g. a traced `tau`), hoisted by
  `jax.closure_convert` so that a custom VJP can return their gradients.
  """

  params: dict[str, Any]
  step: jax.Array
  consts: tuple[jax.Array, ...]


@dataclasses.dataclass(frozen=True)
class TileMapping:
  """The static part of a mapping inside the kernels: its pure `fn`, and the closed form the
  reduction asked the mapping for (`exp_form` for InfoNCE, `log_sigmoid_form` for SigLIP), or
  None."""

  fn: Callable[..., jax.Array]
  fast: Any


def mask(rows: Side, columns: Side) -> jax.Array:
  """`[m, k]` bool: column j is a negative of row i (and, by symmetry, row i of column j)."""
  return (rows.valid[:, None] & columns.valid[None, :]
          & (columns.ids[None, :] != rows.ids[:, None])
          & (columns.ids[None, :] != rows.positive_ids[:, None]))


def _logits(tile_mapping: TileMapping, cos, args: MappingArgs):
  return tile_mapping.fn(cos, args.params, args.step, *args.consts)


def anchor_logits(logits: jax.Array, scale: jax.Array | None,
                  zero: jax.Array | None = None) -> jax.Array:
  """`logits` as an anchor with a per-anchor `scale` scores them (`Side.scale`): `scale logits`,
  or `zero + scale (logits - zero)` about the mapping's value `zero = f(0)`; `logits` where
  `scale` is None. `scale` broadcasts against `logits` (`[m, 1]` for rows, `[1, k]` for
  columns)."""
  if scale is None:
    return logits
  return scale * logits if zero is None else zero + scale * (logits - zero)


def _pair_logits(tile_mapping: TileMapping, step, a: Side, b: Side, *, about_zero: bool = False):
  """`fn(cos, params, *consts) -> (row_logits, col_logits)`: the tile's logits as `a`'s rows
  score them and as `b`'s rows score them (one array twice without a per-anchor scale);
  `about_zero`: scaled about `f(0)` (`anchor_logits`), the mapping evaluated at 0 once more."""

  def fn(cos, params, *consts):
    args = MappingArgs(params, step, consts)
    logits = _logits(tile_mapping, cos, args)
    if a.scale is None and b.scale is None:
      return logits, logits
    # A whole tile of zeros: the pure fn is traced for the tile's shape (`jax.closure_convert`).
    zero = _logits(tile_mapping, jnp.zeros_like(cos), args) if about_zero else None
    row_scale = None if a.scale is None else a.scale[:, None]
    col_scale = None if b.scale is None else b.scale[None, :]
    return anchor_logits(logits, row_scale, zero), anchor_logits(logits, col_scale, zero)

  return fn


def _check_fast(tile_mapping: TileMapping, a: Side, b: Side) -> bool:
  """Whether the tile takes the mapping's closed form; never with a per-anchor scale (`w^s` has
  none: the engine then asks for no closed form, `_pure.pure_mapping(closed_form=False)`)."""
  if tile_mapping.fast is None:
    return False
  assert a.scale is None and b.scale is None, "a per-anchor scale takes the mapping's fn"
  return True


def _fold(stats, logits, axis: int):
  """Online logsumexp: folds `logits` (masked to -inf) into `(max, sum exp(logit - max))`."""
  m, s = stats
  m_new = jnp.maximum(m, jnp.max(logits, axis=axis))
  # A row with no candidate yet keeps m = -inf: shift by 0 there to avoid inf - inf.
  shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
  expanded = jnp.expand_dims(shift, axis)
  return m_new, s * jnp.exp(m - shift) + jnp.sum(jnp.exp(logits - expanded), axis=axis)


def _shifted(logits, bias, axis: int):
  """`logits` plus the candidates' bias: per column (`axis=0`, the row statistics) or per row
  (`axis=1`, the column statistics); unchanged for no bias."""
  if bias is None:
    return logits
  return logits + (bias[None, :] if axis == 0 else bias[:, None])


def _scaled(weights, bias, axis: int):
  """`weights * exp(bias)` along the candidates' axis, as `_shifted` in the exp domain."""
  if bias is None:
    return weights
  factor = jnp.exp(bias)
  return weights * (factor[None, :] if axis == 0 else factor[:, None])


class TileReduction(abc.ABC):
  """What a loss family folds a tile into: per-row (and per-column) statistics, forward and
  backward. The engine (`_tiled.tile_reduce`) schedules the tiles and owns the custom VJP; a
  reduction says what one tile contributes. Instances are stateless and compare equal by type,
  so a reduction is a static argument of `jax.jit` and `jax.custom_vjp`.
  """

  @abc.abstractmethod
  def fast_form(self, mapping, dtype) -> Any:
    """The closed form this reduction uses when `mapping` declares it (e.g. `exp_form`), or
    None: the tile then calls the mapping's `fn` and differentiates it with `jax.vjp`."""

  @abc.abstractmethod
  def init(self, num: int, dtype, tile_mapping: TileMapping) -> tuple[jax.Array, ...]:
    """The statistics of `num` rows before any tile: a tuple of `[num, ...]` arrays."""

  @abc.abstractmethod
  def finish(self, stats) -> jax.Array:
    """`[num]` (or `[num, F]`, F features per row): the per-row output from the statistics
    after the last tile."""

  @abc.abstractmethod
  def forward(self, tile_mapping: TileMapping, args: MappingArgs, a: Side, b: Side, row_stats,
              col_stats, use_cols) -> tuple[Any, Any]:
    """`(row_stats, col_stats)` with tile `a @ b.T` folded into the statistics of `a`'s rows
    and (where the traced bool `use_cols` holds; None: no column side) of `b`'s rows."""

  @abc.abstractmethod
  def backward(self, tile_mapping: TileMapping, args: MappingArgs, a: Side, b: Side, row_out,
               row_g, col_out, col_g) -> tuple[jax.Array, Any, tuple[jax.Array, ...]]:
    """`(dL/dcos [m, k], dparams, dconsts)` of the tile, given the finished outputs of both
    sides and their cotangents (`col_g` zero where the tile's columns were not used)."""

  def combine_across(self, partial: jax.Array, axis_name) -> jax.Array:
    """The finished column outputs of every device on `axis_name` combined into one (each
    device's rows gave every column a share; `_devices`' all-gather two-tower path)."""
    raise NotImplementedError(f"{type(self).__name__} has no column side across devices.")


def _times_exp(g: jax.Array, x: jax.Array) -> jax.Array:
  """`g exp(x)`, and 0 wherever `g` is 0 whatever `x`: a side that takes no gradient (the columns
  of a one-directional loss, an unused column block) has no logsumexp to subtract, and its
  `exp(x)` overflows to `inf` once a logit passes ~88 (float32), where `0 * inf` is NaN."""
  used = g != 0
  return jnp.where(used, g * jnp.exp(jnp.where(used, x, 0.0)), 0.0)


@dataclasses.dataclass(frozen=True)
class LogSumExp(TileReduction):
  """InfoNCE's reduction: `lse_i = log sum_{j negative of i} exp(f(c_ij) + b_j)` per row
  (Eq. 1, 11; `b_j` the candidate's `bias`, 0 without one).

  Statistics are `(m, s)` per row, `lse = m + log s`. With a mapping's `exp_form`, `m` stays
  at its constant `shift` and the tile sums `w(c) = exp(f(c) - shift)` directly; otherwise
  `m` is the running maximum (FlashAttention's online softmax).
  """

  def fast_form(self, mapping, dtype) -> ExpForm | None:
    return mapping.exp_form(dtype)

  def init(self, num: int, dtype, tile_mapping: TileMapping):
    if tile_mapping.fast is not None:
      return jnp.full((num,), tile_mapping.fast.shift, dtype), jnp.zeros((num,), dtype)
    return jnp.full((num,), -jnp.inf, dtype), jnp.zeros((num,), dtype)

  def finish(self, stats) -> jax.Array:
    m, s = stats
    # `s != 0`, not `s > 0`: a NaN candidate (NaN in, NaN out) must not read as no negatives.
    nonempty = s != 0
    return jnp.where(nonempty, jnp.log(jnp.where(nonempty, s, 1.0)) + m, -jnp.inf)

  def forward(self, tile_mapping: TileMapping, args: MappingArgs, a: Side, b: Side, row_stats,
              col_stats, use_cols):
    """Folds tile `a @ b.T` into the row stats of `a` and (where `use_cols`) the column
    stats of `b`. `use_cols` is a traced bool or None (no column side)."""
    cos = cosines(a, b)
    keep = mask(a, b)
    if _check_fast(tile_mapping, a, b):
      w = jnp.where(keep, tile_mapping.fast.weight(cos), 0.0)
      row_stats = row_stats[0], row_stats[1] + jnp.sum(_scaled(w, b.bias, 0), axis=1)
      if use_cols is not None:
        col_sum = jnp.sum(_scaled(w, a.bias, 1), axis=0)
        col_stats = col_stats[0], col_stats[1] + jnp.where(use_cols, col_sum, 0.0)
      return row_stats, col_stats
    row_logits, col_logits = _pair_logits(tile_mapping, args.step, a, b)(cos, args.params,
                                                                        *args.consts)
    row_stats = _fold(row_stats, _shifted(jnp.where(keep, row_logits, -jnp.inf), b.bias, 0),
                      axis=1)
    if use_cols is not None:
      folded = _fold(col_stats, _shifted(jnp.where(keep, col_logits, -jnp.inf), a.bias, 1),
                     axis=0)
      col_stats = jax.tree.map(lambda new, old: jnp.where(use_cols, new, old), folded, col_stats)
    return row_stats, col_stats

  def backward(self, tile_mapping: TileMapping, args: MappingArgs, a: Side, b: Side, row_lse,
               row_g, col_lse, col_g):
    """`(dL/dcos [m, k], dparams, dconsts)` of the tile, given the finished lse and their
    cotangents on both sides (`col_g` zero where the tile's columns were not used)."""
    keep = mask(a, b)
    cos = cosines(a, b)
    row_ok, col_ok = jnp.isfinite(row_lse), jnp.isfinite(col_lse)
    row_lse, col_lse = jnp.where(row_ok, row_lse, 0.0), jnp.where(col_ok, col_lse, 0.0)
    row_g, col_g = jnp.where(row_ok, row_g, 0.0), jnp.where(col_ok, col_g, 0.0)
    if _check_fast(tile_mapping, a, b):
      # dlse_i/dc_ij = exp(f_ij + b_j - lse_i) f'_ij = exp(shift - lse_i) e^{b_j} w'(c_ij).
      shift = tile_mapping.fast.shift
      row_scale = _scaled(_times_exp(row_g, shift - row_lse)[:, None], b.bias, 0)
      col_scale = _scaled(_times_exp(col_g, shift - col_lse)[None, :], a.bias, 1)
      dcos = jnp.where(keep, (row_scale + col_scale) * tile_mapping.fast.weight_grad(cos), 0.0)
      return dcos, jax.tree.map(jnp.zeros_like, args.params), tuple(
          jnp.zeros_like(k) for k in args.consts)
    (row_logits, col_logits), vjp = jax.vjp(_pair_logits(tile_mapping, args.step, a, b), cos,
                                            args.params, *args.consts)
    row_logits = jnp.where(keep, row_logits, -jnp.inf)
    col_logits = jnp.where(keep, col_logits, -jnp.inf)
    d_rows = _times_exp(row_g[:, None], _shifted(row_logits, b.bias, 0) - row_lse[:, None])
    d_cols = _times_exp(col_g[None, :], _shifted(col_logits, a.bias, 1) - col_lse[None, :])
    dcos, dparams, *dconsts = vjp((d_rows.astype(cos.dtype), d_cols.astype(cos.dtype)))
    return dcos, dparams, tuple(dconsts)

  def combine_across(self, partial, axis_name):
    """`log sum_devices exp(partial)`, elementwise; `-inf` with zero gradient where all are."""
    top = jax.lax.pmax(jax.lax.stop_gradient(partial), axis_name)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    total = jax.lax.psum(jnp.exp(partial - top), axis_name)
    nonempty = total != 0  # NaN stays NaN (`finish`)
    return jnp.where(nonempty, jnp.log(jnp.where(nonempty, total, 1.0)) + top, -jnp.inf)
