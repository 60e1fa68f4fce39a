"""A small convolutional encoder for 8x8 digits: fast enough to sweep mappings x seeds on a CPU."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class SmallCNN(nn.Module):
  """Conv3x3-BN-ReLU blocks, stride 2 after the first, then global average pooling.

  `x: [B, H, W, C] float -> [B, widths[-1]] float` (the backbone features used for kNN).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.models import small_cnn
    >>> model = small_cnn.SmallCNN(widths=(8, 16))
    >>> variables = model.init(jax.random.key(0), jnp.zeros((2, 8, 8, 1)), train=False)
    >>> model.apply(variables, jnp.zeros((2, 8, 8, 1)), train=False).shape
    (2, 16)

  Attributes:
    widths: channels of each block.
  """

  widths: Sequence[int] = (32, 64, 128)

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    if x.ndim != 4:
      raise ValueError(f"x must have shape [B, H, W, C], got {x.shape}.")
    for index, width in enumerate(self.widths):
      stride = 1 if index == 0 else 2
      x = nn.Conv(width, (3, 3), strides=(stride, stride), use_bias=False)(x)
      x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
      x = nn.relu(x)
    return jnp.mean(x, axis=(1, 2))
