"""A small convolutional encoder for 8x8 digits and 1-D signals (MNIST-1D): fast enough to sweep
mappings x seeds on a CPU."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class SmallCNN(nn.Module):
  """Conv3x3-BN-ReLU blocks, stride 2 after the first, then global average pooling.

  `x: [B, H, W, C] float -> [B, widths[-1]] float` (the backbone features used for kNN); on
  signals `[B, L, C]` the same blocks with kernels of 3 samples.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.models import small_cnn
    >>> model = small_cnn.SmallCNN(widths=(8, 16))
    >>> x = jnp.zeros((2, 8, 8, 1))
    >>> variables = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False))
    >>> jax.eval_shape(lambda v: model.apply(v, x, train=False), variables).shape
    (2, 16)

  Attributes:
    widths: channels of each block.
  """

  widths: Sequence[int] = (32, 64, 128)

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    if x.ndim not in (3, 4):
      raise ValueError(f"x must have shape [B, H, W, C] (images) or [B, L, C] (signals), got "
                       f"{x.shape}.")
    spatial = x.ndim - 2
    for index, width in enumerate(self.widths):
      stride = 1 if index == 0 else 2
      x = nn.Conv(width, (3,) * spatial, strides=(stride,) * spatial, use_bias=False)(x)
      x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
      x = nn.relu(x)
    return jnp.mean(x, axis=tuple(range(1, 1 + spatial)))
