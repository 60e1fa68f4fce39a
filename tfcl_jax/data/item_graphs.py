"""DCRec's two global item graphs, built from leave-one-out sequences (host NumPy).

DCRec (Yang et al., WWW 2023) contrasts a user's sequence with two views of the items:

- the **transition graph**: items adjacent in some user's sequence. As in the reference code
  (`build_adj_graph`), each adjacent pair adds 2 to both directions of its edge, the diagonal is
  then set to 1, and weights are normalised symmetrically, `D^-1/2 A D^-1/2` with `D` the
  weighted row sums;
- the **co-interaction graph**: each item's `k + 1` most similar items by the cosine of their
  user columns in the user × item interaction matrix (itself included), weights normalised to
  sum 1 per item (`build_sim_graph`). The reference computes the top-k in chunks of 256 rows
  whose slicing skips rows (it re-slices an already sliced matrix), so items past the first
  few hundred get another item's neighbours; here every item gets its own. Ties in the
  similarity are broken by the lower item index.

Both are built from one sequence per user, as DCRec's RecBole pipeline does before its prefix
augmentation: `phase="train"` uses each user's last training input (the items before the
validation target, at most `max_length`), `phase="test"` each user's test input. Nodes are
`0 … num_items + 1`: 0 is padding and `num_items + 1` the mask token of DCRec's embedding table,
both isolated apart from their diagonal entry.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfcl_jax import _checks
from tfcl_jax.data import sequences as sequences_lib


@dataclasses.dataclass(frozen=True)
class ItemGraph:
  """A weighted directed graph over items, as a list of edges sorted by (sender, receiver).

  Attributes:
    senders, receivers: `[E] int32` edge endpoints.
    weights: `[E] float32` edge weights.
    num_nodes: `num_items + 2` (padding 0 and the mask token included).
  """

  senders: np.ndarray
  receivers: np.ndarray
  weights: np.ndarray
  num_nodes: int

  def dense(self) -> np.ndarray:
    """`[num_nodes, num_nodes] float64` adjacency matrix (for tests and small graphs)."""
    matrix = np.zeros((self.num_nodes, self.num_nodes))
    np.add.at(matrix, (self.senders, self.receivers), self.weights)
    return matrix


def user_sequences(data: sequences_lib.SequenceData, *, phase: str) -> tuple[np.ndarray,
                                                                              np.ndarray]:
  """`(users [U], windows [U, max_length])`: one sequence per user, as the graphs use them.

  `phase="train"`: the input of each user's validation example minus its last item, i.e. the
  last training example's input; `"test"`: the test example's input.
  """
  if phase == "test":
    return data.test.users, data.test.inputs()
  if phase != "train":
    raise ValueError(f"phase must be 'train' or 'test', got {phase!r}.")
  split = data.valid  # input s_0 … s_{n-3}; the last training input is s_0 … s_{n-4}
  ends, lengths = split.ends - 1, np.minimum(split.ends - 1 - data.user_offsets[split.users],
                                             split.max_length)
  keep = lengths > 0
  train = sequences_lib.SequenceSplit(items=split.items, users=split.users[keep],
                                      ends=ends[keep], lengths=lengths[keep].astype(np.int32),
                                      max_length=split.max_length)
  return train.users, train.inputs()


def _pairs(windows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Adjacent (earlier, later) items of each window and the row each pair comes from."""
  earlier, later = windows[:, :-1], windows[:, 1:]
  valid = later > 0
  rows = np.broadcast_to(np.arange(windows.shape[0])[:, None], earlier.shape)
  return earlier[valid], later[valid], rows[valid]


def transition_graph(data: sequences_lib.SequenceData, *, phase: str = "train") -> ItemGraph:
  """The transition graph of `phase`'s sequences, normalised `D^-1/2 A D^-1/2`.

  Examples:
    >>> import numpy as np
    >>> from tfcl_jax.data import item_graphs, movielens, sequences
    >>> ratings = movielens.Ratings(user=np.zeros(5, int), item=np.array([1, 2, 3, 4, 5]),
    ...     rating=np.ones(5, np.float32), timestamp=np.arange(5), source="example")
    >>> graph = item_graphs.transition_graph(sequences.build_sequences(ratings))
    >>> np.round(graph.dense()[1:3, 1:3], 3).tolist()   # items 1-2 adjacent in training
    [[0.333, 0.667], [0.667, 0.333]]
  """
  _, windows = user_sequences(data, phase=phase)
  num_nodes = data.num_items + 2
  earlier, later, _ = _pairs(windows)
  keys = np.concatenate([earlier.astype(np.int64) * num_nodes + later,
                         later.astype(np.int64) * num_nodes + earlier])
  keys = keys[keys // num_nodes != keys % num_nodes]  # the diagonal is set to 1 below
  diagonal = np.arange(num_nodes, dtype=np.int64) * (num_nodes + 1)
  keys, inverse = np.unique(np.concatenate([keys, diagonal]), return_inverse=True)
  counts = np.bincount(inverse, weights=np.concatenate(
      [np.full(inverse.size - num_nodes, 2.0), np.ones(num_nodes)]))
  senders, receivers = keys // num_nodes, keys % num_nodes
  inverse_sqrt = 1.0 / np.sqrt(np.bincount(senders, weights=counts, minlength=num_nodes))
  weights = counts * inverse_sqrt[senders] * inverse_sqrt[receivers]
  return ItemGraph(senders=senders.astype(np.int32), receivers=receivers.astype(np.int32),
                   weights=weights.astype(np.float32), num_nodes=num_nodes)


def co_interaction_graph(data: sequences_lib.SequenceData, *, k: int = 4,
                         phase: str = "train") -> ItemGraph:
  """Each item's `k + 1` nearest items by cosine of their user columns, weights summing to 1.

  Items no user touched (padding, the mask token) keep `k + 1` edges of weight 0, as in the
  reference (its `nan_to_num`).

  Raises:
    ValueError: `k + 1` larger than the number of nodes.
  """
  k = _checks.positive_int(k, name="k")
  users, windows = user_sequences(data, phase=phase)
  num_nodes = data.num_items + 2
  if k + 1 > num_nodes:
    raise ValueError(f"k + 1 = {k + 1} neighbours asked for, but the graph has only "
                     f"{num_nodes} nodes (items, padding and mask token).")
  from scipy import sparse  # noqa: PLC0415

  rows = np.broadcast_to(users[:, None], windows.shape)
  valid = windows > 0
  interactions = sparse.csr_matrix(
      (np.ones(int(valid.sum())), (rows[valid], windows[valid])),
      shape=(data.num_users, num_nodes))  # repeated (user, item) entries add up
  norms = np.sqrt(np.asarray(interactions.multiply(interactions).sum(axis=0))).ravel()
  unit = sparse.csc_matrix(interactions @ sparse.diags(1.0 / np.where(norms > 0, norms, 1.0)))
  top = np.empty((num_nodes, k + 1), np.int64)
  weights = np.empty((num_nodes, k + 1))
  for start in range(0, num_nodes, 1024):  # [1024, num_nodes] similarities at a time
    chunk = np.asarray((unit[:, start:start + 1024].T @ unit).todense())
    top[start:start + 1024] = np.argsort(-chunk, axis=1, kind="stable")[:, :k + 1]
    weights[start:start + 1024] = np.take_along_axis(chunk, top[start:start + 1024], axis=1)
  totals = weights.sum(axis=1, keepdims=True)
  weights = np.where(totals > 0, weights / np.where(totals > 0, totals, 1.0), 0.0)
  senders = np.repeat(np.arange(num_nodes), k + 1)
  order = np.lexsort((top.ravel(), senders))
  return ItemGraph(senders=senders[order].astype(np.int32),
                   receivers=top.ravel()[order].astype(np.int32),
                   weights=weights.ravel()[order].astype(np.float32), num_nodes=num_nodes)


def user_edge_ids(graph: ItemGraph, data: sequences_lib.SequenceData) -> list[np.ndarray]:
  """For each user, the ids (into `graph`'s edges) of the transition edges of their training
  sequence, both directions: DCRec's `graph_augment` removes them for the users of a batch.
  """
  users, windows = user_sequences(data, phase="train")
  earlier, later, rows = _pairs(windows)
  key = graph.senders.astype(np.int64) * graph.num_nodes + graph.receivers
  ids = np.concatenate([np.searchsorted(key, x.astype(np.int64) * graph.num_nodes + y)
                        for x, y in ((earlier, later), (later, earlier))])
  owners = users[np.concatenate([rows, rows])]
  order = np.argsort(owners, kind="stable")
  starts = np.searchsorted(owners[order], np.arange(data.num_users + 1))
  return [np.unique(ids[order[starts[u]:starts[u + 1]]]) for u in range(data.num_users)]
