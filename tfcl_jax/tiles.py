r"""Tile kernels of blockwise InfoNCE: online logsumexp over column blocks and its backward.

Shared by `blockwise` (one device) and `distributed` (ring of devices); a tile is
`[block_rows, block_cols]` logits, never more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from tfcl_jax import mappings as mappings_lib

# A mapping made pure: `fn(cos, params, step, *consts) -> logits`; `consts` are the
# differentiable values it closed over (e.g. a traced tau), hoisted by closure conversion.
MapFn = Callable[..., jax.Array]


class Candidates(NamedTuple):
  """The columns of the logits: `vectors: [K, D]`, `ids: [K] int32` (a row excludes the
  columns whose ids it lists, e.g. itself and its positive), `valid: [K] bool`."""

  vectors: jax.Array
  ids: jax.Array
  valid: jax.Array


class PureMapping(NamedTuple):
  """`fn(cos, params, step, *consts)` with its arguments, from `pure_mapping`."""

  fn: MapFn
  params: dict[str, Any]
  step: jax.Array
  consts: tuple[jax.Array, ...]

  def __call__(self, cos: jax.Array) -> jax.Array:
    return self.fn(cos, self.params, self.step, *self.consts)


@dataclasses.dataclass(frozen=True)
class FreeLogOdds:
  """Eq. 11 as `mappings.temperature_free()` computes it, marked for the kernels' fast path.

  `exp(2 artanh c) = (1 + c) / (1 - c)`: the tiles sum that ratio (at most ~4e6 in float32
  after the clamp, so no running max is needed) and use `dL/dc = 2 g / (S (1 - c)^2)`: one
  division per logit instead of two `log1p` and an `exp`, forward and backward.
  """

  margin: float

  def clamp(self, cos):
    return jnp.clip(cos, -1.0 + self.margin, 1.0 - self.margin)

  def __call__(self, cos, params, step):
    cos = self.clamp(cos)
    return jnp.log1p(cos) - jnp.log1p(-cos)

  def slope(self, cos):
    """`d clamp / d cos` as `jnp.clip` differentiates it (1 inside, 1/2 on the bounds)."""
    low, high = -1.0 + self.margin, 1.0 - self.margin
    inside = (cos > low) & (cos < high)
    return jnp.where(inside, 1.0, jnp.where((cos == low) | (cos == high), 0.5, 0.0))


def pure_mapping(mapping, *, tile_shape: tuple[int, int], like: jax.Array) -> PureMapping:
  """Makes a `Mapping` (or a plain `cos -> logits` callable) a pure function of explicit inputs.

  `mapping.params` (e.g. learnable `t`) and any traced value the map closes over (e.g.
  `temperature(tau)` with a traced `tau`) become arguments, so that a `custom_vjp` can
  return their gradients. The function is specialised to `[tile_shape]` cosines of the
  dtype of `like`, varying over the `shard_map` axes `like` varies over.
  """
  if isinstance(mapping, mappings_lib.Mapping) and mapping.spec == "free":
    margin = mappings_lib._free_margin(like.dtype)
    return PureMapping(FreeLogOdds(margin), {}, jnp.zeros((), jnp.int32), ())
  if isinstance(mapping, mappings_lib.Mapping):
    fn, params = mapping.fn, {name: jnp.asarray(v) for name, v in mapping.params.items()}
  else:
    fn, params = (lambda cos, params, step: mapping(cos)), {}
  step = mapping.bound_step() if isinstance(mapping, mappings_lib.Mapping) else jnp.zeros(
      (), jnp.int32)
  example_cos, params = match_varying((jnp.zeros(tile_shape, like.dtype), params), like)
  converted, consts = jax.closure_convert(fn, example_cos, params, step)
  return PureMapping(converted, params, step, tuple(match_varying(tuple(consts), like)))


def _varying_axes(x) -> frozenset:
  aval = jax.typeof(x)
  if hasattr(aval, "vma"):  # jax < 0.10
    return frozenset(aval.vma)
  return frozenset(aval.manual_axis_type.varying)


def match_varying(tree, like: jax.Array):
  """Casts the leaves of `tree` to vary over the `shard_map` axes `like` varies over.

  Inside `shard_map`, a replicated mapping parameter used with per-device data must enter
  a `custom_vjp` as per-device too: its cotangent is per-device, and the cast's transpose
  sums it over the devices.
  """
  axes = tuple(_varying_axes(like))

  def cast(x):
    missing = tuple(axis for axis in axes if axis not in _varying_axes(x))
    return jax.lax.pcast(x, missing, to="varying") if missing else x

  return jax.tree.map(cast, tree) if axes else tree


def candidate_mask(excluded_ids: jax.Array, columns: Candidates) -> jax.Array:
  """`[M, K]` bool: column j is a candidate of row i (valid, id not in `excluded_ids[i]`)."""
  excluded = jnp.any(excluded_ids[:, :, None] == columns.ids[None, None, :], axis=1)
  return columns.valid[None, :] & ~excluded


def _tile(anchors, excluded_ids, columns: Candidates):
  return anchors @ columns.vectors.T, candidate_mask(excluded_ids, columns)


def _slice_columns(columns: Candidates, index, block_cols: int) -> Candidates:
  return Candidates(*(
      jax.lax.dynamic_slice_in_dim(x, index * block_cols, block_cols) for x in columns))


def _row_blocks(block_rows: int, *arrays):
  return tuple(x.reshape(-1, block_rows, *x.shape[1:]) for x in arrays)


def accumulate_stats(pure, anchors, excluded_ids, columns, stats, *, block_rows, block_cols):
  """Online logsumexp: folds `columns` into per-row `(max, sum of exp(logit - max))`.

  `stats` is `(m, s)`, both `[M]`; start from `(-inf, 0)`. Shapes must be multiples of the
  blocks. Memory: one `[block_rows, block_cols]` tile at a time.
  """
  num_col_blocks = columns.vectors.shape[0] // block_cols

  def row_block(carry, xs):
    block, ids, m, s = xs

    def column_block(j, stats):
      m, s = stats
      cos, mask = _tile(block, ids, _slice_columns(columns, j, block_cols))
      if isinstance(pure.fn, FreeLogOdds):
        cos = pure.fn.clamp(cos)
        ratio = jnp.where(mask, (1.0 + cos) / (1.0 - cos), 0.0)
        return jnp.zeros_like(m), s + jnp.sum(ratio, axis=1)
      logits = jnp.where(mask, pure.fn(cos, pure.params, pure.step, *pure.consts), -jnp.inf)
      m_new = jnp.maximum(m, jnp.max(logits, axis=1))
      # Rows with no candidate yet keep m = -inf; shift by 0 there to avoid inf - inf.
      shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
      s = s * jnp.exp(m - shift) + jnp.sum(jnp.exp(logits - shift[:, None]), axis=1)
      return m_new, s

    return carry, jax.lax.fori_loop(0, num_col_blocks, column_block, (m, s))

  m, s = stats
  xs = _row_blocks(block_rows, anchors, excluded_ids, m, s)
  _, (m, s) = jax.lax.scan(row_block, None, xs)
  return m.reshape(-1), s.reshape(-1)


def finish_logsumexp(stats) -> jax.Array:
  """`log(s) + m`, and `-inf` for rows without a candidate (s = 0)."""
  m, s = stats
  nonempty = s > 0
  return jnp.where(nonempty, jnp.log(jnp.where(nonempty, s, 1.0)) + m, -jnp.inf)


def init_stats(anchors: jax.Array):
  """`(m, s) = (-inf, 0)` per row of `anchors`: the logsumexp of no candidate."""
  num_rows, dtype = anchors.shape[0], anchors.dtype
  stats = jnp.full((num_rows,), -jnp.inf, dtype), jnp.zeros((num_rows,), dtype)
  return match_varying(stats, anchors)


def accumulate_grads(pure, anchors, excluded_ids, lse, g, columns, grads, *, block_rows,
                     block_cols):
  """Backward of `lse_i = log sum_j exp(f(a_i . b_j))` for cotangent `g`, tile by tile.

  Per tile, `dL/dlogit_ij = g_i softmax_ij`; `jax.vjp` of the mapping turns it into
  `dL/dcos_ij` and `dL/dparams` (so Eq. 11's `2 / (1 - c^2)`, a stop-gradient in the map or
  a learnable `t` all come out of the map itself); then `da_i = sum_j dcos_ij b_j`,
  `db_j = sum_i dcos_ij a_i`.

  Args:
    grads: `(db [K, D], dparams, dconsts)` to add to.

  Returns:
    `(da [M, D], (db, dparams, dconsts))`.
  """
  num_col_blocks = columns.vectors.shape[0] // block_cols
  nonempty = jnp.isfinite(lse)
  lse = jnp.where(nonempty, lse, 0.0)
  g = jnp.where(nonempty, g, 0.0)

  def row_block(grads, xs):
    block, ids, lse, g = xs

    def column_block(j, carry):
      da, (db, dparams, dconsts) = carry
      tile_columns = _slice_columns(columns, j, block_cols)
      cos, mask = _tile(block, ids, tile_columns)
      if isinstance(pure.fn, FreeLogOdds):
        inverse = 1.0 / (1.0 - pure.fn.clamp(cos))
        row_scale = (2.0 * g * jnp.exp(-lse))[:, None]
        dcos = jnp.where(mask, row_scale * inverse * inverse * pure.fn.slope(cos), 0.0)
        dp, dk = dparams, [jnp.zeros_like(k) for k in dconsts]
      else:
        logits, vjp = jax.vjp(
            lambda c, p, *k: pure.fn(c, p, pure.step, *k), cos, pure.params, *pure.consts)
        dlogits = jnp.where(mask, jnp.exp(logits - lse[:, None]), 0.0) * g[:, None]
        dcos, dp, *dk = vjp(dlogits.astype(logits.dtype))
        dp = jax.tree.map(jnp.add, dparams, dp)
      da = da + dcos @ tile_columns.vectors
      start = j * block_cols
      db_tile = jax.lax.dynamic_slice_in_dim(db, start, block_cols) + dcos.T @ block
      db = jax.lax.dynamic_update_slice_in_dim(db, db_tile, start, axis=0)
      dparams = dp
      dconsts = tuple(a + b for a, b in zip(dconsts, dk, strict=True))
      return da, (db, dparams, dconsts)

    da = match_varying(jnp.zeros_like(block), block)
    da, grads = jax.lax.fori_loop(0, num_col_blocks, column_block, (da, grads))
    return grads, da

  xs = _row_blocks(block_rows, anchors, excluded_ids, lse, g)
  grads, da = jax.lax.scan(row_block, grads, xs)
  return da.reshape(anchors.shape), grads


def zero_grads(pure: PureMapping, anchors: jax.Array, columns: Candidates):
  """Zero `(dcolumns, dparams, dconsts)`, per-device inside `shard_map` like `anchors`."""
  zeros = (jnp.zeros_like(columns.vectors), jax.tree.map(jnp.zeros_like, pure.params),
           tuple(jnp.zeros_like(k) for k in pure.consts))
  return match_varying(zeros, anchors)
