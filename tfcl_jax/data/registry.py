"""The datasets tfcl_jax knows by name, and the checks that run before anything is loaded.

One `DatasetInfo` per dataset: where it comes from, its splits, and its host-side image size.
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What the loaders and the experiments need to know about one dataset.

  Attributes:
    name: our short name (the key in `DATASETS`).
    tfds_name: the TFDS name (with config), or `None` for the datasets bundled with scikit-learn.
    num_classes: number of labels; unlabelled examples carry label -1.
    image_size: side of the square images the host hands out (`[B, S, S, C]` batches).
    channels: 1 (grey) or 3 (RGB).
    train_split: split with labels used to fit linear/kNN probes.
    test_split: split with labels used to evaluate them.
    pretrain_split: split for self-supervised pretraining (the unlabelled data where present).
    num_train: number of examples in `train_split` (`None` when unknown).
    recipe: the `tfcl_jax.augment` recipe meant for this dataset.
    view_size: side of the augmented views for pretraining (the crop size after the host resize).
  """

  name: str
  tfds_name: str | None
  num_classes: int
  image_size: int
  channels: int
  train_split: str
  test_split: str
  pretrain_split: str
  num_train: int | None
  recipe: str = "simclr"
  view_size: int | None = None

  @property
  def splits(self) -> tuple[str, ...]:
    """The base split names this dataset accepts (TFDS slicing like `train[:10%]` is on top)."""
    names = []
    for split in (self.train_split, self.test_split, self.pretrain_split):
      for part in split.split("+"):
        if part not in names:
          names.append(part)
    return tuple(names)


DATASETS: dict[str, DatasetInfo] = {
    # scikit-learn's 8x8 digits: 1797 images, bundled, no download; stratified 80/20 split.
    "digits": DatasetInfo(
        name="digits", tfds_name=None, num_classes=10, image_size=8, channels=1,
        train_split="train", test_split="test", pretrain_split="train", num_train=1437,
        recipe="digits", view_size=8),
    "cifar10": DatasetInfo(
        name="cifar10", tfds_name="cifar10", num_classes=10, image_size=32, channels=3,
        train_split="train", test_split="test", pretrain_split="train", num_train=50_000,
        recipe="simclr_cifar", view_size=32),
    # Paper, Section 5.1: "A crop size of 128 pixels was applied after a resize [...] of 160".
    "imagenette": DatasetInfo(
        name="imagenette", tfds_name="imagenette/160px-v2", num_classes=10, image_size=160,
        channels=3, train_split="train", test_split="validation", pretrain_split="train",
        num_train=9_469, recipe="simclr", view_size=128),
    # The 100k unlabelled images join the 5k labelled ones for pretraining.
    "stl10": DatasetInfo(
        name="stl10", tfds_name="stl10", num_classes=10, image_size=96, channels=3,
        train_split="train", test_split="test", pretrain_split="train+unlabelled", num_train=5_000,
        recipe="simclr", view_size=96),
}


def get_info(name: str) -> DatasetInfo:
  """The `DatasetInfo` registered under `name`.

  Examples:
    >>> from tfcl_jax import data
    >>> data.get_info("cifar10").image_size
    32

  Raises:
    ValueError: `name` is not a known dataset (the message lists the known ones).
  """
  if not isinstance(name, str):
    raise TypeError(f"name must be a dataset name (str), got {type(name).__name__}.")
  if name not in DATASETS:
    raise ValueError(f"Unknown dataset {name!r}; known datasets: {sorted(DATASETS)}.")
  return DATASETS[name]


# `train`, `train[:10%]`, `train[100:200]+unlabelled`: base names with optional TFDS slices.
_SPLIT_PART = re.compile(r"^([A-Za-z_]+)(\[[^\]]*\])?$")


def check_split(info: DatasetInfo, split: str) -> str:
  """Checks that `split` names splits of `info` (TFDS slicing allowed for TFDS datasets)."""
  if not isinstance(split, str):
    raise TypeError(f"split must be a str, got {type(split).__name__}.")
  for part in split.split("+"):
    match = _SPLIT_PART.match(part.strip())
    if match is None or match.group(1) not in info.splits:
      raise ValueError(
          f"Unknown split {split!r} for dataset {info.name!r}; known splits: "
          f"{list(info.splits)}.")
    if match.group(2) and info.tfds_name is None:
      raise ValueError(
          f"split {split!r}: slicing is only supported for TFDS datasets, not {info.name!r}.")
  return split
