"""ResNet-18 in Flax Linen with an ImageNet stem (Imagenette, 128-224 px) or a CIFAR stem (32 px).

The backbone of the paper's image experiment (Section 5.1, Table 2).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

#: The stems `ResNet.stem` takes.
STEMS = ("imagenet", "cifar")


class BasicBlock(nn.Module):
  """Two 3x3 convolutions with a residual connection (He et al. 2016, Fig. 2 left)."""

  features: int
  strides: int = 1

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    norm = lambda **kw: nn.BatchNorm(use_running_average=not train, momentum=0.9, **kw)
    residual = x
    y = nn.Conv(self.features, (3, 3), (self.strides, self.strides), use_bias=False)(x)
    y = nn.relu(norm()(y))
    y = nn.Conv(self.features, (3, 3), use_bias=False)(y)
    # Zero-initialised last BN scale: each block starts as the identity (Goyal et al. 2017).
    y = norm(scale_init=nn.initializers.zeros)(y)
    if residual.shape != y.shape:
      residual = nn.Conv(self.features, (1, 1), (self.strides, self.strides), use_bias=False)(x)
      residual = norm()(residual)
    return nn.relu(y + residual)


class ResNet(nn.Module):
  """ResNet with `BasicBlock` blocks; `ResNet18` is `stage_sizes=(2, 2, 2, 2)`.

  `x: [B, H, W, C] float -> [B, 8 * width] float` (512 for ResNet-18), after global average
  pooling; no classifier (the SimCLR head or a probe goes on top).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.models import resnet
    >>> model = resnet.ResNet18(stem="cifar", width=8)
    >>> x = jnp.zeros((2, 32, 32, 3))
    >>> variables = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False))
    >>> jax.eval_shape(lambda v: model.apply(v, x, train=False), variables).shape
    (2, 64)

  Attributes:
    stage_sizes: blocks per stage.
    stem: `"imagenet"` (7x7 stride-2 conv + 3x3 max-pool) or `"cifar"` (3x3 stride-1 conv, no
      pool), as in SimCLR's CIFAR-10 variant.
    width: channels of the first stage (64 in ResNet-18), doubled at each stage.
  """

  stage_sizes: Sequence[int] = (2, 2, 2, 2)
  stem: str = "imagenet"
  width: int = 64

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    if x.ndim != 4:
      raise ValueError(f"x must have shape [B, H, W, C], got {x.shape}.")
    if self.stem not in STEMS:
      raise ValueError(f"stem must be one of {STEMS}, got {self.stem!r}.")
    if self.stem == "imagenet":
      x = nn.Conv(self.width, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], use_bias=False)(x)
    else:
      x = nn.Conv(self.width, (3, 3), use_bias=False)(x)
    x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
    if self.stem == "imagenet":
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    for stage, blocks in enumerate(self.stage_sizes):
      for block in range(blocks):
        strides = 2 if stage > 0 and block == 0 else 1
        x = BasicBlock(self.width * 2**stage, strides)(x, train=train)
    return jnp.mean(x, axis=(1, 2))


def ResNet18(*, stem: str = "imagenet", width: int = 64) -> ResNet:  # noqa: N802
  """ResNet-18 (He et al. 2016): 4 stages of 2 basic blocks."""
  return ResNet(stage_sizes=(2, 2, 2, 2), stem=stem, width=width)
