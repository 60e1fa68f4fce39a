"""DCRec's item graphs against plain-Python transcriptions of the reference construction."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from tfcl_jax.data import item_graphs, movielens, sequences


def _data(seed=0, size=600, users=25, items=30, max_length=6):
  rng = np.random.default_rng(seed)
  ratings = movielens.Ratings(
      user=rng.integers(0, users, size), item=rng.integers(0, items, size),
      rating=np.ones(size, np.float32), timestamp=rng.integers(0, 1000, size), source="random")
  return sequences.build_sequences(ratings, max_length=max_length, min_user_interactions=4)


def _train_sequences(data):
  """Each user's last training input, from the whole sequence: s_0 … s_{n-4}, last max_length."""
  out = {}
  for user in range(data.num_users):
    items = data.user_items(user).tolist()[:-3]
    if items:
      out[user] = items[-data.train.max_length:]
  return out


def test_transition_graph_equals_the_reference_construction():
  data = _data()
  adjacency = collections.defaultdict(list)  # as build_adj_graph: both neighbours of each item
  for seq in _train_sequences(data).values():
    for i in range(len(seq)):
      if i > 0:
        adjacency[seq[i]].append(seq[i - 1])
        adjacency[seq[i - 1]].append(seq[i])
      if i + 1 < len(seq):
        adjacency[seq[i]].append(seq[i + 1])
        adjacency[seq[i + 1]].append(seq[i])
  n = data.num_items + 2
  matrix = np.zeros((n, n))
  for item, neighbours in adjacency.items():
    for neighbour, count in collections.Counter(neighbours).items():
      matrix[item, neighbour] = count
  np.fill_diagonal(matrix, 1.0)
  d = 1.0 / np.sqrt(matrix.sum(axis=1))
  expected = d[:, None] * matrix * d[None, :]
  graph = item_graphs.transition_graph(data)
  np.testing.assert_allclose(graph.dense(), expected, rtol=1e-6)
  assert graph.num_nodes == n and np.all(np.diff(graph.senders.astype(np.int64) * n
                                                 + graph.receivers) > 0)
  np.testing.assert_allclose(graph.dense(), graph.dense().T, rtol=1e-6)


@pytest.mark.parametrize("k", [1, 4])
def test_co_interaction_graph_keeps_each_items_most_similar(k):
  data = _data(seed=k)
  n = data.num_items + 2
  matrix = np.zeros((data.num_users, n))
  for user, seq in _train_sequences(data).items():
    for item in seq:
      matrix[user, item] += 1
  norms = np.linalg.norm(matrix, axis=0)
  similarity = (matrix.T @ matrix) / np.maximum(np.outer(norms, norms), 1e-300)
  graph = item_graphs.co_interaction_graph(data, k=k)
  dense = graph.dense()
  assert graph.senders.size == n * (k + 1)
  for item in range(n):
    row = dense[item]
    if norms[item] == 0:
      assert not row.any()  # untouched items: weight-0 edges only
      continue
    np.testing.assert_allclose(row.sum(), 1.0, rtol=1e-6)
    kept = np.flatnonzero(graph.senders == item)
    neighbours = graph.receivers[kept]
    assert item in neighbours  # cosine 1 with itself
    # Nothing left out is more similar than what was kept.
    left_out = np.setdiff1d(np.arange(n), neighbours)
    assert similarity[item, left_out].max() <= similarity[item, neighbours].min() + 1e-12
    np.testing.assert_allclose(graph.weights[kept],
                               similarity[item, neighbours] / similarity[item, neighbours].sum(),
                               rtol=1e-5)
  with pytest.raises(ValueError, match="k \\+ 1 = 41 neighbours"):
    item_graphs.co_interaction_graph(data, k=40)


def test_user_edges_are_the_transitions_of_their_sequence():
  data = _data(seed=3)
  graph = item_graphs.transition_graph(data)
  edges = item_graphs.user_edge_ids(graph, data)
  sequences_by_user = _train_sequences(data)
  for user in range(data.num_users):
    seq = sequences_by_user.get(user, [])
    expected = {(a, b) for a, b in zip(seq[:-1], seq[1:], strict=True)}
    expected |= {(b, a) for a, b in expected}
    got = set(zip(graph.senders[edges[user]].tolist(), graph.receivers[edges[user]].tolist(),
                  strict=True))
    assert got == expected, user


def test_test_phase_uses_the_test_inputs():
  data = _data(seed=5)
  users, windows = item_graphs.user_sequences(data, phase="test")
  np.testing.assert_array_equal(windows, data.test.inputs())
  for user, window in zip(users, windows, strict=True):
    seq = data.user_items(user).tolist()[:-1][-data.test.max_length:]
    assert window[:len(seq)].tolist() == seq
  with pytest.raises(ValueError, match="phase"):
    item_graphs.user_sequences(data, phase="valid")
