r"""DCRec's objective as a `loss_fn` for `training.make_train_step` (the paper's Table 6).

For a batch of (user, input sequence, target) examples, with `v` each input's last item
(the reference's `calculate_loss_graphcl`):

1. the three views of `v`: the sequence encoder's output `s` (and a second pass `s'` with
   other dropout), the transition-graph embedding `g_a[v]`, the co-interaction one `g_c[v]`;
2. conformity weights `w`: the transition graph without the batch users' own transitions
   (`graph_augment`) is propagated again, and `w` is the sigmoid of the mean of three cosines
   (`g_a[v]` with the augmented embedding of `v`, `g_a[v]` with the mean of `v`'s kept
   ("foreign") neighbours, that mean with the mean of `v`'s removed ("civil") neighbours; at
   most 10 of each, drawn at random), min-max normalised over the batch and scaled to mean
   `weight_mean`; 0.5 where the input has one item;
3. the cross-view contrastive term, Eq. 1 of Kim & Kim with the loss's mapping in place of
   `cos / tau` (`info_nce(…, negatives="cross")`: the reference's `vanilla_loss`):
   `cl = cl_weight · mean(w · ℓ(s', g_a[v]) + (max w − w) · ℓ(g_a[v], g_c[v]))`;
4. a KL term pulling the sorted weights towards sorted draws of N(weight_mean, 0.1):
   `kl_weight · Σ p (log p − log_softmax(sorted w))` / B, as `cal_kl_1`;
5. next-item cross-entropy of the fused view (`DCRec.fuse`) against every item embedding.

The loss is `ce + cl + kl`. The reference's neighbour means are NaN for an item with no kept
neighbour; here they are 0 (the cosine with them is then 0), as the reference does for civil
neighbours.
"""

from __future__ import annotations

from typing import NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import losses, mappings
from tfcl_jax.data import item_graphs, sequences
from tfcl_jax.models import dcrec

MAX_NEIGHBOURS = 10  #: the reference samples at most 10 civil and 10 foreign neighbours


class DCRecGraphs(NamedTuple):
  """The graphs and lookup tables the objective closes over (device arrays).

  Attributes:
    transition, co_interaction: the two item graphs (training phase).
    user_edges: `[num_users, M]` each user's transition-edge ids, padded with `E`.
    neighbour_edges: `[num_nodes, D]` each item's outgoing transition-edge ids, padded with `E`.
  """

  transition: dcrec.GraphEdges
  co_interaction: dcrec.GraphEdges
  user_edges: jax.Array
  neighbour_edges: jax.Array


def _edges(graph: item_graphs.ItemGraph) -> dcrec.GraphEdges:
  return dcrec.GraphEdges(jnp.asarray(graph.senders), jnp.asarray(graph.receivers),
                          jnp.asarray(graph.weights))


def _padded(rows: list[np.ndarray], fill: int) -> np.ndarray:
  width = max(1, max((row.size for row in rows), default=1))
  out = np.full((len(rows), width), fill, np.int32)
  for index, row in enumerate(rows):
    out[index, :row.size] = row
  return out


def make_graphs(data: sequences.SequenceData, *, k: int = 4, phase: str = "train"
                ) -> DCRecGraphs:
  """DCRec's graphs of `phase` (`"train"` for the loss, `"test"` for evaluation) with top-`k`
  co-interaction neighbours (the reference's `sim_group`, 4)."""
  transition = item_graphs.transition_graph(data, phase=phase)
  co_interaction = item_graphs.co_interaction_graph(data, k=k, phase=phase)
  num_edges = transition.senders.size
  starts = np.searchsorted(transition.senders, np.arange(transition.num_nodes + 1))
  neighbour_edges = [np.arange(starts[n], starts[n + 1]) for n in range(transition.num_nodes)]
  return DCRecGraphs(
      transition=_edges(transition), co_interaction=_edges(co_interaction),
      user_edges=jnp.asarray(_padded(item_graphs.user_edge_ids(transition, data), num_edges)),
      neighbour_edges=jnp.asarray(_padded(neighbour_edges, num_edges)))


def _cosine(a, b):
  """Cosine with torch's `eps=1e-12` floor; finite gradients at zero vectors."""
  norms = jnp.sqrt(jnp.maximum(jnp.sum(a * a, axis=-1) * jnp.sum(b * b, axis=-1), 1e-24))
  return jnp.sum(a * b, axis=-1) / norms


def _neighbour_mean(key, features, edge_ids, chosen, receivers):
  """Mean of `features` over at most `MAX_NEIGHBOURS` random edges among `chosen` ([B, D])."""
  scores = jnp.where(chosen, jax.random.uniform(key, chosen.shape), -1.0)
  count = min(MAX_NEIGHBOURS, chosen.shape[1])
  top, index = jax.lax.top_k(scores, count)
  picked = top >= 0
  nodes = receivers[jnp.take_along_axis(edge_ids, index, axis=1).clip(0, receivers.shape[0] - 1)]
  total = jnp.sum(features[nodes] * picked[..., None], axis=1)
  return total / jnp.maximum(jnp.sum(picked, axis=1, keepdims=True), 1)


def conformity_weights(key, model, params, graphs: DCRecGraphs, users, last_items,
                       transition_out, *, weight_mean: float):
  """`[B]` DCRec's `_subgraph_agreement` weights (step 2 of the module docstring)."""
  num_edges = graphs.transition.senders.shape[0]
  keep = jnp.ones(num_edges, bool).at[graphs.user_edges[users].ravel()].set(False, mode="drop")
  graph_key, civil_key, foreign_key = jax.random.split(key, 3)
  augmented = model.apply({"params": params}, graphs.transition, keep=keep, deterministic=False,
                          method="encode_graph",
                          rngs={"dropout": graph_key, "graph": jax.random.fold_in(graph_key, 1)})
  edge_ids = graphs.neighbour_edges[last_items]
  valid = edge_ids < num_edges
  kept = valid & keep[edge_ids.clip(0, num_edges - 1)]
  receivers = graphs.transition.receivers
  foreign = _neighbour_mean(foreign_key, transition_out, edge_ids, kept, receivers)
  civil = _neighbour_mean(civil_key, transition_out, edge_ids, valid & ~kept, receivers)
  anchor = transition_out[last_items]
  agreement = jax.nn.sigmoid((_cosine(anchor, augmented[last_items]) + _cosine(anchor, foreign)
                              + _cosine(civil, foreign)) / 3)
  low, high = jnp.min(agreement), jnp.max(agreement)
  agreement = (agreement - low) / jnp.maximum(high - low, 1e-12)
  return (weight_mean / jnp.maximum(jnp.mean(agreement), 1e-12)) * agreement


def weight_kl(key, weights, *, weight_mean: float):
  """`cal_kl_1`: KL(sorted N(weight_mean, 0.1) draws ‖ softmax(sorted weights)) / B."""
  expected = jnp.sort(weight_mean + 0.1 * jax.random.normal(key, weights.shape))
  log_target = jnp.log(jnp.maximum(expected, 1e-8) + 1e-8)
  log_input = jax.nn.log_softmax(jnp.sort(weights) + 1e-8)
  return jnp.sum(jnp.exp(log_target) * (log_target - log_input)) / weights.shape[0]


def make_dcrec_loss(model: dcrec.DCRec, loss: losses.Loss | mappings.Mapping,
                    graphs: DCRecGraphs, *, cl_weight: float = 0.1, kl_weight: float = 0.01,
                    weight_mean: float = 0.4):
  """`loss_fn(params, model_state, batch, key, step)` of DCRec; `batch` holds `users [B]`,
  `inputs [B, L]`, `lengths [B]` and `targets [B]` (`SequenceSplit` rows).

  Defaults are the reference's ML-20M settings (`graphcl_coefficient` 0.1, `kl_weight` 0.01,
  `weight_mean` 0.4); the loss's mapping replaces its `cl_temp` (0.8). Metrics: `ce`, `cl`, `kl`.

  Examples:
    >>> import jax, numpy as np
    >>> from tfcl_jax import mappings
    >>> from tfcl_jax.data import movielens, sequences
    >>> from tfcl_jax.models import dcrec
    >>> from tfcl_jax.objectives import dcrec as dcrec_objective
    >>> rng = np.random.default_rng(0)
    >>> ratings = movielens.Ratings(user=rng.integers(0, 6, 60), item=rng.integers(0, 9, 60),
    ...     rating=np.ones(60, np.float32), timestamp=np.arange(60), source="example")
    >>> data = sequences.build_sequences(ratings, max_length=5)
    >>> graphs = dcrec_objective.make_graphs(data, k=2)
    >>> model = dcrec.DCRec(num_nodes=data.num_items + 2, max_length=5, hidden_dim=8,
    ...                     inner_size=16)
    >>> index = np.arange(8)
    >>> batch = {"users": data.train.users[index], "inputs": data.train.inputs(index),
    ...          "lengths": data.train.lengths[index], "targets": data.train.targets[index]}
    >>> params = {"model": model.init(jax.random.key(0), batch["inputs"],
    ...                               batch["lengths"])["params"], "loss": {}}
    >>> loss_fn = dcrec_objective.make_dcrec_loss(model, mappings.temperature_free(), graphs)
    >>> loss, (_, metrics) = jax.jit(loss_fn)(params, {}, batch, jax.random.key(1), 0)
    >>> loss.shape, sorted(metrics)
    ((), ['ce', 'cl', 'kl'])
  """
  loss = losses.as_loss(loss)

  def loss_fn(params, model_state, batch, key, step):
    model_params = params["model"]
    keys = jax.random.split(key, 8)
    apply = lambda *args, method, rng, **kwargs: model.apply(  # noqa: E731
        {"params": model_params}, *args, method=method, deterministic=False,
        rngs={"dropout": rng, "graph": jax.random.fold_in(rng, 1)}, **kwargs)
    inputs, lengths = batch["inputs"], batch["lengths"]
    last_items = inputs[jnp.arange(inputs.shape[0]), lengths - 1]
    transition_out = apply(graphs.transition, method="encode_graph", rng=keys[0])
    co_out = apply(graphs.co_interaction, method="encode_graph", rng=keys[1])
    sequence = apply(inputs, lengths, method="encode_sequence", rng=keys[2])
    second = cast(jax.Array, apply(inputs, lengths, method="encode_sequence", rng=keys[3]))
    weights = conformity_weights(keys[4], model, model_params, graphs, batch["users"],
                                 last_items, transition_out, weight_mean=weight_mean)
    weights = jnp.where(lengths == 1, 0.5, weights)
    kl = kl_weight * weight_kl(keys[5], weights, weight_mean=weight_mean)
    anchor, co = transition_out[last_items], co_out[last_items]
    def contrast(z1: jax.Array, z2: jax.Array) -> losses.Evaluation:
      return loss.evaluate(z1, z2, params=params["loss"], step=step, negatives="cross",
                           reduction="none")

    evaluations = contrast(second, anchor), contrast(anchor, co)
    to_anchor, to_co = (evaluation.value for evaluation in evaluations)
    cl = cl_weight * jnp.mean(weights * to_anchor + (jnp.max(weights) - weights) * to_co)
    # The two contrasts' metrics, averaged (`loss/scale`: the mean of their mean scales).
    contrast_metrics = jax.tree.map(lambda *values: jnp.mean(jnp.stack(values)),
                                    *(evaluation.metrics for evaluation in evaluations))
    # Flax types apply's result as either the output or (output, mutated variables).
    fused = cast(jax.Array, model.apply({"params": model_params}, sequence, anchor, co,
                                        method="fuse"))
    item_table = cast(jax.Array, model.apply({"params": model_params}, method="item_table"))
    logits = fused @ item_table.T
    ce = jnp.mean(jax.nn.logsumexp(logits, axis=-1)
                  - jnp.take_along_axis(logits, batch["targets"][:, None], axis=1)[:, 0])
    return ce + cl + kl, (model_state, {"ce": ce, "cl": cl, "kl": kl,
                                            **contrast_metrics})

  return loss_fn


def make_scorer(model: dcrec.DCRec, graphs: DCRecGraphs):
  """`score(params, key, inputs, lengths, candidates [B, C]) -> [B, C]`: DCRec's
  `fast_predict` with the evaluation graphs (`make_graphs(…, phase="test")`)."""

  def score(params, key, inputs, lengths, candidates):
    rngs = lambda rng: {"dropout": rng, "graph": rng}  # noqa: E731
    sequence = model.apply({"params": params}, inputs, lengths, method="encode_sequence")
    transition = model.apply({"params": params}, graphs.transition, method="encode_graph",
                             rngs=rngs(jax.random.fold_in(key, 0)))
    co = model.apply({"params": params}, graphs.co_interaction, method="encode_graph",
                     rngs=rngs(jax.random.fold_in(key, 1)))
    last_items = inputs[jnp.arange(inputs.shape[0]), lengths - 1]
    fused = model.apply({"params": params}, sequence, transition[last_items], co[last_items],
                        method="fuse")
    table = model.apply({"params": params}, method="item_table")
    return jnp.einsum("bh,bch->bc", fused, table[candidates])

  return score
