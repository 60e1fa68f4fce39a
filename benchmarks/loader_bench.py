r"""Host throughput of `data.make_loader` against a NumPy floor, and of the host resize.

* loader: `make_loader("digits", "train", ...)`, one shuffled epoch, batches of 128 (grain,
  random access, worker threads).
* floor: the same epoch as `images[permutation[i:i + B]]` on in-memory arrays.
* host squaring: `ImageSource` making 160 x 213 images (Imagenette 160px: a center crop) and
  240 x 320 ones (a resize, then the crop) 160 x 160, one image at a time, against reading only.

Interleaved repeats, medians; run on the machine that will feed the accelerator.

Run: python -m benchmarks.loader_bench
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from tfcl_jax import data
from tfcl_jax.data import tfds_source


def _epoch_loader(batch_size: int):
  loader = data.make_loader("digits", "train", batch_size=batch_size, seed=0, shard_index=0,
                            shard_count=1)
  return sum(len(batch["label"]) for batch in loader)


def _epoch_floor(images, labels, batch_size: int, rng):
  permutation = rng.permutation(len(labels))
  count = 0
  for start in range(0, len(labels) - batch_size + 1, batch_size):
    index = permutation[start:start + batch_size]
    count += len({"image": images[index], "label": labels[index]}["label"])
  return count


class _FakeSource:
  def __init__(self, images):
    self._images = images

  def __len__(self):
    return len(self._images)

  def __getitem__(self, index):
    return {"image": self._images[index], "label": np.int64(0)}


def _read_all(source):
  return sum(source[i]["image"].shape[0] for i in range(len(source)))


def _median(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main(repeats: int = 5):
  images, labels = data.load_arrays("digits", "train")
  rng = np.random.default_rng(0)
  batch_size = 128
  loader_s = _median(lambda: _epoch_loader(batch_size), repeats)
  floor_s = _median(lambda: _epoch_floor(images, labels, batch_size, rng), repeats)
  examples = (len(labels) // batch_size) * batch_size
  print(f"digits train epoch, B={batch_size}, median of {repeats}")
  print(f"  loader {examples / loader_s:10.0f} images/s   floor {examples / floor_s:10.0f} "
        f"images/s   loader / floor time {loader_s / floor_s:.1f}")

  for height, width in [(160, 213), (240, 320)]:
    wide = np.random.default_rng(1).integers(0, 256, (64, height, width, 3), dtype=np.uint8)
    squaring = tfds_source.ImageSource(_FakeSource(wide), image_size=160, channels=3)
    reading = _FakeSource(wide)
    square_s = _median(lambda: _read_all(squaring), repeats)  # noqa: B023 (called right here)
    read_s = _median(lambda: _read_all(reading), repeats)  # noqa: B023
    what = "center crop" if height == 160 else "resize + center crop"
    print(f"host squaring {height}x{width} -> 160x160 ({what}), one thread:")
    print(f"  {len(wide) / square_s:10.0f} images/s   read only "
          f"{len(wide) / read_s:10.0f} images/s")


if __name__ == "__main__":
  main()
