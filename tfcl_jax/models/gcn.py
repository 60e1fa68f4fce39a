r"""Graph convolutional network (Kipf & Welling) with sparse propagation, and GRACE's model.

Propagation is a gather + `segment_sum` over the edge list (no dense `[N, N]` adjacency); node
features may be a sparse `jax.experimental.sparse.BCOO` matrix (Planetoid's bag-of-words).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse

#: Node features `[N, F]`, dense or sparse (`BCOO`) for bag-of-words inputs.
Features = jax.Array | sparse.BCOO


class Propagation(NamedTuple):
  """Normalised adjacency with self-loops as an edge list: `out[target] += weight * h[source]`."""

  source: jax.Array
  target: jax.Array
  weight: jax.Array


def gcn_normalize(edge_index: jax.typing.ArrayLike, *, num_nodes: int,
                  edge_weight: jax.typing.ArrayLike | None = None) -> Propagation:
  r"""GCN's symmetric normalisation :math:`\hat D^{-1/2} (A + I) \hat D^{-1/2}` (PyG `gcn_norm`).

  Adds a weight-1 self-loop per node; the degree :math:`\hat D_{ii} = 1 + \sum_{j \to i} w_{ji}`
  counts incoming weights, so a removed edge (weight 0, see `augment.graph.drop_edges`) is
  absent from both the sum and the degrees, as if deleted.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.models import gcn
    >>> prop = gcn.gcn_normalize(jnp.array([[0, 1], [1, 0]]), num_nodes=2)
    >>> [round(float(w), 3) for w in prop.weight]  # two edges, then two self-loops
    [0.5, 0.5, 0.5, 0.5]

  Args:
    edge_index: `[2, E]` int `(source, target)` pairs, without self-loops.
    num_nodes: `N`.
    edge_weight: `[E]` float weights (default 1).

  Returns:
    A `Propagation` of `E + N` weighted edges.
  """
  edge_index = jnp.asarray(edge_index)
  if edge_index.ndim != 2 or edge_index.shape[0] != 2:
    raise ValueError(f"edge_index must have shape [2, E], got {edge_index.shape}.")
  if not jnp.issubdtype(edge_index.dtype, jnp.integer):
    raise TypeError(f"edge_index must have an integer dtype, got {edge_index.dtype}.")
  num_edges = edge_index.shape[1]
  edge_weight = (jnp.ones(num_edges, jnp.float32) if edge_weight is None
                 else jnp.asarray(edge_weight, jnp.float32))
  if edge_weight.shape != (num_edges,):
    raise ValueError(f"edge_weight must have shape [E] = ({num_edges},), got {edge_weight.shape}.")
  loops = jnp.arange(num_nodes, dtype=edge_index.dtype)
  source = jnp.concatenate([edge_index[0], loops])
  target = jnp.concatenate([edge_index[1], loops])
  weight = jnp.concatenate([edge_weight, jnp.ones(num_nodes, jnp.float32)])
  degree = jax.ops.segment_sum(weight, target, num_segments=num_nodes)
  inv_sqrt = jax.lax.rsqrt(degree)  # degree >= 1 (self-loop)
  return Propagation(source, target, inv_sqrt[source] * weight * inv_sqrt[target])


def propagate(h: jax.Array, propagation: Propagation) -> jax.Array:
  """`[N, D] -> [N, D]`: `out[i] = sum_{j -> i} weight_ji h[j]` (self-loops included)."""
  messages = propagation.weight[:, None] * h[propagation.source]
  return jax.ops.segment_sum(messages, propagation.target, num_segments=h.shape[0])


def sparse_features(dense: np.ndarray) -> sparse.BCOO:
  """A host `[N, F]` feature matrix as a `BCOO` (CiteSeer: 105k of 12.3M entries non-zero)."""
  return sparse.BCOO.fromdense(jnp.asarray(dense, jnp.float32))


class GCNConv(nn.Module):
  r"""One graph convolution :math:`\hat A X W + b` (Kipf & Welling 2017; PyG `GCNConv`).

  Glorot-uniform `W`, zero `b`, as PyG. `X` may be dense or a `BCOO` matrix.
  """

  features: int

  @nn.compact
  def __call__(self, x: Features, propagation: Propagation) -> jax.Array:
    kernel = self.param("kernel", nn.initializers.glorot_uniform(), (x.shape[-1], self.features))
    bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
    return propagate(x @ kernel, propagation) + bias


class GCN(nn.Module):
  """Stacked `GCNConv` layers with the activation after every layer (PyGCL's GRACE `GConv`).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.models import gcn
    >>> prop = gcn.gcn_normalize(jnp.array([[0, 1, 1, 2], [1, 0, 2, 1]]), num_nodes=3)
    >>> model = gcn.GCN(hidden_dims=(8, 4))
    >>> params = model.init(jax.random.key(0), jnp.ones((3, 5)), prop)
    >>> model.apply(params, jnp.ones((3, 5)), prop).shape
    (3, 4)
  """

  hidden_dims: Sequence[int] = (32, 32)
  activation: Callable[[jax.Array], jax.Array] = nn.relu

  @nn.compact
  def __call__(self, x: Features, propagation: Propagation) -> jax.Array:
    for width in self.hidden_dims:
      x = self.activation(GCNConv(width)(x, propagation))
    return x.todense() if isinstance(x, sparse.BCOO) else x  # dense without layers too


class GRACE(nn.Module):
  """GRACE's encoder and projection head: `(embeddings, projections)` of one view.

  The encoder is a `GCN`; the head is
  `Dense(projection_hidden_dim) -> ELU -> Dense(hidden_dims[-1])` (PyGCL's `Encoder.project`).
  The loss sees projections, evaluation the embeddings.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.models import gcn
    >>> prop = gcn.gcn_normalize(jnp.array([[0, 1], [1, 0]]), num_nodes=2)
    >>> model = gcn.GRACE(hidden_dims=(8, 8), projection_hidden_dim=4)
    >>> params = model.init(jax.random.key(0), jnp.ones((2, 3)), prop)
    >>> [a.shape for a in model.apply(params, jnp.ones((2, 3)), prop)]
    [(2, 8), (2, 8)]

  References:
    Zhu et al., Deep Graph Contrastive Representation Learning (GRACE), 2020.
  """

  hidden_dims: Sequence[int] = (32, 32)
  projection_hidden_dim: int = 32

  def setup(self):
    self.encoder = GCN(self.hidden_dims)
    # PyTorch nn.Linear's default weights, U(+-1/sqrt(fan_in)), as in PyGCL.
    torch_uniform = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")
    self.fc1 = nn.Dense(self.projection_hidden_dim, kernel_init=torch_uniform)
    self.fc2 = nn.Dense(self.hidden_dims[-1], kernel_init=torch_uniform)

  def __call__(self, x: Features, propagation: Propagation) -> tuple[jax.Array, jax.Array]:
    embeddings = self.encoder(x, propagation)
    return embeddings, self.project(embeddings)

  def embed(self, x: Features, propagation: Propagation) -> jax.Array:
    return self.encoder(x, propagation)

  def project(self, embeddings: jax.Array) -> jax.Array:
    return self.fc2(nn.elu(self.fc1(embeddings)))
