r"""The moments of every anchor's softmax on a grid of scales, in one forward pass over the tiles:
what the batch-scaled mappings' scales are solved from (`_calibration`).

For row `i` and its candidates `j` (the engine's mask: its negatives), with `m_i = max_j l_ij`,
`d_ij = l_ij - m_i <= 0` and, at each grid scale `s_k = 2^k` (`GRID_EXPONENTS`),
`w_ijk = exp(s_k d_ij + b_j)` (`b_j` the candidate's bias where the side has one, shifted to
`<= 0` by the caller), the statistics are `m_i`, the count, the weight of the candidates at the
top, `T_i = sum_{j: l_ij = m_i} e^{b_j}` (their number without a bias), and
`S_ikp = sum_j w_ijk d_ij^p` for `p = 1..4` with, in place of `p = 0`, the weight of the others,
`R_ik = sum_{j: l_ij < m_i} w_ijk`: the softmax's mass is `T_i + R_ik`, and `R` kept apart keeps
`log(T + R)` and the entropy accurate where `R` is far below `T` (a sharp softmax: `1 + R` would
round `R` away in float32). Every weight is at most 1, so no scale overflows. Statistics centred on
different maxima (tiles, devices, the bank, the positive) merge exactly: `recentre`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from tfcl_jax.losses._engine._tiles import (
  MappingArgs,
  Side,
  TileMapping,
  TileReduction,
  cosines,
  mask,
)

#: The exponents `k` of the grid of scales `s_k = 2^k` the pass takes the moments at: 15 points
#: covering the bounds of a solved scale, `[mappings.S_MIN, mappings.S_MAX] = [1/100, 100]`.
GRID_EXPONENTS = tuple(range(-7, 8))
_SCALES = tuple(2.0 ** k for k in GRID_EXPONENTS)
#: Each chain is one `exp` at its first scale, then squarings (`exp(2x) = exp(x)^2`); three at
#: most, so that a weight's relative error stays within 8 of the `exp`'s.
_CHAINS = ((-7, 4), (-3, 4), (1, 4), (5, 3))
_POWERS = 5  # R (the weight below the top), then d, d^2, d^3, d^4 weighted
_ROWS = 32  # rows of a tile summed at a time


class GridMoments(NamedTuple):
  r"""Per anchor, its softmax over its candidates at every grid scale `s_k = 2^k`.

  With `M_i = max_{j in K_i} l_ij` and weights `w_ij(s) = exp(s (l_ij - M_i) [+ b_j - beta])`,
  `psi_i(u) = log sum_j w_ij(e^u)` (`log Z_i(s) - s M_i` up to the bias shift), a function of
  `u = log s` whose derivatives are the softmax's cumulants `k_1 .. k_4` of `l - M_i`:
  `psi' = s k_1`, `psi'' = s k_1 + s^2 k_2`, `psi''' = s k_1 + 3 s^2 k_2 + s^3 k_3`,
  `psi'''' = s k_1 + 7 s^2 k_2 + 6 s^3 k_3 + s^4 k_4`. So `E_p[l] = M_i + psi' / s`,
  `Var_p[l] = (psi'' - psi') / s^2`, and the entropy (without a bias)
  `H_i = log Z_i - s E_p[l] = psi - psi'`, whose `n`-th derivative is `psi^(n) - psi^(n+1)`.

  Attributes:
    psi: `[M, K, 5]`, `psi_i` and its first four `u`-derivatives at the `K` grid points.
    top: `[M]`, `M_i`.
    count: `[M]`, `N_i` (float).
  """

  psi: jax.Array
  top: jax.Array
  count: jax.Array




class Moments(NamedTuple):
  """`top: [M]` the rows' largest logit (`-inf` for none), `count: [M]` their candidates,
  `top_weight: [M]` the weight at the top (`T`), `sums: [M, K, 5]` `R, S_1 .. S_4` centred on
  `top`."""

  top: jax.Array
  count: jax.Array
  top_weight: jax.Array
  sums: jax.Array


def pack(moments: Moments) -> jax.Array:
  """`[M, 3 + 5 K]`: one row of features per row, as the engine slices its outputs."""
  top, count, top_weight, sums = moments
  return jnp.concatenate([top[:, None], count[:, None], top_weight[:, None],
                          sums.reshape(sums.shape[0], -1)], 1)


def unpack(features: jax.Array) -> Moments:
  """The inverse of `pack`."""
  sums = features[:, 3:].reshape(features.shape[0], len(_SCALES), _POWERS)
  return Moments(features[:, 0], features[:, 1], features[:, 2], sums)


def recentre(moments: Moments, new_top: jax.Array) -> Moments:
  """`moments` centred on `new_top >= moments.top` (`-inf` top: no candidate yet, all zero).

  Where the top rises by `-delta > 0`, every weight is `exp(s_k delta)` times its old value, the
  old top's among them (it drops below the new top), and each `d` becomes `d + delta`:
  `S'_p = exp(s_k delta) sum_q binom(p, q) delta^(p - q) S_q` with `S_0 = T + R`. All the terms
  share a sign (`d, delta <= 0`), so the expansion loses no accuracy. Unchanged where the top is.
  """
  top, count, top_weight, sums = moments
  rises = jnp.isfinite(top) & (new_top > top)
  delta = jnp.where(rises, top - new_top, 0.0)[:, None]
  factor = jnp.exp(jnp.asarray(_SCALES, sums.dtype) * delta)
  s0 = sums[..., 0] + top_weight[:, None]
  s1, s2, s3, s4 = (sums[..., p] for p in range(1, _POWERS))
  moved = factor[..., None] * jnp.stack(
      [s0, s1 + delta * s0, s2 + 2 * delta * s1 + delta**2 * s0,
       s3 + 3 * delta * s2 + 3 * delta**2 * s1 + delta**3 * s0,
       s4 + 4 * delta * s3 + 6 * delta**2 * s2 + 4 * delta**3 * s1 + delta**4 * s0], -1)
  return Moments(new_top, count, jnp.where(rises, 0.0, top_weight),
                 jnp.where(rises[:, None, None], moved, sums))


def merge(first: Moments, second: Moments) -> Moments:
  """The statistics of the union of two candidate sets of the same rows."""
  top = jnp.maximum(first.top, second.top)
  first, second = recentre(first, top), recentre(second, top)
  return Moments(top, first.count + second.count, first.top_weight + second.top_weight,
                 first.sums + second.sums)


def single(logit: jax.Array, bias: jax.Array | None = None) -> Moments:
  """The statistics of one candidate per row (the anchor's positive), of weight `exp(bias)`."""
  weight = jnp.ones_like(logit) if bias is None else jnp.exp(bias)
  sums = jnp.zeros((logit.shape[0], len(_SCALES), _POWERS), logit.dtype)
  return Moments(logit, jnp.ones_like(logit), weight, sums)


def _chunk_sums(d: jax.Array, below: jax.Array, bias: jax.Array | None) -> jax.Array:
  """`[c, K, 5]`: for `c` rows, `sum_j w_jk d_j^p` over the candidates `below` the top, with
  `w_k = exp(s_k d + b)`: four `exp`s, the other eleven scales by squaring.

  The four `exp`s are held behind an optimisation barrier: without it XLA fuses each chain's
  `exp` into every one of its scales' reductions and takes fifteen (1.4 times the time of the
  chunk, measured on the 2-core CPU).
  """
  factor = jnp.where(below, 1.0 if bias is None else jnp.exp(bias)[None, :], 0.0)
  square = d * d
  powers = (d, square, square * d, square * square)
  bases = jax.lax.optimization_barrier([jnp.exp(2.0 ** start * d) for start, _ in _CHAINS])
  sums = []
  for (_, length), w in zip(_CHAINS, bases, strict=True):
    for step in range(length):
      w = w if step == 0 else w * w
      weighted = w * factor
      sums.append(jnp.stack([jnp.sum(weighted, axis=1)]
                            + [jnp.sum(weighted * p, axis=1) for p in powers], -1))
  return jnp.stack(sums, 1)


def _row_sums(d: jax.Array, below: jax.Array, bias: jax.Array | None) -> jax.Array:
  """`_chunk_sums` of all `m` rows: on a CPU `_ROWS` rows at a time, on an accelerator the whole
  tile at once (`jax.lax.platform_dependent`: decided by the platform lowered for).

  On a CPU 75 sums per row, each a pass over its rows, cost least where a chunk's arrays stay in
  cache (4.3 against 12 times a matrix product of the tile's size at D = 128, measured on the
  2-core CPU). On a GPU each chunk is a few small kernel launches in sequence: GRACE's pass over
  3,327 nodes (`all`, block 1024) is 28 tiles of 64 chunks a step.
  """
  def chunked(d, below):
    m = d.shape[0]
    extra = -m % _ROWS
    d = jnp.pad(d, ((0, extra), (0, 0)))
    below = jnp.pad(below, ((0, extra), (0, 0)))
    chunks = (d.reshape(-1, _ROWS, d.shape[1]), below.reshape(-1, _ROWS, d.shape[1]))
    sums = jax.lax.map(lambda chunk: _chunk_sums(chunk[0], chunk[1], bias), chunks)
    return sums.reshape(-1, *sums.shape[2:])[:m]

  return jax.lax.platform_dependent(d, below, cpu=chunked,
                                    default=lambda d, below: _chunk_sums(d, below, bias))


def _fold(stats, logits: jax.Array, keep: jax.Array, bias: jax.Array | None):
  """Folds a tile's `[m, n]` logits of `m` rows (their candidates `keep`) into their stats."""
  moments = Moments(*stats)
  new_top = jnp.maximum(moments.top, jnp.max(jnp.where(keep, logits, -jnp.inf), axis=1))
  top, count, top_weight, sums = recentre(moments, new_top)
  d = jnp.where(keep, logits - jnp.where(jnp.isfinite(new_top), new_top, 0.0)[:, None], 0.0)
  at_top = keep & (d == 0)
  top_weights = jnp.ones_like(d) if bias is None else jnp.exp(bias)[None, :]
  sums = sums + _row_sums(d, keep & ~at_top, bias)
  return (top, count + jnp.sum(keep, axis=1, dtype=count.dtype),
          top_weight + jnp.sum(jnp.where(at_top, top_weights, 0.0), axis=1), sums)


@dataclasses.dataclass(frozen=True)
class ScaleMoments(TileReduction):
  """The grid moments of each row's (and column's) candidates' logits (the module's statistics).

  Forward only: the scales solved from it take no gradient, so it runs on inputs under
  `stop_gradient`, and `jax.custom_vjp` then never calls `backward` (which raises). Its output
  is `[num, 3 + 5 K]` per row (`pack`).
  """

  def fast_form(self, mapping, dtype):
    return None

  def init(self, num: int, dtype, tile_mapping: TileMapping):
    return (jnp.full((num,), -jnp.inf, dtype), jnp.zeros((num,), dtype), jnp.zeros((num,), dtype),
            jnp.zeros((num, len(_SCALES), _POWERS), dtype))

  def finish(self, stats) -> jax.Array:
    return pack(Moments(*stats))

  def forward(self, tile_mapping: TileMapping, args: MappingArgs, a: Side, b: Side, row_stats,
              col_stats, use_cols):
    cos = cosines(a, b)
    keep = mask(a, b)
    logits = tile_mapping.fn(cos, args.params, args.step, *args.consts)
    row_stats = _fold(row_stats, logits, keep, b.bias)
    if use_cols is not None:
      folded = _fold(col_stats, logits.T, keep.T, a.bias)
      col_stats = jax.tree.map(lambda new, old: jnp.where(use_cols, new, old), folded, col_stats)
    return row_stats, col_stats

  def backward(self, tile_mapping, args, a, b, row_out, row_g, col_out, col_g):
    raise NotImplementedError("ScaleMoments is forward-only: the scales solved from it take no "
                              "gradient; call it on inputs under jax.lax.stop_gradient.")

  def combine_across(self, partial: jax.Array, axis_name) -> jax.Array:
    """Every device's statistics of the same columns, merged: re-centred on the global top."""
    moments = unpack(partial)
    moments = recentre(moments, jax.lax.pmax(moments.top, axis_name))
    return pack(moments._replace(**{name: jax.lax.psum(getattr(moments, name), axis_name)
                                    for name in ("count", "top_weight", "sums")}))


def grid_moments(moments: Moments) -> GridMoments:
  r"""`GridMoments` from the statistics: `psi = log(T + R)` and its
  `u`-derivatives from the cumulants of `d` (`S_0 = T + R`, `m_p = S_p / S_0`):
  `k_1 = m_1`, `k_2 = m_2 - m_1^2`, `k_3 = m_3 - 3 m_1 m_2 + 2 m_1^3`,
  `k_4 = m_4 - 4 m_1 m_3 - 3 m_2^2 + 12 m_1^2 m_2 - 6 m_1^4`. Rows without a candidate get
  zeros."""
  sums = moments.sums
  top_weight = moments.top_weight[:, None]
  nonempty = top_weight > 0
  safe = jnp.where(nonempty, top_weight, 1.0)
  mass = safe + sums[..., 0]
  m1, m2, m3, m4 = (sums[..., p] / mass for p in (1, 2, 3, 4))
  k2 = m2 - m1 * m1
  k3 = m3 - 3.0 * m1 * m2 + 2.0 * m1**3
  k4 = m4 - 4.0 * m1 * m3 - 3.0 * m2 * m2 + 12.0 * m1 * m1 * m2 - 6.0 * m1**4
  s = jnp.asarray(_SCALES, sums.dtype)
  log_mass = jnp.log(safe) + jnp.log1p(sums[..., 0] / safe)  # accurate for R << T
  # d^n/du^n F(e^u) = sum_k S(n, k) s^k F^(k)(s), S the Stirling numbers of the second kind.
  psi = jnp.stack([log_mass, s * m1, s * m1 + s**2 * k2, s * m1 + 3.0 * s**2 * k2 + s**3 * k3,
                   s * m1 + 7.0 * s**2 * k2 + 6.0 * s**3 * k3 + s**4 * k4], -1)
  psi = jnp.where(nonempty[..., None], psi, 0.0)
  return GridMoments(psi, moments.top, moments.count)
