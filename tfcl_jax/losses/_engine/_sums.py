"""The sum reductions of a tile: SigLIP's (`SigmoidSum`, each pair's log-sigmoid term) and
SupCon's numerator (`PositiveSum`, the positives' logits), with the masks of the pairs each
scores. InfoNCE's logsumexp and the contract they share are in `_tiles`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tfcl_jax.losses._engine._tiles import (
  MappingArgs,
  Side,
  TileMapping,
  TileReduction,
  _check_fast,
  _pair_logits,
  cosines,
)


def pair_mask(rows: Side, columns: Side) -> jax.Array:
  """`[m, k]` bool: the pair (i, j) is scored: both valid, and j is not i itself (unless j is
  i's positive, as in `cross`, where a row and its positive share an id)."""
  return (rows.valid[:, None] & columns.valid[None, :]
          & ((columns.ids[None, :] != rows.ids[:, None])
             | (columns.ids[None, :] == rows.positive_ids[:, None])))


class _Sum(TileReduction):
  """A reduction that sums per-pair terms: statistics `(sum,)` per row (and column)."""

  def init(self, num: int, dtype, tile_mapping: TileMapping):
    return (jnp.zeros((num,), dtype),)

  def finish(self, stats) -> jax.Array:
    return stats[0]

  def fold(self, row_terms, col_terms, row_stats, col_stats, use_cols):
    """Adds the tile's `row_terms [m, k]` to the row sums and (where `use_cols`) its
    `col_terms [m, k]` (the same terms as the columns' anchors score them) to the column sums."""
    row_stats = (row_stats[0] + jnp.sum(row_terms, axis=1),)
    if use_cols is not None:
      col_stats = (col_stats[0] + jnp.where(use_cols, jnp.sum(col_terms, axis=0), 0.0),)
    return row_stats, col_stats


@dataclasses.dataclass(frozen=True)
class SigmoidSum(_Sum):
  """SigLIP's reduction: `sum_j -log sigmoid(l_ij (f(c_ij) + b))` per row, `l_ij = +1` on the
  positive, `-1` elsewhere; the bias is folded into the mapping. Mappings with a closed form of the
  log-sigmoid (`log_sigmoid_form`; Eq. 11's `sigmoid(2 artanh c) = (1 + c)/2`) use it."""

  def fast_form(self, mapping, dtype):
    return mapping.log_sigmoid_form(dtype)

  def _signs(self, a: Side, b: Side):
    return jnp.where(b.ids[None, :] == a.positive_ids[:, None], 1.0, -1.0)

  def forward(self, tile_mapping: TileMapping, args: MappingArgs, a: Side, b: Side, row_stats,
              col_stats, use_cols):
    cos = cosines(a, b)
    sign = self._signs(a, b).astype(cos.dtype)
    keep = pair_mask(a, b)
    if _check_fast(tile_mapping, a, b):
      terms = jnp.where(keep, tile_mapping.fast.term(cos, sign), 0.0)
      return self.fold(terms, terms, row_stats, col_stats, use_cols)
    row_logits, col_logits = _pair_logits(tile_mapping, args.step, a, b, about_zero=True)(
        cos, args.params, *args.consts)
    row_terms = jnp.where(keep, jax.nn.softplus(-sign * row_logits), 0.0)
    col_terms = row_terms if col_logits is row_logits else jnp.where(
        keep, jax.nn.softplus(-sign * col_logits), 0.0)
    return self.fold(row_terms, col_terms, row_stats, col_stats, use_cols)

  def backward(self, tile_mapping: TileMapping, args: MappingArgs, a: Side, b: Side, row_out,
               row_g, col_out, col_g):
    cos = cosines(a, b)
    sign = self._signs(a, b).astype(cos.dtype)
    keep = pair_mask(a, b)
    if _check_fast(tile_mapping, a, b):
      scale = row_g[:, None] + col_g[None, :]
      dcos = jnp.where(keep, scale * tile_mapping.fast.term_grad(cos, sign), 0.0)
      return dcos, jax.tree.map(jnp.zeros_like, args.params), tuple(
          jnp.zeros_like(k) for k in args.consts)
    (row_logits, col_logits), vjp = jax.vjp(
        _pair_logits(tile_mapping, args.step, a, b, about_zero=True), cos, args.params,
        *args.consts)
    # d softplus(-s x)/dx = -s sigmoid(-s x)
    d_rows = jnp.where(keep, row_g[:, None] * -sign * jax.nn.sigmoid(-sign * row_logits), 0.0)
    d_cols = jnp.where(keep, col_g[None, :] * -sign * jax.nn.sigmoid(-sign * col_logits), 0.0)
    dcos, dparams, *dconsts = vjp((d_rows.astype(cos.dtype), d_cols.astype(cos.dtype)))
    return dcos, dparams, tuple(dconsts)


def label_mask(rows: Side, columns: Side) -> jax.Array:
  """`[m, k]` bool: (i, j) is a positive pair of the supervised loss: both valid, not the
  same row (`ids`), and the same class (`positive_ids` holds the label)."""
  return (rows.valid[:, None] & columns.valid[None, :]
          & (columns.ids[None, :] != rows.ids[:, None])
          & (columns.positive_ids[None, :] == rows.positive_ids[:, None]))


@dataclasses.dataclass(frozen=True)
class PositiveSum(_Sum):
  """SupCon's numerator: `sum_{p in P(i)} f(c_ip)` per row, `P(i)` the other rows of `i`'s
  class (`label_mask`). Linear in the logits, so it needs no closed form."""

  def fast_form(self, mapping, dtype):
    return None

  def forward(self, tile_mapping: TileMapping, args: MappingArgs, a: Side, b: Side, row_stats,
              col_stats, use_cols):
    cos = cosines(a, b)
    keep = label_mask(a, b)
    row_logits, col_logits = _pair_logits(tile_mapping, args.step, a, b)(cos, args.params,
                                                                        *args.consts)
    row_terms = jnp.where(keep, row_logits, 0.0)
    col_terms = row_terms if col_logits is row_logits else jnp.where(keep, col_logits, 0.0)
    return self.fold(row_terms, col_terms, row_stats, col_stats, use_cols)

  def backward(self, tile_mapping: TileMapping, args: MappingArgs, a: Side, b: Side, row_out,
               row_g, col_out, col_g):
    cos = cosines(a, b)
    keep = label_mask(a, b)
    _, vjp = jax.vjp(_pair_logits(tile_mapping, args.step, a, b), cos, args.params,
                     *args.consts)
    d_rows = jnp.where(keep, jnp.broadcast_to(row_g[:, None], cos.shape), 0.0)
    d_cols = jnp.where(keep, jnp.broadcast_to(col_g[None, :], cos.shape), 0.0)
    dcos, dparams, *dconsts = vjp((d_rows.astype(cos.dtype), d_cols.astype(cos.dtype)))
    return dcos, dparams, tuple(dconsts)
