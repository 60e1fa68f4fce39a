r"""GRACE's stochastic graph views: edge removing and feature masking, with explicit keys.

Shapes stay fixed under `jit`: a removed edge keeps its slot with weight 0 (`models.gcn`
normalises with those weights, which is the same as deleting it), masked feature columns are 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import sparse

from tfcl_jax import _checks


def _check_rate(rate, *, name: str) -> None:
  if _checks.is_concrete(rate) and not 0.0 <= float(rate) < 1.0:
    raise ValueError(f"{name} must be in [0, 1), got {rate!r}.")


def drop_edges(key: jax.Array, num_edges: int, *, rate: float) -> jax.Array:
  r"""Edge removing: `[E]` float weights, each directed edge kept (1) with probability `1 - rate`.

  Each direction is dropped independently, as PyGCL's `EdgeRemoving` (PyG `dropout_adj`,
  not forced undirected).

  Examples:
    >>> import jax
    >>> from tfcl_jax.augment import graph as graph_augment
    >>> w = graph_augment.drop_edges(jax.random.key(0), 10_000, rate=0.3)
    >>> round(float(w.mean()), 1)
    0.7

  Args:
    key: PRNG key.
    num_edges: `E`.
    rate: probability of removing an edge, in `[0, 1)`.

  Returns:
    `[E] float32` in `{0, 1}`.
  """
  _check_rate(rate, name="rate")
  return jax.random.bernoulli(key, 1.0 - rate, (num_edges,)).astype(jnp.float32)


def mask_features(key: jax.Array, features: jax.Array | sparse.BCOO, *,
                  rate: float) -> jax.Array | sparse.BCOO:
  r"""Feature masking: zero each feature column (for every node) with probability `rate`.

  As PyGCL's `FeatureMasking` (GRACE's `drop_feature`): one mask over the `F` columns, shared by
  all nodes. Dense or `BCOO` features; a `BCOO` keeps its sparsity pattern, masked values are 0.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.augment import graph as graph_augment
    >>> x = graph_augment.mask_features(jax.random.key(0), jnp.ones((2, 1000)), rate=0.3)
    >>> bool((x[0] == x[1]).all()), round(float(x.mean()), 1)
    (True, 0.7)

  Args:
    key: PRNG key.
    features: `[N, F]` float, dense or `BCOO`.
    rate: probability of masking a column, in `[0, 1)`.

  Returns:
    Features of the same type and shape.
  """
  _check_rate(rate, name="rate")
  if features.ndim != 2:
    raise ValueError(f"features must have shape [N, F], got {features.shape}.")
  keep = jax.random.bernoulli(key, 1.0 - rate, (features.shape[1],))
  if isinstance(features, sparse.BCOO):
    values = jnp.where(keep[features.indices[:, 1]], features.data, 0.0)
    return sparse.BCOO((values, features.indices), shape=features.shape,
                       indices_sorted=features.indices_sorted,
                       unique_indices=features.unique_indices)
  return jnp.where(keep[None, :], features, 0.0)


class View(NamedTuple):
  """One augmented view: masked features and `[E]` edge weights (0 = removed)."""

  features: jax.Array | sparse.BCOO
  edge_weight: jax.Array


def grace_view(key: jax.Array, features: jax.Array | sparse.BCOO, num_edges: int, *,
               edge_rate: float = 0.3, feature_rate: float = 0.3) -> View:
  """`EdgeRemoving(edge_rate)` then `FeatureMasking(feature_rate)`, PyGCL's GRACE view.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.augment import graph as graph_augment
    >>> view = graph_augment.grace_view(jax.random.key(0), jnp.ones((3, 4)), 6)
    >>> view.features.shape, view.edge_weight.shape
    ((3, 4), (6,))

  Args:
    key: PRNG key (split inside for the two augmentations).
    features: `[N, F]` node features, dense or `BCOO`.
    num_edges: `E`, the number of directed edges.
    edge_rate: edge removal probability (GRACE/PyGCL: 0.3 on CiteSeer).
    feature_rate: feature masking probability.

  Returns:
    A `View`.
  """
  edge_key, feature_key = jax.random.split(key)
  return View(mask_features(feature_key, features, rate=feature_rate),
              drop_edges(edge_key, num_edges, rate=edge_rate))
