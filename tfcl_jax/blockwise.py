r"""Blockwise InfoNCE: the loss and its gradient tile by tile in O(N * block) memory, any mapping.

The `[N, N]` logits are never held: an online logsumexp over column blocks (FlashAttention,
Inf-CL) and a custom VJP that recomputes each tile and differentiates the mapping per tile.
"""

from __future__ import annotations

import functools
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import tiles
from tfcl_jax.tiles import Candidates


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _blockwise_lse(fn, block_rows, block_cols, anchors, excluded_ids, columns, params, step,
                   consts):
  pure = tiles.PureMapping(fn, params, step, consts)
  stats = tiles.init_stats(anchors)
  stats = tiles.accumulate_stats(
      pure, anchors, excluded_ids, columns, stats, block_rows=block_rows, block_cols=block_cols)
  return tiles.finish_logsumexp(stats)


def _blockwise_lse_fwd(fn, block_rows, block_cols, anchors, excluded_ids, columns, params, step,
                       consts):
  lse = _blockwise_lse(fn, block_rows, block_cols, anchors, excluded_ids, columns, params, step,
                       consts)
  return lse, (anchors, excluded_ids, columns, params, step, consts, lse)


def _blockwise_lse_bwd(fn, block_rows, block_cols, residuals, g):
  anchors, excluded_ids, columns, params, step, consts, lse = residuals
  pure = tiles.PureMapping(fn, params, step, consts)
  da, (db, dparams, dconsts) = tiles.accumulate_grads(
      pure, anchors, excluded_ids, lse, g, columns, tiles.zero_grads(pure, anchors, columns),
      block_rows=block_rows, block_cols=block_cols)
  return da, None, Candidates(db, None, None), dparams, None, dconsts


_blockwise_lse.defvjp(_blockwise_lse_fwd, _blockwise_lse_bwd)


def _pad_rows(x: jax.Array, multiple: int, value) -> jax.Array:
  extra = -x.shape[0] % multiple
  if extra == 0:
    return x
  padding = [(0, extra)] + [(0, 0)] * (x.ndim - 1)
  return jnp.pad(x, padding, constant_values=value)


def balanced_tile(block_size: int, n: int) -> int:
  """The tile side for `n` rows: as many tiles as `block_size` needs, sized evenly.

  `ceil(n / ceil(n / block_size))` is at most `block_size` (memory stays bounded by it) and
  pads fewer than one row per tile, where `block_size` itself could pad almost a whole tile
  (6654 rows in tiles of 1024 pad to 7168; in tiles of 951, to 6657).

  Examples:
    >>> from tfcl_jax import blockwise
    >>> blockwise.balanced_tile(1024, 6654), blockwise.balanced_tile(1024, 4096)
    (951, 1024)
  """
  return -(-n // -(-n // block_size))


def padded_blocks(anchors, excluded_ids, columns: Candidates, block_size: int | None):
  """Tile shape for `block_size` (None: one tile; else `balanced_tile`), and the padded inputs.

  Padded anchors are zero rows (their losses are sliced off); padded columns are invalid.

  Returns:
    `((block_rows, block_cols), anchors, excluded_ids, columns)`.
  """
  num_rows, num_cols = anchors.shape[0], columns.vectors.shape[0]
  if block_size is None:
    block_rows, block_cols = num_rows, num_cols
  else:
    block_rows = balanced_tile(block_size, num_rows)
    block_cols = balanced_tile(block_size, num_cols)
  columns = Candidates(
      _pad_rows(columns.vectors, block_cols, 0.0),
      _pad_rows(jnp.asarray(columns.ids, jnp.int32), block_cols, -2),
      _pad_rows(jnp.asarray(columns.valid, bool), block_cols, False))
  excluded_ids = _pad_rows(jnp.asarray(excluded_ids, jnp.int32), block_rows, -3)
  return (block_rows, block_cols), _pad_rows(anchors, block_rows, 0.0), excluded_ids, columns


def logsumexp_of_mapped(
    anchors: jax.typing.ArrayLike,
    candidates: Candidates,
    *,
    excluded_ids: jax.typing.ArrayLike,
    mapping,
    block_size: int,
) -> jax.Array:
  r"""Row-wise `log sum_{j in K_i} exp(f(a_i . b_j))`, blockwise, differentiable (Eq. 1 / 11).

  `K_i` holds the valid candidates whose id is not in `excluded_ids[i]`. The `[M, K]`
  logits are computed in `[block_size, block_size]` tiles with an online logsumexp; the
  backward pass recomputes each tile (a `custom_vjp`): memory O((M + K) D + block_size^2).
  Gradients reach `anchors`, `candidates.vectors`, the mapping's `params` and any traced
  value the mapping closes over.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import blockwise, mappings
    >>> b = jnp.eye(3)
    >>> columns = blockwise.Candidates(b, jnp.arange(3), jnp.ones(3, bool))
    >>> lse = blockwise.logsumexp_of_mapped(b, columns, excluded_ids=-jnp.ones(3, int),
    ...     mapping=mappings.temperature(1.0), block_size=2)
    >>> round(lse[0].item(), 4) == round(float(jnp.log(jnp.e + 2)), 4)
    True

  Args:
    anchors: `[M, D]` float, unit rows (cosines are plain dot products).
    candidates: `Candidates(vectors [K, D], ids [K] int, valid [K] bool)`.
    excluded_ids: `[M]` or `[M, k]` int: ids of the candidates row i excludes (-1: none).
    mapping: a `tfcl_jax.mappings.Mapping` or a callable `cos -> logits`.
    block_size: the largest tile side, an int > 0 (tiles are sized by `balanced_tile`).

  Returns:
    `[M]` float: the logsumexp per row, `-inf` for a row without candidates.
  """
  block_size = check_block_size(block_size)
  anchors = jnp.asarray(anchors)
  excluded_ids = jnp.asarray(excluded_ids, jnp.int32)
  excluded_ids = excluded_ids[:, None] if excluded_ids.ndim == 1 else excluded_ids
  tile, padded_anchors, padded_ids, columns = padded_blocks(
      anchors, excluded_ids, candidates, block_size)
  pure = tiles.pure_mapping(mapping, tile_shape=tile, like=anchors)
  lse = _blockwise_lse(pure.fn, *tile, padded_anchors, padded_ids, columns, pure.params,
                       pure.step, pure.consts)
  return lse[:anchors.shape[0]]


class Layout(NamedTuple):
  """Anchors, their positives and their candidate columns for one `negatives` mode."""

  anchors: jax.Array  # [M, D]
  positives: jax.Array  # [M, D], row i the positive of anchor i
  excluded_ids: jax.Array  # [M, k] int32: the anchor itself (all) and its positive
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
    ids = offset + index
    return Layout(u1, u2, ids[:, None], valid, Candidates(u2, ids, col_valid))
  both = jnp.concatenate([u1, u2], axis=0)
  ids = offset + jnp.arange(2 * n, dtype=jnp.int32)
  both_valid = None if valid is None else jnp.concatenate([valid, valid])
  col_valid = jnp.ones((2 * n,), bool) if valid is None else both_valid
  excluded = jnp.stack([ids, jnp.roll(ids, n)], axis=1)
  return Layout(both, jnp.roll(both, n, axis=0), excluded, both_valid,
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
            = \operatorname{softplus}\Big(\log \sum_{j \in K_i, j \ne i+} e^{f(\cos\theta_{ij})}
              - f(\cos\theta_{ii+})\Big)

  The softplus form keeps precision once `L_i` drops below float32's epsilon (as
  `losses.info_nce` does).

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
    block_size: the largest tile side, an int > 0 (tiles are sized by `balanced_tile`).

  Returns:
    `(per_row [N] or [2N], anchor_valid)`: the losses and the mask of valid anchors (None
    when all are).
  """
  rows = layout(jnp.asarray(u1), jnp.asarray(u2), negatives=negatives,
                valid=None if valid is None else jnp.asarray(valid))
  negatives_lse = logsumexp_of_mapped(rows.anchors, rows.columns, excluded_ids=rows.excluded_ids,
                            mapping=mapping, block_size=block_size)
  positive = positive_logits(mapping, rows.anchors, rows.positives)
  return jax.nn.softplus(negatives_lse - positive), rows.anchor_valid
