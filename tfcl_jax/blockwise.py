r"""Blockwise InfoNCE: the loss and its gradient tile by tile in O(N * block) memory, any mapping.

The `[N, N]` logits are never held: an online logsumexp over column blocks (FlashAttention,
Inf-CL) and a custom VJP that recomputes each tile and differentiates the mapping per tile.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import mappings as mappings_lib

# A mapping made pure: `fn(cos, params, step, *consts) -> logits`; `consts` are the
# differentiable values it closed over (e.g. a traced tau), hoisted by closure conversion.
MapFn = Callable[..., jax.Array]


def check_block_size(block_size) -> int | None:
  """Checks `block_size`: None (dense) or an int > 0.

  Examples:
    >>> from tfcl_jax import blockwise
    >>> blockwise.check_block_size(512)
    512
  """
  if block_size is None:
    return None
  if isinstance(block_size, (bool, np.bool_)) or not isinstance(block_size, numbers.Integral):
    raise TypeError(f"block_size must be an int > 0 or None, got {block_size!r}.")
  if block_size <= 0:
    raise ValueError(f"block_size must be an int > 0 or None, got {block_size!r}.")
  return int(block_size)


class Candidates(NamedTuple):
  """The columns of the logits: `vectors: [K, D]`, `ids: [K] int32` (a column whose id equals
  the anchor's id is excluded, e.g. the anchor itself), `valid: [K] bool`."""

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


def pure_mapping(mapping, *, tile_shape: tuple[int, int], like: jax.Array) -> PureMapping:
  """Makes a `Mapping` (or a plain `cos -> logits` callable) a pure function of explicit inputs.

  `mapping.params` (e.g. learnable `t`) and any traced value the map closes over (e.g.
  `temperature(tau)` with a traced `tau`) become arguments, so that a `custom_vjp` can
  return their gradients. The function is specialised to `[tile_shape]` cosines of the
  dtype of `like`, varying over the `shard_map` axes `like` varies over.
  """
  if isinstance(mapping, mappings_lib.Mapping):
    fn, params = mapping.fn, {name: jnp.asarray(v) for name, v in mapping.params.items()}
  else:
    fn, params = (lambda cos, params, step: mapping(cos)), {}
  step = jnp.zeros((), jnp.int32)
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


def _tile(anchors, anchor_ids, columns: Candidates):
  cos = anchors @ columns.vectors.T
  mask = columns.valid[None, :] & (anchor_ids[:, None] != columns.ids[None, :])
  return cos, mask


def _slice_columns(columns: Candidates, index, block_cols: int) -> Candidates:
  return Candidates(*(
      jax.lax.dynamic_slice_in_dim(x, index * block_cols, block_cols) for x in columns))


def _row_blocks(block_rows: int, *arrays):
  return tuple(x.reshape(-1, block_rows, *x.shape[1:]) for x in arrays)


def accumulate_stats(pure, anchors, anchor_ids, columns, stats, *, block_rows, block_cols):
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
      logits = jnp.where(mask, pure.fn(cos, pure.params, pure.step, *pure.consts), -jnp.inf)
      m_new = jnp.maximum(m, jnp.max(logits, axis=1))
      # Rows with no candidate yet keep m = -inf; shift by 0 there to avoid inf - inf.
      shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
      s = s * jnp.exp(m - shift) + jnp.sum(jnp.exp(logits - shift[:, None]), axis=1)
      return m_new, s

    return carry, jax.lax.fori_loop(0, num_col_blocks, column_block, (m, s))

  m, s = stats
  xs = _row_blocks(block_rows, anchors, anchor_ids, m, s)
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


def accumulate_grads(pure, anchors, anchor_ids, lse, g, columns, grads, *, block_rows,
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
      logits, vjp = jax.vjp(
          lambda c, p, *k: pure.fn(c, p, pure.step, *k), cos, pure.params, *pure.consts)
      dlogits = jnp.where(mask, jnp.exp(logits - lse[:, None]), 0.0) * g[:, None]
      dcos, dp, *dk = vjp(dlogits.astype(logits.dtype))
      da = da + dcos @ tile_columns.vectors
      start = j * block_cols
      db_tile = jax.lax.dynamic_slice_in_dim(db, start, block_cols) + dcos.T @ block
      db = jax.lax.dynamic_update_slice_in_dim(db, db_tile, start, axis=0)
      dparams = jax.tree.map(jnp.add, dparams, dp)
      dconsts = tuple(a + b for a, b in zip(dconsts, dk, strict=True))
      return da, (db, dparams, dconsts)

    da = match_varying(jnp.zeros_like(block), block)
    da, grads = jax.lax.fori_loop(0, num_col_blocks, column_block, (da, grads))
    return grads, da

  xs = _row_blocks(block_rows, anchors, anchor_ids, lse, g)
  grads, da = jax.lax.scan(row_block, grads, xs)
  return da.reshape(anchors.shape), grads


def zero_grads(pure: PureMapping, anchors: jax.Array, columns: Candidates):
  """Zero `(dcolumns, dparams, dconsts)`, per-device inside `shard_map` like `anchors`."""
  zeros = (jnp.zeros_like(columns.vectors), jax.tree.map(jnp.zeros_like, pure.params),
           tuple(jnp.zeros_like(k) for k in pure.consts))
  return match_varying(zeros, anchors)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _blockwise_lse(fn, block_rows, block_cols, anchors, anchor_ids, columns, params, step, consts):
  pure = PureMapping(fn, params, step, consts)
  stats = init_stats(anchors)
  stats = accumulate_stats(
      pure, anchors, anchor_ids, columns, stats, block_rows=block_rows, block_cols=block_cols)
  return finish_logsumexp(stats)


def _blockwise_lse_fwd(fn, block_rows, block_cols, anchors, anchor_ids, columns, params, step,
                       consts):
  lse = _blockwise_lse(fn, block_rows, block_cols, anchors, anchor_ids, columns, params, step,
                       consts)
  return lse, (anchors, anchor_ids, columns, params, step, consts, lse)


def _blockwise_lse_bwd(fn, block_rows, block_cols, residuals, g):
  anchors, anchor_ids, columns, params, step, consts, lse = residuals
  pure = PureMapping(fn, params, step, consts)
  da, (db, dparams, dconsts) = accumulate_grads(
      pure, anchors, anchor_ids, lse, g, columns, zero_grads(pure, anchors, columns),
      block_rows=block_rows, block_cols=block_cols)
  return da, None, Candidates(db, None, None), dparams, None, dconsts


_blockwise_lse.defvjp(_blockwise_lse_fwd, _blockwise_lse_bwd)


def _pad_rows(x: jax.Array, multiple: int, value) -> jax.Array:
  extra = -x.shape[0] % multiple
  if extra == 0:
    return x
  padding = [(0, extra)] + [(0, 0)] * (x.ndim - 1)
  return jnp.pad(x, padding, constant_values=value)


def padded_blocks(anchors, anchor_ids, columns: Candidates, block_size: int | None):
  """Tile shape for `block_size` (None: one tile), and the inputs padded to whole tiles.

  Padded anchors are zero rows (their losses are sliced off); padded columns are invalid.

  Returns:
    `((block_rows, block_cols), anchors, anchor_ids, columns)`.
  """
  num_rows, num_cols = anchors.shape[0], columns.vectors.shape[0]
  if block_size is None:
    block_rows, block_cols = num_rows, num_cols
  else:
    block_rows, block_cols = min(block_size, num_rows), min(block_size, num_cols)
  columns = Candidates(
      _pad_rows(columns.vectors, block_cols, 0.0),
      _pad_rows(jnp.asarray(columns.ids, jnp.int32), block_cols, -2),
      _pad_rows(jnp.asarray(columns.valid, bool), block_cols, False))
  anchor_ids = _pad_rows(jnp.asarray(anchor_ids, jnp.int32), block_rows, -3)
  return (block_rows, block_cols), _pad_rows(anchors, block_rows, 0.0), anchor_ids, columns


def logsumexp_of_mapped(
    anchors: jax.typing.ArrayLike,
    candidates: Candidates,
    *,
    anchor_ids: jax.typing.ArrayLike,
    mapping,
    block_size: int,
) -> jax.Array:
  r"""Row-wise `log sum_{j in K_i} exp(f(a_i . b_j))`, blockwise, differentiable (Eq. 1 / 11).

  `K_i` holds the valid candidates whose id differs from `anchor_ids[i]`. The `[M, K]`
  logits are computed in `[block_size, block_size]` tiles with an online logsumexp; the
  backward pass recomputes each tile (a `custom_vjp`): memory O((M + K) D + block_size^2).
  Gradients reach `anchors`, `candidates.vectors`, the mapping's `params` and any traced
  value the mapping closes over.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import blockwise, mappings
    >>> b = jnp.eye(3)
    >>> columns = blockwise.Candidates(b, jnp.arange(3), jnp.ones(3, bool))
    >>> lse = blockwise.logsumexp_of_mapped(b, columns, anchor_ids=-jnp.ones(3, int),
    ...     mapping=mappings.temperature(1.0), block_size=2)
    >>> round(lse[0].item(), 4) == round(float(jnp.log(jnp.e + 2)), 4)
    True

  Args:
    anchors: `[M, D]` float, unit rows (cosines are plain dot products).
    candidates: `Candidates(vectors [K, D], ids [K] int, valid [K] bool)`.
    anchor_ids: `[M]` int; a candidate with the same id is excluded (-1: none).
    mapping: a `tfcl_jax.mappings.Mapping` or a callable `cos -> logits`.
    block_size: tile side, an int > 0.

  Returns:
    `[M]` float: the logsumexp per row, `-inf` for a row without candidates.
  """
  block_size = check_block_size(block_size)
  anchors = jnp.asarray(anchors)
  anchor_ids = jnp.asarray(anchor_ids, jnp.int32)
  tile, padded_anchors, padded_ids, columns = padded_blocks(
      anchors, anchor_ids, candidates, block_size)
  pure = pure_mapping(mapping, tile_shape=tile, like=anchors)
  lse = _blockwise_lse(pure.fn, *tile, padded_anchors, padded_ids, columns, pure.params,
                       pure.step, pure.consts)
  return lse[:anchors.shape[0]]


class Layout(NamedTuple):
  """Anchors, their positives and their candidate columns for one `negatives` mode."""

  anchors: jax.Array  # [M, D]
  positives: jax.Array  # [M, D], row i the positive of anchor i
  anchor_ids: jax.Array  # [M] int32
  anchor_valid: jax.Array | None  # [M] bool
  columns: Candidates


def layout(u1: jax.Array, u2: jax.Array, *, negatives: str, valid: jax.Array | None,
           offset: jax.Array | int = 0) -> Layout:
  """Rows and columns of InfoNCE (see `losses.info_nce`) for unit `u1`, `u2` of `[n, D]`.

  `offset` shifts the ids (a device's first global id in a sharded batch).
  """
  n = u1.shape[0]
  index = jnp.arange(n, dtype=jnp.int32)
  if negatives == "cross":
    col_valid = jnp.ones((n,), bool) if valid is None else valid
    return Layout(u1, u2, jnp.full((n,), -1, jnp.int32), valid,
                  Candidates(u2, offset + index, col_valid))
  both = jnp.concatenate([u1, u2], axis=0)
  ids = offset + jnp.arange(2 * n, dtype=jnp.int32)
  both_valid = None if valid is None else jnp.concatenate([valid, valid])
  col_valid = jnp.ones((2 * n,), bool) if valid is None else both_valid
  return Layout(both, jnp.roll(both, n, axis=0), ids, both_valid,
                Candidates(both, ids, col_valid))


def positive_logits(mapping, anchors: jax.Array, positives: jax.Array) -> jax.Array:
  """`f(a_i . p_i)` per row, O(N D); JAX differentiates it (mapping params included)."""
  return mapping(jnp.sum(anchors * positives, axis=-1))


def info_nce_rows(
    u1: jax.typing.ArrayLike,
    u2: jax.typing.ArrayLike,
    *,
    mapping,
    negatives: str,
    valid: jax.typing.ArrayLike | None,
    block_size: int,
) -> tuple[jax.Array, jax.Array | None]:
  r"""Per-row InfoNCE losses of unit embeddings, blockwise (Eq. 1 / 11).

  .. math:: L_i = \log \sum_{j \in K_i} e^{f(\cos\theta_{ij})} - f(\cos\theta_{ii+})

  The same rows as `losses.info_nce(..., reduction="none")` (which calls this for
  `block_size=...`), in O(N * block_size + N * D) memory instead of O(N^2).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import blockwise, losses, mappings
    >>> u1 = losses.l2_normalize(jax.random.normal(jax.random.key(0), (5, 3)))
    >>> u2 = losses.l2_normalize(jax.random.normal(jax.random.key(1), (5, 3)))
    >>> rows, _ = blockwise.info_nce_rows(u1, u2, mapping=mappings.temperature_free(),
    ...     negatives="all", valid=None, block_size=4)
    >>> rows.shape
    (10,)

  Args:
    u1: `[N, D]` unit rows of the first view.
    u2: `[N, D]` unit rows of the second view.
    mapping: a `Mapping` or a callable `cos -> logits`.
    negatives: `"cross"` or `"all"`, as in `losses.info_nce`.
    valid: optional `[N]` bool mask of valid pairs.
    block_size: tile side, an int > 0.

  Returns:
    `(per_row [N] or [2N], anchor_valid)`: the losses and the mask of valid anchors (None
    when all are).
  """
  rows = layout(jnp.asarray(u1), jnp.asarray(u2), negatives=negatives,
                valid=None if valid is None else jnp.asarray(valid))
  lse = logsumexp_of_mapped(rows.anchors, rows.columns, anchor_ids=rows.anchor_ids,
                            mapping=mapping, block_size=block_size)
  return lse - positive_logits(mapping, rows.anchors, rows.positives), rows.anchor_valid
