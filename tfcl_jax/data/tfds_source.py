"""TFDS splits as random-access sources of fixed-size uint8 images, read from ArrayRecord files.

Reading goes through `tfds.data_source` and needs no TensorFlow; preparing (`tfds build`) does.
"""

from __future__ import annotations

import os

import numpy as np

from tfcl_jax.data import registry

_PREPARE_HINT = (
    "Prepare it once with: pip install 'tfcl_jax[data]' tensorflow && "
    "tfds build {tfds_name} --data_dir {data_dir} --file_format array_record "
    "(building needs TensorFlow; reading it afterwards does not)."
)


class DatasetNotPreparedError(ValueError):
  """A TFDS dataset is not prepared (in ArrayRecord format) in the data directory."""


def _import_tfds():
  try:
    import tensorflow_datasets as tfds  # noqa: PLC0415  (optional dependency: the `data` extra)
  except ImportError as error:
    raise ImportError(
        "Loading TFDS datasets needs tensorflow-datasets and grain: "
        "pip install 'tfcl_jax[data]'.") from error
  return tfds


def _resolve_data_dir(tfds, data_dir) -> str:
  if data_dir is not None:
    return os.fspath(data_dir)
  return os.fspath(tfds.core.constants.get_default_data_dir())


def not_prepared_message(info: registry.DatasetInfo, data_dir: str, reason: str = "") -> str:
  """The error for a dataset not built in `data_dir`: what is missing and the command that builds
  it."""
  hint = _PREPARE_HINT.format(tfds_name=info.tfds_name, data_dir=data_dir)
  reason = f" ({reason})" if reason else ""
  return f"{info.name} ({info.tfds_name}) is not prepared in {data_dir}{reason}. {hint}"


def open_data_source(info: registry.DatasetInfo, split: str, *, data_dir=None):
  """`tfds.data_source` for `split`, or `DatasetNotPreparedError` saying how to prepare it.

  TFDS fails deep inside when the files are missing or in TFRecord format (which has no random
  access); we turn both into one message with the command that fixes it.
  """
  if info.tfds_name is None:
    raise ValueError(f"{info.name} is not a TFDS dataset (it is made without TFDS).")
  tfds = _import_tfds()
  resolved = _resolve_data_dir(tfds, data_dir)
  try:
    return tfds.data_source(info.tfds_name, split=split, data_dir=resolved, download=False)
  except (NotImplementedError, FileNotFoundError, AssertionError, KeyError) as error:
    builder = tfds.builder(info.tfds_name, data_dir=resolved)
    if not builder.is_prepared():
      raise DatasetNotPreparedError(not_prepared_message(info, resolved)) from error
    file_format = getattr(builder.info.file_format, "value", builder.info.file_format)
    if file_format != "array_record":
      raise DatasetNotPreparedError(not_prepared_message(
          info, resolved, f"found {file_format} files, which have no random access: remove "
          f"{builder.data_dir} first")) from error
    raise


def _square(image: np.ndarray, size: int) -> np.ndarray:
  """Shorter side resized to `size` (bilinear, antialiased), then the centre `size x size`."""
  from PIL import Image  # noqa: PLC0415

  height, width = image.shape[:2]
  scale = size / min(height, width)
  new_height, new_width = max(size, round(height * scale)), max(size, round(width * scale))
  if (new_height, new_width) != (height, width):
    pil = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
    image = np.asarray(pil.resize((new_width, new_height), Image.Resampling.BILINEAR))
    image = image.reshape(new_height, new_width, -1)
  top, left = (new_height - size) // 2, (new_width - size) // 2
  return image[top:top + size, left:left + size]


class ImageSource:
  """Random access to `{"image": uint8 [S, S, C], "label": int32 []}` from a TFDS data source.

  Images of another size (Imagenette's are 160 on the shorter side only) are squared on the host
  so that batches stack; the device crops them further (`tfcl_jax.augment`).
  """

  def __init__(self, source, *, image_size: int, channels: int):
    self._source = source
    self._image_size = image_size
    self._channels = channels

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> dict[str, np.ndarray | np.generic]:
    record = self._source[int(index)]
    image = np.asarray(record["image"], dtype=np.uint8)
    if image.ndim == 2:
      image = image[..., None]
    if image.shape[-1] != self._channels:
      if image.shape[-1] != 1:
        raise ValueError(
            f"example {index} has {image.shape[-1]} channels, expected {self._channels}.")
      image = np.repeat(image, self._channels, axis=-1)
    if image.shape[:2] != (self._image_size, self._image_size):
      image = _square(image, self._image_size)
    return {"image": image, "label": np.int32(record.get("label", -1))}
