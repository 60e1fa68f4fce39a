r"""The GRACE objective as a `loss_fn` for `training.make_train_step`: two random views of a graph.

Section 5.2 of Kim & Kim (arXiv 2501.17683) trains GRACE (Zhu et al. 2020, PyGCL's recipe) with
InfoNCE over intra- and inter-view negatives, Eq. 1 (`cos / tau`) or Eq. 11 (temperature-free).
Unlike SimCLR and MSC (`objectives.views.encode_two_views`), each view has its own graph (edges
dropped independently), so the two views go through the GCN in two calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import jax

from tfcl_jax import losses, mappings
from tfcl_jax.augment import graph as graph_augment
from tfcl_jax.models import gcn


@dataclasses.dataclass(frozen=True)
class GraphBatch:
  """The whole graph, one full batch: a pytree of sparse features and the edge list."""

  features: gcn.Features  # [N, F], a BCOO or dense
  edge_index: jax.Array  # [2, E] int32


jax.tree_util.register_dataclass(GraphBatch, data_fields=["features", "edge_index"],
                                 meta_fields=[])


def make_grace_loss(
    model: gcn.GRACE,
    loss: losses.Loss | mappings.Mapping,
    *,
    edge_rate: float,
    feature_rate: float,
    block_size: int | None = None,
) -> Callable[..., tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]]:
  """`loss_fn(params, model_state, batch, key, step)` of GRACE on a `GraphBatch`.

  Two views (`augment.graph.grace_view`: edges removed with probability `edge_rate`, feature
  columns masked with `feature_rate`), their projections, and `loss` on them with
  intra- and inter-view negatives: `info_nce(h1, h2, negatives="all")` (Eq. 1 with `tau`,
  Eq. 11 with `free`) for a `Mapping` or an InfoNCE `Loss`, the sigmoid loss for a sigmoid
  `Loss` (`losses.from_spec`); the learnable values are `params["loss"]`;
  `block_size` is the loss's tile side (None: automatic). No metrics.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import mappings
    >>> from tfcl_jax.models import gcn
    >>> from tfcl_jax.objectives import grace
    >>> batch = grace.GraphBatch(gcn.sparse_features(jnp.eye(4)),
    ...                          jnp.array([[0, 1, 2, 3], [1, 2, 3, 0]], jnp.int32))
    >>> model = gcn.GRACE(hidden_dims=(8,), projection_hidden_dim=8)
    >>> full = gcn.gcn_normalize(batch.edge_index, num_nodes=4)
    >>> params = {"model": model.init(jax.random.key(0), batch.features, full)["params"],
    ...           "loss": {}}
    >>> loss_fn = grace.make_grace_loss(model, mappings.temperature_free(), edge_rate=0.3,
    ...                                 feature_rate=0.3)
    >>> loss, (_, metrics) = jax.jit(loss_fn)(params, {}, batch, jax.random.key(1), 0)
    >>> loss.shape, metrics
    ((), {})
  """
  loss = losses.as_loss(loss)

  def loss_fn(params, model_state, batch: GraphBatch, key, step):
    projections = [encode_view(model, params["model"], batch, view_key, edge_rate=edge_rate,
                               feature_rate=feature_rate)[1]
                   for view_key in jax.random.split(key)]

    evaluation = loss.evaluate(*projections, params=params["loss"], step=step,
                               negatives="all", block_size=block_size)
    return evaluation.value, (model_state, evaluation.metrics)

  return loss_fn


def encode_view(model: gcn.GRACE, model_params: Any, batch: GraphBatch, key: jax.Array, *,
                edge_rate: float, feature_rate: float) -> tuple[jax.Array, jax.Array]:
  """`(embeddings, projections)` `[N, D]` of one GRACE view of the graph (`grace_view`: edges
  removed with probability `edge_rate`, feature columns masked with `feature_rate`).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.models import gcn
    >>> from tfcl_jax.objectives import grace
    >>> batch = grace.GraphBatch(jnp.eye(3), jnp.array([[0, 1, 2], [1, 2, 0]], jnp.int32))
    >>> model = gcn.GRACE(hidden_dims=(4,), projection_hidden_dim=4)
    >>> params = model.init(jax.random.key(0), batch.features,
    ...                     gcn.gcn_normalize(batch.edge_index, num_nodes=3))["params"]
    >>> [x.shape for x in grace.encode_view(model, params, batch, jax.random.key(1),
    ...                                     edge_rate=0.3, feature_rate=0.3)]
    [(3, 4), (3, 4)]
  """
  num_nodes, num_edges = batch.features.shape[0], batch.edge_index.shape[1]
  view = graph_augment.grace_view(key, batch.features, num_edges, edge_rate=edge_rate,
                                  feature_rate=feature_rate)
  propagation = gcn.gcn_normalize(batch.edge_index, num_nodes=num_nodes,
                                  edge_weight=view.edge_weight)
  return cast(tuple[jax.Array, jax.Array],
              model.apply({"params": model_params}, view.features, propagation))
