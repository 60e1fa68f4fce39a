"""Two-tower retrieval: a query tower and a candidate tower mapping features to one space.

Each tower embeds its features (an id, categorical features, bags of tokens), concatenates
them and maps them through an MLP to `dim`; a tower of one feature and no hidden layer is that
feature's embedding table, the model of TensorFlow Recommenders' basic retrieval tutorial
(`Embedding(vocabulary + 1, 32)` per side). Scores are `query . candidate` (the tutorial) or the
cosine of the two (every loss of `tfcl_jax.losses`, which normalises).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


def keras_uniform(scale: float = 0.05):
  """Keras's `Embedding` initialiser: uniform on `[-scale, scale)` (the tutorial's)."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -scale, scale)

  return init


class Tower(nn.Module):
  """`{feature: indices} -> [B, dim]`.

  `categorical` features are `[B] int` indices, `bags` are `[B, L] int` token indices with 0
  for padding (a bag's embedding is the mean of its tokens', zero for an empty bag);
  `vocab_sizes[name]` rows each (index 0 included). One feature and no hidden layer: its
  embedding itself; otherwise `concat(embeddings) -> [Dense(h) -> ReLU]* -> Dense(dim)`, one
  `Dense(h)` per width `h` of `hidden_dims`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.models import towers
    >>> tower = towers.Tower(vocab_sizes={"user_id": 10, "age": 8}, categorical=("user_id", "age"),
    ...                      dim=4, hidden_dims=(16,))
    >>> inputs = {"user_id": jnp.array([1, 2]), "age": jnp.array([3, 0])}
    >>> variables = tower.init(jax.random.key(0), inputs)
    >>> tower.apply(variables, inputs).shape
    (2, 4)
  """

  vocab_sizes: Mapping[str, int]
  categorical: Sequence[str] = ()
  bags: Sequence[str] = ()
  dim: int = 32
  hidden_dims: Sequence[int] = ()
  embed_dim: int | None = None  # width of each feature's table; None: `dim`

  @nn.compact
  def __call__(self, inputs: Mapping[str, jax.Array]) -> jax.Array:
    names = (*self.categorical, *self.bags)
    if not names:
      raise ValueError("a Tower needs at least one feature (categorical or bags).")
    width = self.dim if self.embed_dim is None else self.embed_dim
    parts = []
    for name in names:
      table = nn.Embed(self.vocab_sizes[name], width, embedding_init=keras_uniform(),
                       name=f"embed_{name}")
      if name in self.categorical:
        parts.append(table(inputs[name]))
      else:
        tokens = inputs[name]
        present = (tokens > 0).astype(jnp.float32)[..., None]
        total = jnp.sum(table(tokens) * present, axis=-2)
        parts.append(total / jnp.maximum(jnp.sum(present, axis=-2), 1.0))
    if len(parts) == 1 and not self.hidden_dims and width == self.dim:
      return parts[0]
    x = jnp.concatenate(parts, axis=-1)
    for size in self.hidden_dims:
      x = nn.relu(nn.Dense(size)(x))
    return nn.Dense(self.dim)(x)


class TwoTower(nn.Module):
  """`(query inputs, candidate inputs) -> (query embeddings, candidate embeddings)`.

  `embed_queries` and `embed_candidates` (as `method=` of `apply`) run one tower, for scoring
  every candidate at evaluation.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.models import towers
    >>> model = towers.TwoTower(
    ...     towers.Tower(vocab_sizes={"user_id": 5}, categorical=("user_id",), dim=8),
    ...     towers.Tower(vocab_sizes={"item_id": 7, "genres": 4}, categorical=("item_id",),
    ...                  bags=("genres",), dim=8))
    >>> users = {"user_id": jnp.array([1, 2])}
    >>> items = {"item_id": jnp.array([3, 4]), "genres": jnp.array([[1, 2], [3, 0]])}
    >>> variables = model.init(jax.random.key(0), users, items)
    >>> q, c = model.apply(variables, users, items)
    >>> q.shape, model.apply(variables, items, method=model.embed_candidates).shape
    ((2, 8), (2, 8))
  """

  query_tower: Tower
  candidate_tower: Tower

  def __call__(self, query_inputs, candidate_inputs):
    return self.query_tower(query_inputs), self.candidate_tower(candidate_inputs)

  def embed_queries(self, inputs):
    return self.query_tower(inputs)

  def embed_candidates(self, inputs):
    return self.candidate_tower(inputs)
