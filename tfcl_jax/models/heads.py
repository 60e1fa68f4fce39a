"""The SimCLR projection head and the encoder+head model a contrastive loss trains.

Chen et al. 2020 (SimCLR): the loss sees `g(f(x))`, evaluation uses the backbone features `f(x)`.
"""

from __future__ import annotations

import flax.linen as nn
import jax


class ProjectionHead(nn.Module):
  """MLP `Dense-BN-ReLU` x (num_layers - 1), then `Dense(out_dim)`: `[B, F] -> [B, out_dim]`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.models import heads
    >>> head = heads.ProjectionHead(hidden_dim=16, out_dim=4)
    >>> variables = head.init(jax.random.key(0), jnp.zeros((2, 8)), train=False)
    >>> head.apply(variables, jnp.zeros((2, 8)), train=False).shape
    (2, 4)
  """

  hidden_dim: int = 512
  out_dim: int = 128
  num_layers: int = 2

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    for _ in range(self.num_layers - 1):
      x = nn.Dense(self.hidden_dim, use_bias=False)(x)
      x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
    return nn.Dense(self.out_dim)(x)


class ContrastiveModel(nn.Module):
  """`x -> (features f(x), projections g(f(x)))` for any backbone and head.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.models import heads, small_cnn
    >>> model = heads.ContrastiveModel(small_cnn.SmallCNN(widths=(8,)),
    ...                                heads.ProjectionHead(hidden_dim=8, out_dim=4))
    >>> x = jnp.zeros((2, 8, 8, 1))
    >>> variables = jax.jit(lambda: model.init(jax.random.key(0), x, train=False))()
    >>> [a.shape for a in jax.jit(lambda v: model.apply(v, x, train=False))(variables)]
    [(2, 8), (2, 4)]
  """

  backbone: nn.Module
  head: nn.Module

  def __call__(self, x: jax.Array, *, train: bool) -> tuple[jax.Array, jax.Array]:
    features = self.backbone(x, train=train)
    return features, self.head(features, train=train)

  def features(self, x: jax.Array) -> jax.Array:
    """Backbone features in evaluation mode (running BatchNorm statistics)."""
    return self.backbone(x, train=False)
