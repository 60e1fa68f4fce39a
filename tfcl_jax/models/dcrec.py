r"""DCRec's networks (Yang et al., WWW 2023), as in its reference code (HKUDS/DCRec on RecBole).

Three views of the item a user interacted with last:

- **sequence**: RecBole's Transformer encoder over the item sequence (item + position
  embeddings, LayerNorm, dropout, `n_layers` × (multi-head self-attention, feed-forward), each
  with a residual LayerNorm), read at the last position. The reference masks only padding, so
  attention is bidirectional; the readout position sees the whole sequence;
- **transition graph** and **co-interaction graph** (`tfcl_jax.data.item_graphs`): the item
  embeddings propagated twice over the graph without weights (DGL `GraphConv(norm="both",
  weight=False)` after `add_self_loop`: a weight-1 self-loop per node, messages scaled by the
  edge weight and by `deg_out(src)^-1/2 deg_in(dst)^-1/2`, degrees counting edges), the mean of
  the input and both propagations, plus the input, LayerNorm. During training a random half of
  the edges (the reference draws `⌊p E⌋` edge ids with replacement) gets weight 0. The
  reference also does this at evaluation (its `graph_dropout` ignores the training flag); so
  does `DCRec` when `graph_dropout_at_eval` (default True, as the code).

The fusion attention mixes the three views of the last item: `softmax_v(((x_v W) ⊙ a).sum())`.

Initialisation as RecBole's `_init_weights`: embeddings and dense kernels N(0, 0.02), biases 0,
LayerNorm (1, 0).
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

_INIT = nn.initializers.normal(0.02)


class GraphEdges(NamedTuple):
  """A graph as edge arrays (`data.item_graphs.ItemGraph` on the device)."""

  senders: jax.Array
  receivers: jax.Array
  weights: jax.Array


def propagate(features: jax.Array, graph: GraphEdges, *, keep: jax.Array | None = None,
              dropped: jax.Array | None = None) -> jax.Array:
  """One DGL `GraphConv(norm="both", weight=False)` pass after `add_self_loop`.

  `out[d] = deg_in(d)^-1/2 Σ_{s→d} w_sd deg_out(s)^-1/2 x[s]` over the graph's kept edges and one
  weight-1 self-loop per node; degrees count kept edges (weights do not enter them).

  Args:
    features: `[N, H]`.
    graph: the edges, without the added self-loops.
    keep: `[E] bool` edges present (False: removed, as DCRec's `graph_augment`); default all.
    dropped: `[E + N] bool` edges (then self-loops) whose weight is set to 0 (graph dropout).
  """
  num_nodes = features.shape[0]
  loops = jnp.arange(num_nodes, dtype=graph.senders.dtype)
  senders = jnp.concatenate([graph.senders, loops])
  receivers = jnp.concatenate([graph.receivers, loops])
  present = jnp.ones(senders.shape[0], features.dtype)
  if keep is not None:
    present = present.at[:keep.shape[0]].set(keep.astype(features.dtype))
  weights = jnp.concatenate([graph.weights.astype(features.dtype),
                             jnp.ones(num_nodes, features.dtype)]) * present
  if dropped is not None:
    weights = jnp.where(dropped, 0.0, weights)
  out_degree = jax.ops.segment_sum(present, senders, num_segments=num_nodes)
  in_degree = jax.ops.segment_sum(present, receivers, num_segments=num_nodes)
  source = features * jax.lax.rsqrt(jnp.maximum(out_degree, 1.0))[:, None]
  messages = source[senders] * weights[:, None]
  summed = jax.ops.segment_sum(messages, receivers, num_segments=num_nodes)
  return summed * jax.lax.rsqrt(jnp.maximum(in_degree, 1.0))[:, None]


def graph_dropout_mask(key: jax.Array, num_edges: int, *, rate: float) -> jax.Array:
  """`[num_edges] bool`: `⌊rate · num_edges⌋` edge ids drawn with replacement are dropped."""
  count = int(rate * num_edges)
  drawn = jax.random.randint(key, (count,), 0, num_edges)
  return jnp.zeros(num_edges, bool).at[drawn].set(True)


class _SelfAttention(nn.Module):
  num_heads: int
  hidden_dropout: float
  attention_dropout: float
  layer_norm_eps: float

  @nn.compact
  def __call__(self, x, key_mask, *, deterministic: bool):
    batch, length, hidden = x.shape
    if hidden % self.num_heads:
      raise ValueError(f"hidden_dim ({hidden}) must be a multiple of num_heads "
                       f"({self.num_heads}).")
    head = hidden // self.num_heads
    dense = lambda name: nn.Dense(hidden, kernel_init=_INIT, name=name)  # noqa: E731
    split = lambda t: t.reshape(batch, length, self.num_heads, head)  # noqa: E731
    q, k, v = (split(dense(name)(x)) for name in ("query", "key", "value"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(head)
    scores = scores + jnp.where(key_mask, 0.0, -10000.0)[:, None, None, :]  # as RecBole
    probs = nn.Dropout(self.attention_dropout)(jax.nn.softmax(scores, axis=-1),
                                               deterministic=deterministic)
    context = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, hidden)
    out = nn.Dropout(self.hidden_dropout)(dense("dense")(context), deterministic=deterministic)
    return nn.LayerNorm(epsilon=self.layer_norm_eps, name="norm")(out + x)


class _FeedForward(nn.Module):
  inner_size: int
  hidden_dropout: float
  layer_norm_eps: float

  @nn.compact
  def __call__(self, x, *, deterministic: bool):
    h = jax.nn.gelu(nn.Dense(self.inner_size, kernel_init=_INIT, name="inner")(x),
                    approximate=False)
    h = nn.Dense(x.shape[-1], kernel_init=_INIT, name="outer")(h)
    h = nn.Dropout(self.hidden_dropout)(h, deterministic=deterministic)
    return nn.LayerNorm(epsilon=self.layer_norm_eps, name="norm")(h + x)


class DCRec(nn.Module):
  """DCRec's parameters and its three views (see the module docstring).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.models import dcrec
    >>> model = dcrec.DCRec(num_nodes=7, max_length=4, hidden_dim=8, inner_size=16)
    >>> inputs, lengths = jnp.array([[1, 2, 0, 0], [3, 4, 5, 0]]), jnp.array([2, 3])
    >>> params = model.init(jax.random.key(0), inputs, lengths)["params"]
    >>> out = model.apply({"params": params}, inputs, lengths, method="encode_sequence")
    >>> out.shape
    (2, 8)

  Attributes:
    num_nodes: rows of the item table: items, padding 0 and the mask token (`num_items + 2`).
    max_length: longest input sequence.
    hidden_dim, inner_size, num_layers, num_heads: the Transformer (RecBole's defaults
      64, 256, 2, 2).
    hidden_dropout, attention_dropout: DCRec's 0.5 and 0.5 on ML-20M.
    graph_dropout: fraction of graph edges zeroed per propagation (0.5 on ML-20M).
    graph_dropout_at_eval: zero edges at evaluation too, as the reference code does.
    layer_norm_eps: RecBole's 1e-12.
  """

  num_nodes: int
  max_length: int
  hidden_dim: int = 64
  inner_size: int = 256
  num_layers: int = 2
  num_heads: int = 2
  hidden_dropout: float = 0.5
  attention_dropout: float = 0.5
  graph_dropout: float = 0.5
  graph_dropout_at_eval: bool = True
  layer_norm_eps: float = 1e-12

  def setup(self):
    self.item_embedding = nn.Embed(self.num_nodes, self.hidden_dim, embedding_init=_INIT)
    self.position_embedding = nn.Embed(self.max_length + 1, self.hidden_dim,
                                       embedding_init=_INIT)
    self.input_norm = nn.LayerNorm(epsilon=self.layer_norm_eps)
    self.dropout = nn.Dropout(self.hidden_dropout)
    self.attention = [_SelfAttention(self.num_heads, self.hidden_dropout,
                                     self.attention_dropout, self.layer_norm_eps)
                      for _ in range(self.num_layers)]
    self.feed_forward = [_FeedForward(self.inner_size, self.hidden_dropout,
                                      self.layer_norm_eps) for _ in range(self.num_layers)]
    self.graph_norm = nn.LayerNorm(epsilon=self.layer_norm_eps)
    self.fusion_kernel = self.param("fusion_kernel", _INIT, (self.hidden_dim,
                                                             self.hidden_dim))
    self.fusion_query = self.param("fusion_query", _INIT, (1, self.hidden_dim))

  def __call__(self, inputs, lengths, *, deterministic: bool = True):
    """Initialises every parameter: the sequence view and the fusion of three copies of it."""
    out = self.encode_sequence(inputs, lengths, deterministic=deterministic)
    return self.fuse(out, out, out), self.graph_norm(out)

  def encode_sequence(self, inputs, lengths, *, deterministic: bool = True):
    """`[B, L]` item ids (0 = padding after the last item), `[B]` lengths -> `[B, H]`."""
    positions = jnp.arange(inputs.shape[1])
    x = self.item_embedding(inputs) + self.position_embedding(positions)[None]
    x = self.dropout(self.input_norm(x), deterministic=deterministic)
    key_mask = inputs > 0
    for attention, feed_forward in zip(self.attention, self.feed_forward, strict=True):
      x = feed_forward(attention(x, key_mask, deterministic=deterministic),
                       deterministic=deterministic)
    return x[jnp.arange(inputs.shape[0]), lengths - 1]

  def item_table(self):
    """`[num_nodes, H]` the item embeddings (the output layer scores against them)."""
    return self.item_embedding.embedding

  def encode_graph(self, graph: GraphEdges, *, keep=None, deterministic: bool = True):
    """`[num_nodes, H]`: LayerNorm(x + mean(x, A x, A A x)), `x` the (dropped-out) items."""
    x = self.dropout(self.item_embedding.embedding, deterministic=deterministic)
    dropped = None
    if self.graph_dropout > 0 and (not deterministic or self.graph_dropout_at_eval):
      num_edges = graph.senders.shape[0] + self.num_nodes
      dropped = graph_dropout_mask(self.make_rng("graph"), num_edges, rate=self.graph_dropout)
    layers = [x]
    for _ in range(2):
      layers.append(propagate(layers[-1], graph, keep=keep, dropped=dropped))
    return self.graph_norm(jnp.mean(jnp.stack(layers), axis=0) + x)

  def fuse(self, sequence, transition, co_interaction):
    """`[B, H]` × 3 -> `[B, H]`: the views mixed by DCRec's fusion attention."""
    views = jnp.stack([sequence, transition, co_interaction])
    logits = jnp.sum((views @ self.fusion_kernel) * self.fusion_query, axis=-1)
    return jnp.sum(views * jax.nn.softmax(logits, axis=0)[..., None], axis=0)
