"""GCN propagation and GRACE's graph views, against dense NumPy references."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse

from tfcl_jax.augment import graph as graph_augment
from tfcl_jax.models import gcn


def _random_graph(seed, n=12, p=0.3):
  rng = np.random.default_rng(seed)
  upper = np.triu(rng.random((n, n)) < p, 1)
  source, target = np.nonzero(upper | upper.T)
  return np.stack([source, target]).astype(np.int32), rng


def _dense_normalized(edge_index, weight, n):
  """D^-1/2 (A + I) D^-1/2 with A[target, source] = weight, D the row sums (Kipf & Welling)."""
  a = np.zeros((n, n))
  np.add.at(a, (edge_index[1], edge_index[0]), weight)
  a += np.eye(n)
  d = a.sum(axis=1)
  return a / np.sqrt(d)[:, None] / np.sqrt(d)[None, :]


@pytest.mark.parametrize("seed", [0, 1])
def test_propagate_matches_dense(seed):
  edge_index, rng = _random_graph(seed)
  weight = rng.random(edge_index.shape[1]).astype(np.float32)
  h = rng.normal(size=(12, 3)).astype(np.float32)
  prop = gcn.gcn_normalize(edge_index, num_nodes=12, edge_weight=weight)
  expected = _dense_normalized(edge_index, weight, 12) @ h
  np.testing.assert_allclose(gcn.propagate(jnp.asarray(h), prop), expected, rtol=1e-5, atol=1e-6)


def test_zero_weight_is_edge_removal():
  edge_index, rng = _random_graph(2)
  keep = rng.random(edge_index.shape[1]) < 0.6
  h = jnp.asarray(rng.normal(size=(12, 4)), jnp.float32)
  masked = gcn.propagate(h, gcn.gcn_normalize(edge_index, num_nodes=12,
                                              edge_weight=keep.astype(np.float32)))
  removed = gcn.propagate(h, gcn.gcn_normalize(edge_index[:, keep], num_nodes=12))
  np.testing.assert_allclose(masked, removed, rtol=1e-6, atol=1e-6)


def test_gcn_conv_dense_and_sparse_match_numpy():
  edge_index, rng = _random_graph(3)
  x = (rng.random((12, 7)) < 0.3) * rng.random((12, 7))
  x = x.astype(np.float32)
  prop = gcn.gcn_normalize(edge_index, num_nodes=12)
  conv = gcn.GCNConv(5)
  variables = conv.init(jax.random.key(0), jnp.asarray(x), prop)
  kernel, bias = np.asarray(variables["params"]["kernel"]), np.asarray(variables["params"]["bias"])
  expected = _dense_normalized(edge_index, np.ones(edge_index.shape[1]), 12) @ x @ kernel + bias
  apply = jax.jit(conv.apply)
  np.testing.assert_allclose(apply(variables, jnp.asarray(x), prop), expected, rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(apply(variables, gcn.sparse_features(x), prop), expected,
                             rtol=1e-5, atol=1e-6)


def test_grace_model_shapes_and_relu():
  edge_index, rng = _random_graph(4)
  x = jnp.asarray(rng.random((12, 6)), jnp.float32)
  prop = gcn.gcn_normalize(edge_index, num_nodes=12)
  model = gcn.GRACE(hidden_dims=(8, 8), projection_hidden_dim=4)
  params = jax.jit(model.init)(jax.random.key(0), x, prop)
  embeddings, projections = jax.jit(model.apply)(params, x, prop)
  chex.assert_shape([embeddings, projections], (12, 8))
  assert float(embeddings.min()) >= 0.0  # ReLU after the last layer, as PyGCL's GConv
  embed = jax.jit(lambda p, x: model.apply(p, x, prop, method=gcn.GRACE.embed))
  chex.assert_trees_all_close(embed(params, x), embeddings)


def test_drop_edges_rate_and_keys():
  weights = graph_augment.drop_edges(jax.random.key(0), 20_000, rate=0.3)
  assert set(np.unique(np.asarray(weights)).tolist()) <= {0.0, 1.0}
  assert abs(float(weights.mean()) - 0.7) < 0.02  # 6 standard deviations of the binomial
  np.testing.assert_array_equal(weights, graph_augment.drop_edges(jax.random.key(0), 20_000,
                                                                  rate=0.3))
  assert not np.array_equal(weights, graph_augment.drop_edges(jax.random.key(1), 20_000, rate=0.3))
  assert float(graph_augment.drop_edges(jax.random.key(0), 100, rate=0.0).min()) == 1.0


def test_mask_features_columns_shared_and_sparse_equals_dense():
  rng = np.random.default_rng(0)
  x = ((rng.random((30, 2000)) < 0.1) * rng.random((30, 2000))).astype(np.float32)
  key = jax.random.key(5)
  dense = np.asarray(graph_augment.mask_features(key, jnp.asarray(x), rate=0.3))
  masked_columns = ~np.any(dense != 0, axis=0) & np.any(x != 0, axis=0)
  np.testing.assert_array_equal(dense[:, ~masked_columns], x[:, ~masked_columns])
  assert abs(masked_columns.sum() / np.any(x != 0, axis=0).sum() - 0.3) < 0.05
  sparse_view = jax.jit(lambda x: graph_augment.mask_features(key, x, rate=0.3))(
      sparse.BCOO.fromdense(x))
  assert isinstance(sparse_view, sparse.BCOO)
  np.testing.assert_array_equal(jax.jit(sparse.BCOO.todense)(sparse_view), dense)


def test_views_jit_and_bad_rates():
  x = jnp.ones((4, 6))
  view = jax.jit(lambda k: graph_augment.grace_view(k, x, 10))(jax.random.key(0))
  chex.assert_shape([view.features, view.edge_weight], [(4, 6), (10,)])
  with pytest.raises(ValueError, match="rate"):
    graph_augment.drop_edges(jax.random.key(0), 5, rate=1.0)
  with pytest.raises(ValueError, match="rate"):
    graph_augment.mask_features(jax.random.key(0), x, rate=-0.1)
  with pytest.raises(ValueError, match="edge_index"):
    gcn.gcn_normalize(jnp.zeros((3, 4), jnp.int32), num_nodes=4)
