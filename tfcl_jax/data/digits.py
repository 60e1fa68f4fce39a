"""scikit-learn's bundled 8x8 digits (1797 images, no download) as uint8 images and int32 labels.

The `train`/`test` splits are a deterministic stratified 80/20 split (seed 0).
"""

from __future__ import annotations

import functools

import numpy as np

_SPLIT_SEED = 0
_TEST_FRACTION = 0.2


def _sklearn(module: str):
  """`sklearn.<module>`; scikit-learn (it embeds the digits) is in the `experiments` extra."""
  import importlib  # noqa: PLC0415

  try:
    return importlib.import_module(f"sklearn.{module}")
  except ImportError as error:
    raise ImportError("the digits dataset is scikit-learn's load_digits: pip install "
                      "'tfcl_jax[experiments]' (or scikit-learn).") from error


@functools.lru_cache(maxsize=1)
def _all_digits() -> tuple[np.ndarray, np.ndarray]:
  datasets = _sklearn("datasets")

  bunch = datasets.load_digits()
  # Pixel values are 0..16 (counts of set pixels in 4x4 blocks); scale to the uint8 range.
  images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
  return images, bunch.target.astype(np.int32)


@functools.lru_cache(maxsize=2)
def _split_indices(split: str) -> np.ndarray:
  model_selection = _sklearn("model_selection")

  _, labels = _all_digits()
  train, test = model_selection.train_test_split(
      np.arange(len(labels)), test_size=_TEST_FRACTION, stratify=labels,
      random_state=_SPLIT_SEED)
  return np.sort(train if split == "train" else test)


def load_digits(split: str) -> tuple[np.ndarray, np.ndarray]:
  """The `train` or `test` split of the digits as `(images uint8 [N, 8, 8, 1], labels int32 [N])`.

  Examples:
    >>> images, labels = load_digits("test")
    >>> images.shape, images.dtype.name, labels.dtype.name
    ((360, 8, 8, 1), 'uint8', 'int32')

  Args:
    split: "train" (1437 images) or "test" (360 images).

  Returns:
    Copies of the images, scaled from 0..16 to 0..255, and their labels 0..9.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test' for digits, got {split!r}.")
  images, labels = _all_digits()
  index = _split_indices(split)
  return images[index], labels[index]
