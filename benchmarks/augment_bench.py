r"""Compile and run time of `augment.two_views`, against per-operation keys and a floor.

* ours: `two_views` (one vector of uniforms per view, drawn under `vmap` from per-view keys).
* per-op keys: the same recipe written the direct way, each random operation drawing from its own
  split key (`random_resized_crop`, `random_horizontal_flip`, ...): one random-bit generator per
  operation for XLA to compile.
* floor: `center_view` of both copies: uint8 -> float, one fixed resize and the normalisation,
  the least any pipeline that hands out `2B` views pays.

The first call (compile + one run) is timed in process CPU seconds; then the jitted
functions are timed with `block_until_ready`, interleaved repeat by repeat so that machine
load hits all alike; medians.

Run: python -m benchmarks.augment_bench            (B = 256, Imagenette 160 -> 128; a minute)
     python -m benchmarks.augment_bench --quick    (B = 32; seconds)
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import augment
from tfcl_jax.augment import blur, colour, geometry


def _per_op_view(key, image, *, out_size: int, with_blur: bool):
  crop_key, flip_key, jitter_key, gray_key, blur_key = jax.random.split(key, 5)
  view = geometry.random_resized_crop(crop_key, image, out_size=out_size)
  view = geometry.random_horizontal_flip(flip_key, view)
  view = colour.random_colour_jitter(jitter_key, view)
  view = colour.random_grayscale(gray_key, view)
  if with_blur:
    view = blur.random_gaussian_blur(blur_key, view, kernel_size=blur.blur_kernel_size(out_size))
  return jnp.clip(view, 0.0, 1.0)


def _per_op_two_views(key, images, *, recipe: str, out_size: int):
  spec = augment.RECIPES[recipe]
  keys = jax.random.split(key, (images.shape[0], 2))
  view = functools.partial(_per_op_view, out_size=out_size, with_blur=recipe == "simclr")
  pair = lambda k, image: jax.vmap(view, in_axes=(0, None))(k, image)
  views = jax.vmap(pair)(keys, images.astype(jnp.float32) / 255.0)
  views = (views - jnp.asarray(spec.mean)) / jnp.asarray(spec.std)
  return views[:, 0], views[:, 1]


def _compile_seconds(fn, *args) -> float:
  start = time.process_time()
  jax.block_until_ready(fn(*args))
  return time.process_time() - start


def _median_seconds(fns: dict, repeats: int) -> dict[str, float]:
  samples = {name: [] for name in fns}
  for _ in range(repeats):
    for name, (fn, args) in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      samples[name].append(time.perf_counter() - start)
  return {name: statistics.median(times) for name, times in samples.items()}


def run(recipe: str, batch: int, image_size: int, out_size: int, repeats: int):
  images = jnp.asarray(np.random.default_rng(0).integers(
      0, 256, (batch, image_size, image_size, 3), dtype=np.uint8))
  key = jax.random.key(0)
  ours = jax.jit(functools.partial(augment.two_views, recipe=recipe, out_size=out_size))
  per_op = jax.jit(functools.partial(_per_op_two_views, recipe=recipe, out_size=out_size))
  doubled = jnp.concatenate([images, images])
  floor = jax.jit(functools.partial(augment.center_view, recipe=recipe, out_size=out_size))
  fns = {"ours": (ours, (key, images)), "per-op keys": (per_op, (key, images)),
         "floor": (floor, (doubled,))}
  compile_cpu = {name: _compile_seconds(fn, *args) for name, (fn, args) in fns.items()}
  median = _median_seconds(fns, repeats)
  print(f"\nrecipe={recipe} B={batch} {image_size}->{out_size} ({2 * batch} views), "
        f"{jax.devices()[0].platform}, median of {repeats}")
  print(f"{'':12s} {'1st call cpu s':>14s} {'run ms':>9s} {'views/s':>9s} {'run / ours':>11s}")
  for name in fns:
    print(f"{name:12s} {compile_cpu[name]:14.2f} {1e3 * median[name]:9.1f} "
          f"{2 * batch / median[name]:9.0f} {median[name] / median['ours']:11.2f}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  batch = 32 if args.quick else 256
  run("simclr", batch, 160, 128, args.repeats)
  run("simclr_cifar", batch, 32, 32, args.repeats)


if __name__ == "__main__":
  main()
