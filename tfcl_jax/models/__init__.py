"""Encoders and heads: ResNet-18 (ImageNet / CIFAR stem), a small CNN for digits, SimCLR's head."""

from __future__ import annotations

from tfcl_jax.models import heads, resnet, small_cnn
from tfcl_jax.models.heads import ContrastiveModel, ProjectionHead
from tfcl_jax.models.resnet import ResNet, ResNet18
from tfcl_jax.models.small_cnn import SmallCNN

#: The names `make_backbone` takes.
BACKBONES = ("small_cnn", "resnet18_imagenet", "resnet18_cifar")


def make_backbone(name: str, *, width: int | None = None) -> SmallCNN | ResNet:
  """A backbone by name (`BACKBONES`); `width` overrides the first-stage channels.

  Examples:
    >>> from tfcl_jax import models
    >>> models.make_backbone("resnet18_cifar").stem
    'cifar'
  """
  if name == "small_cnn":
    return SmallCNN() if width is None else SmallCNN(widths=(width, 2 * width, 4 * width))
  if name in ("resnet18_imagenet", "resnet18_cifar"):
    return ResNet18(stem=name.split("_")[1], width=64 if width is None else width)
  raise ValueError(f"backbone must be one of {BACKBONES}, got {name!r}.")


def make_contrastive_model(
    backbone: str, *, width: int | None = None, projection_hidden_dim: int = 512,
    projection_dim: int = 128
) -> ContrastiveModel:
  """Backbone + SimCLR projection head.

  Examples:
    >>> from tfcl_jax import models
    >>> models.make_contrastive_model("small_cnn", projection_dim=32).head.out_dim
    32
  """
  return ContrastiveModel(
      make_backbone(backbone, width=width),
      ProjectionHead(hidden_dim=projection_hidden_dim, out_dim=projection_dim))


__all__ = [
    "BACKBONES", "ContrastiveModel", "ProjectionHead", "ResNet", "ResNet18", "SmallCNN", "heads",
    "make_backbone", "make_contrastive_model", "resnet", "small_cnn",
]
