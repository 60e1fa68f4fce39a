"""Queries in fixed-size chunks: `[Q, ...] -> fn` per chunk, so memory is `chunk x bank`."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from tfcl_jax import _checks


def map_chunks(fn: Callable[[jax.Array], jax.Array], queries: jax.Array, *,
               chunk_size: int) -> jax.Array:
  """`concatenate([fn(chunk) for chunk in queries split by chunk_size])` with one compiled `fn`.

  The queries are padded with zero rows to a multiple of the chunk (at most `Q` rows per
  chunk), mapped with `lax.map`, and the padding's outputs dropped. `fn` mappings `[c, ...]` to
  `[c, ...]` row by row (a padded row must not change the others' outputs).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.evaluation.chunks import map_chunks
    >>> map_chunks(lambda c: 2 * c, jnp.arange(5.0), chunk_size=2).tolist()
    [0.0, 2.0, 4.0, 6.0, 8.0]
  """
  _checks.positive_int(chunk_size, name="chunk_size")
  q = queries.shape[0]
  chunk_size = max(1, min(chunk_size, q))
  padded = -(-q // chunk_size) * chunk_size
  queries = jnp.pad(queries, [(0, padded - q)] + [(0, 0)] * (queries.ndim - 1))
  out = jax.lax.map(fn, queries.reshape(-1, chunk_size, *queries.shape[1:]))
  return out.reshape(padded, *out.shape[2:])[:q]
