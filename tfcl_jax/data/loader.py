"""Host input pipeline: shuffled, batched, per-host sharded numpy batches through grain.

Every dataset (TFDS or in-memory) becomes a random-access source of `{"image", "label"}`
examples; grain does the deterministic shuffle, the per-epoch batching and the resume offset.
"""

from __future__ import annotations

import numbers

import numpy as np

from tfcl_jax import _checks
from tfcl_jax.data import digits as digits_lib
from tfcl_jax.data import mnist1d as mnist1d_lib
from tfcl_jax.data import registry, tfds_source

# Batches are fetched by worker threads; each thread reads and decodes one whole batch, and as
# many batches are kept ready.
_NUM_THREADS = 8


def _import_grain():
  try:
    import grain  # noqa: PLC0415  (optional dependency: the `data` extra)
  except ImportError as error:
    raise ImportError("The input pipeline needs grain: pip install 'tfcl_jax[data]'.") from error
  return grain


class _ArraySource:
  """Random access to in-memory `images [N, ...]` (images or signals), `labels [N]`."""

  def __init__(self, images: np.ndarray, labels: np.ndarray):
    self._images, self._labels = images, labels

  def __len__(self) -> int:
    return len(self._labels)

  def __getitem__(self, index: int) -> dict[str, np.ndarray | np.generic]:
    return {"image": self._images[index], "label": self._labels[index]}


def _open_source(name: str, split: str, data_dir):
  info = registry.get_info(name)
  registry.check_split(info, split)
  if info.tfds_name is None:
    return _ArraySource(*_generated(name, split, data_dir))
  source = tfds_source.open_data_source(info, split, data_dir=data_dir)
  return tfds_source.ImageSource(source, image_size=info.image_size, channels=info.channels)


def _generated(name: str, split: str, data_dir) -> tuple[np.ndarray, np.ndarray]:
  """The datasets made without TFDS: scikit-learn's digits, the generated MNIST-1D."""
  if name == "mnist1d":
    return mnist1d_lib.load_mnist1d(split, data_dir=data_dir)
  return digits_lib.load_digits(split)


def _positive_int(value, *, name: str) -> int:
  return _checks.positive_int(value, name=name)


def _non_negative_int(value, *, name: str) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
    raise ValueError(f"{name} must be an int >= 0, got {value!r}.")
  return int(value)


def _resolve_shard(shard_index, shard_count) -> tuple[int, int]:
  if shard_index is None or shard_count is None:
    import jax  # noqa: PLC0415  (only for the process defaults)

    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
  shard_count = _positive_int(shard_count, name="shard_count")
  shard_index = _non_negative_int(shard_index, name="shard_index")
  if shard_index >= shard_count:
    raise ValueError(f"shard_index must be < shard_count = {shard_count}, got {shard_index}.")
  return shard_index, shard_count


def _shard_length(num_examples: int, shard_count: int) -> int:
  # Equal shards: every host runs the same number of steps (a remainder would deadlock
  # collectives), so up to shard_count - 1 examples are left out.
  return num_examples // shard_count


def _num_batches(num_examples: int, batch_size: int, drop_remainder: bool) -> int:
  return num_examples // batch_size if drop_remainder else -(-num_examples // batch_size)


def _check_batches(num_batches: int, name: str, split: str, per_shard: int, batch_size: int):
  if num_batches == 0:
    raise ValueError(
        f"batch_size = {batch_size} is larger than the {per_shard} examples of {name}:{split} "
        "on this shard, and drop_remainder=True would give no batch.")


def steps_per_epoch(
    name: str,
    split: str,
    *,
    batch_size: int,
    drop_remainder: bool = True,
    data_dir: str | None = None,
    shard_count: int | None = None,
) -> int:
  """Number of batches `make_loader` yields per epoch on one host.

  Examples:
    >>> from tfcl_jax import data
    >>> data.steps_per_epoch("digits", "train", batch_size=100, shard_count=1)
    14

  Args:
    name: dataset name (see `DATASETS`).
    split: split name, e.g. "train".
    batch_size: per-host batch size.
    drop_remainder: count a last, smaller batch or not.
    data_dir: TFDS data directory (`None`: TFDS's default).
    shard_count: number of hosts sharing the split (`None`: `jax.process_count()`).

  Returns:
    `floor(N_shard / batch_size)` (or its ceiling without `drop_remainder`), where
    `N_shard = floor(N / shard_count)`.
  """
  batch_size = _positive_int(batch_size, name="batch_size")
  _, shard_count = _resolve_shard(0, shard_count)
  per_shard = _shard_length(len(_open_source(name, split, data_dir)), shard_count)
  steps = _num_batches(per_shard, batch_size, drop_remainder)
  _check_batches(steps, name, split, per_shard, batch_size)
  return steps


class Loader:
  """Iterable of numpy batches `{"image": uint8 [B, H, W, C], "label": int32 [B]}`.

  Each `iter()` starts again at `start_step`. `len()` is the number of batches left (finite
  `num_epochs` only); `steps_per_epoch` is per host.
  """

  def __init__(self, dataset, *, steps_per_epoch: int, read_options):
    self._dataset = dataset
    self.steps_per_epoch = steps_per_epoch
    self._read_options = read_options

  def __len__(self) -> int:
    import sys  # noqa: PLC0415

    if len(self._dataset) >= sys.maxsize:
      raise TypeError("an endless loader (num_epochs=None) has no len().")
    return len(self._dataset)

  def __iter__(self):
    return iter(self._dataset.to_iter_dataset(self._read_options))


def make_loader(
    name: str,
    split: str,
    *,
    batch_size: int,
    seed: int,
    shuffle: bool = True,
    num_epochs: int | None = 1,
    drop_remainder: bool = True,
    data_dir: str | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    start_step: int = 0,
    num_threads: int = _NUM_THREADS,
) -> Loader:
  """Shuffled, batched numpy batches of one split, this host's shard only.

  The split is cut into `shard_count` equal, disjoint, strided shards (`shard_index::
  shard_count`); each epoch of a shard is shuffled with its own permutation (a function of
  `seed` and the epoch) and batched separately, so a batch never mixes two epochs.

  Examples:
    >>> from tfcl_jax import data
    >>> loader = data.make_loader("digits", "train", batch_size=32, seed=0, shard_count=1,
    ...                           shard_index=0)
    >>> batch = next(iter(loader))
    >>> batch["image"].shape, batch["image"].dtype.name, batch["label"].dtype.name
    ((32, 8, 8, 1), 'uint8', 'int32')
    >>> len(loader)
    44

  Args:
    name: dataset name (see `DATASETS`).
    split: split name ("train", "test", "unlabelled", "train+unlabelled", TFDS slices).
    batch_size: per-host batch size `B`.
    seed: shuffle seed (an int >= 0); the same seed gives the same batches.
    shuffle: shuffle each epoch, or read in order.
    num_epochs: epochs to yield; `None` repeats forever.
    drop_remainder: drop the last, smaller batch of every epoch.
    data_dir: TFDS data directory (`None`: TFDS's default).
    shard_index: this host's shard (`None`: `jax.process_index()`).
    shard_count: number of shards (`None`: `jax.process_count()`).
    start_step: batches to skip (resume); random access makes this free.
    num_threads: host threads reading (and decoding) batches ahead, one batch per thread.

  Returns:
    A `Loader`: iterable of `{"image": uint8 [B, H, W, C], "label": int32 [B]}`.

  Raises:
    ValueError: unknown dataset or split, bad sizes, or a batch larger than the shard.
    DatasetNotPreparedError: the TFDS dataset is not prepared (the message says how).
  """
  batch_size = _positive_int(batch_size, name="batch_size")
  seed = _non_negative_int(seed, name="seed")
  if num_epochs is not None:
    num_epochs = _positive_int(num_epochs, name="num_epochs")
  start_step = _non_negative_int(start_step, name="start_step")
  num_threads = _positive_int(num_threads, name="num_threads")
  shard_index, shard_count = _resolve_shard(shard_index, shard_count)
  grain = _import_grain()

  source = _open_source(name, split, data_dir)
  per_shard = _shard_length(len(source), shard_count)
  steps = _num_batches(per_shard, batch_size, drop_remainder)
  _check_batches(steps, name, split, per_shard, batch_size)

  dataset = grain.MapDataset.source(source)[shard_index:per_shard * shard_count:shard_count]
  if shuffle:
    # Hash the seed: grain reshuffles epoch e with seed + e, which would make (seed, e = 1)
    # repeat (seed + 1, e = 0).
    dataset = dataset.shuffle(seed=int(np.random.SeedSequence(seed).generate_state(1)[0]))
  dataset = dataset.batch(batch_size, drop_remainder=drop_remainder).repeat(num_epochs)
  if num_epochs is not None and start_step > len(dataset):
    raise ValueError(
        f"start_step = {start_step} is past the end: {num_epochs} epochs x {steps} steps.")
  dataset = dataset[start_step:]
  read_options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=num_threads)
  return Loader(dataset, steps_per_epoch=steps, read_options=read_options)


def load_arrays(name: str, split: str, *, data_dir: str | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
  """A whole split in memory: `(images uint8 [N, H, W, C], labels int32 [N])`, in order.

  Meant for small splits and evaluation features (digits, MNIST-1D, CIFAR-10); unlabelled
  examples carry label -1. MNIST-1D gives float32 signals `[N, 40, 1]`.

  Examples:
    >>> from tfcl_jax import data
    >>> images, labels = data.load_arrays("digits", "train")
    >>> images.shape, int(images.max()), sorted(set(labels.tolist())) == list(range(10))
    ((1437, 8, 8, 1), 255, True)

  Raises:
    ValueError: unknown dataset or split.
    DatasetNotPreparedError: the TFDS dataset is not prepared (the message says how).
  """
  info = registry.get_info(name)
  registry.check_split(info, split)
  if info.tfds_name is None:
    return _generated(name, split, data_dir)
  grain = _import_grain()
  source = _open_source(name, split, data_dir)
  images = np.empty((len(source), info.image_size, info.image_size, info.channels), np.uint8)
  labels = np.empty((len(source),), np.int32)
  batches = grain.MapDataset.source(source).batch(256).to_iter_dataset(
      grain.ReadOptions(num_threads=_NUM_THREADS, prefetch_buffer_size=_NUM_THREADS))
  start = 0
  for batch in batches:
    stop = start + len(batch["label"])
    images[start:stop], labels[start:stop] = batch["image"], batch["label"]
    start = stop
  return images, labels
