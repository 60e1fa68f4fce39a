"""DCRec's networks and objective against NumPy transcriptions of the reference's pieces."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfcl_jax import mappings
from tfcl_jax.data import movielens, sequences
from tfcl_jax.models import dcrec
from tfcl_jax.objectives import dcrec as dcrec_objective
from tfcl_jax.training import sharding, state, step


def _data(seed=0, size=300, max_length=6):
  rng = np.random.default_rng(seed)
  ratings = movielens.Ratings(user=rng.integers(0, 12, size), item=rng.integers(0, 20, size),
                              rating=np.ones(size, np.float32), timestamp=np.arange(size),
                              source="random")
  return sequences.build_sequences(ratings, max_length=max_length)


def test_propagate_equals_dgl_graphconv_norm_both_after_add_self_loop():
  rng = np.random.default_rng(0)
  n, e = 7, 15
  senders, receivers = rng.integers(0, n, e), rng.integers(0, n, e)
  weights = rng.random(e).astype(np.float32)
  x = rng.normal(size=(n, 3)).astype(np.float32)
  keep = rng.random(e) > 0.3
  dropped = rng.random(e + n) > 0.7
  graph = dcrec.GraphEdges(jnp.asarray(senders), jnp.asarray(receivers), jnp.asarray(weights))
  got = dcrec.propagate(jnp.asarray(x), graph, keep=jnp.asarray(keep),
                        dropped=jnp.asarray(dropped))
  # DGL: the kept edges plus one weight-1 self-loop per node; degrees count edges.
  src = np.concatenate([senders[keep], np.arange(n)])
  dst = np.concatenate([receivers[keep], np.arange(n)])
  w = np.concatenate([weights, np.ones(n)])
  w = np.where(dropped, 0.0, w)[np.concatenate([np.flatnonzero(keep), e + np.arange(n)])]
  out_degree = np.maximum(np.bincount(src, minlength=n), 1)
  in_degree = np.maximum(np.bincount(dst, minlength=n), 1)
  expected = np.zeros_like(x)
  for s, d, weight in zip(src, dst, w, strict=True):
    expected[d] += weight * x[s] / math.sqrt(out_degree[s])
  expected /= np.sqrt(in_degree)[:, None]
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)
  mask = dcrec.graph_dropout_mask(jax.random.key(0), 1000, rate=0.5)
  assert 300 < int(mask.sum()) <= 500  # 500 draws with replacement


def _layer_norm(x, scale, bias, eps=1e-12):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def _transformer_reference(p, inputs, lengths, heads):
  """RecBole's SASRec-style encoder in NumPy (eval mode), read at position length - 1."""
  table, positions = np.asarray(p["item_embedding"]["embedding"]), np.asarray(
      p["position_embedding"]["embedding"])
  x = table[inputs] + positions[np.arange(inputs.shape[1])][None]
  x = _layer_norm(x, p["input_norm"]["scale"], p["input_norm"]["bias"])
  mask = np.where(inputs > 0, 0.0, -10000.0)[:, None, None, :]
  layer = 0
  while f"attention_{layer}" in p:
    a, f = p[f"attention_{layer}"], p[f"feed_forward_{layer}"]
    b, length, hidden = x.shape
    dense = lambda name, h, q=a: h @ np.asarray(q[name]["kernel"]) + np.asarray(q[name]["bias"])
    q, k, v = (dense(name, x).reshape(b, length, heads, hidden // heads).transpose(0, 2, 1, 3)
               for name in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hidden // heads) + mask
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(b, length, hidden)
    x = _layer_norm(dense("dense", context) + x, a["norm"]["scale"], a["norm"]["bias"])
    inner = dense("inner", x, f)
    inner = 0.5 * inner * (1 + np.vectorize(math.erf)(inner / math.sqrt(2)))
    x = _layer_norm(dense("outer", inner, f) + x, f["norm"]["scale"], f["norm"]["bias"])
    layer += 1
  return x[np.arange(b), lengths - 1]


def test_sequence_encoder_equals_recbole_transformer_in_numpy():
  data = _data()
  model = dcrec.DCRec(num_nodes=data.num_items + 2, max_length=6, hidden_dim=8, inner_size=16,
                      num_layers=2, num_heads=2)
  inputs, lengths = data.test.inputs()[:5], data.test.lengths[:5]
  params = model.init(jax.random.key(0), inputs, lengths)["params"]
  got = model.apply({"params": params}, inputs, lengths, method="encode_sequence")
  expected = _transformer_reference(jax.tree.map(np.asarray, params), inputs, lengths, heads=2)
  np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-4, atol=2e-5)
  with pytest.raises(ValueError, match="multiple of num_heads"):
    dcrec.DCRec(num_nodes=5, max_length=3, hidden_dim=6, num_heads=4).init(
        jax.random.key(0), inputs[:, :3], np.minimum(lengths, 3))


def test_conformity_weights_have_the_requested_mean_and_kl_matches_cal_kl_1():
  data = _data(seed=1)
  graphs = dcrec_objective.make_graphs(data, k=3)
  model = dcrec.DCRec(num_nodes=data.num_items + 2, max_length=6, hidden_dim=8, inner_size=16)
  index = np.arange(16)
  inputs, lengths = data.train.inputs(index), data.train.lengths[index]
  params = model.init(jax.random.key(0), inputs, lengths)["params"]
  transition = model.apply({"params": params}, graphs.transition, method="encode_graph",
                           rngs={"graph": jax.random.key(1)})
  last = inputs[np.arange(16), lengths - 1]
  weights = dcrec_objective.conformity_weights(
      jax.random.key(2), model, params, graphs, data.train.users[index], last, transition,
      weight_mean=0.4)
  np.testing.assert_allclose(float(jnp.mean(weights)), 0.4, rtol=1e-5)
  assert float(jnp.min(weights)) == pytest.approx(0.0, abs=1e-6)
  # cal_kl_1 in NumPy, with the same normal draws.
  key = jax.random.key(3)
  draws = np.sort(0.4 + 0.1 * np.asarray(jax.random.normal(key, (16,))))
  target = np.log(np.maximum(draws, 1e-8) + 1e-8)
  sorted_weights = np.sort(np.asarray(weights)) + 1e-8
  log_input = sorted_weights - np.log(np.sum(np.exp(sorted_weights)))
  expected = np.sum(np.exp(target) * (target - log_input)) / 16
  np.testing.assert_allclose(float(dcrec_objective.weight_kl(key, weights, weight_mean=0.4)),
                             expected, rtol=1e-5)


@pytest.mark.heavy  # 30 training steps: CI's heavy step (tests/experiments/test_dcrec.py trains)
def test_a_few_train_steps_lower_the_next_item_loss_and_scores_have_the_candidates_shape():
  # Each user walks the items in order (item i, then i + 1 mod 20): the next item is learnable.
  rng = np.random.default_rng(2)
  starts = rng.integers(0, 20, 30)
  ratings = movielens.Ratings(
      user=np.repeat(np.arange(30), 10), item=((starts[:, None] + np.arange(10)) % 20).ravel(),
      rating=np.ones(300, np.float32), timestamp=np.tile(np.arange(10), 30), source="cycle")
  data = sequences.build_sequences(ratings, max_length=6)
  graphs = dcrec_objective.make_graphs(data, k=3)
  model = dcrec.DCRec(num_nodes=data.num_items + 2, max_length=6, hidden_dim=16,
                      inner_size=32, hidden_dropout=0.1, attention_dropout=0.1)
  batch = {"users": data.train.users, "inputs": data.train.inputs(),
           "lengths": data.train.lengths, "targets": data.train.targets}
  params = model.init(jax.random.key(0), batch["inputs"], batch["lengths"])["params"]
  mesh = sharding.make_mesh(jax.devices()[:1])
  train_state = state.create_train_state(model_params=params, tx=optax.adam(1e-2))
  train_step = step.make_train_step(
      dcrec_objective.make_dcrec_loss(model, mappings.temperature_free(), graphs), mesh=mesh)
  first = None
  for _ in range(30):
    train_state, metrics = train_step(train_state, batch, jax.random.key(1))
    first = float(metrics["ce"]) if first is None else first
  assert np.isfinite(float(metrics["loss"]))
  assert float(metrics["ce"]) < first - 1.0, (first, float(metrics["ce"]))
  score = dcrec_objective.make_scorer(model, dcrec_objective.make_graphs(data, phase="test"))
  candidates = np.stack([data.test.targets, data.test.targets[::-1]], axis=1)
  scores = jax.jit(score)(train_state.params["model"], jax.random.key(2), data.test.inputs(),
                          data.test.lengths, candidates)
  assert scores.shape == (len(data.test), 2) and np.all(np.isfinite(np.asarray(scores)))
