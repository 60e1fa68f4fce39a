"""tfcl_jax.augment: views, their randomness, and each building block against NumPy/SciPy."""

from __future__ import annotations

import colorsys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import ndimage

from tfcl_jax import augment
from tfcl_jax.augment import blur, colour, geometry

# One shape per recipe across the file, so that each recipe compiles once.
_RGB_SHAPE = (4, 24, 24, 3)
_DIGITS_SHAPE = (4, 8, 8, 1)
_CASES = [
    ("simclr", _RGB_SHAPE, 16), ("simclr_cifar", _RGB_SHAPE, 24), ("digits", _DIGITS_SHAPE, 8)]


def _images(shape, seed=0):
  return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _denormalize(views, recipe):
  spec = augment.RECIPES[recipe]
  return np.asarray(views) * np.asarray(spec.std) + np.asarray(spec.mean)


# The batched entry points.


@pytest.mark.parametrize("recipe, shape, out_size", _CASES)
def test_two_views_shapes_and_ranges(recipe, shape, out_size):
  view1, view2 = augment.two_views(
      jax.random.key(0), _images(shape), recipe=recipe, out_size=out_size)
  expected = (shape[0], out_size, out_size, shape[-1])
  chex.assert_shape([view1, view2], expected)
  chex.assert_type([view1, view2], jnp.float32)
  chex.assert_tree_all_finite((view1, view2))
  for view in (view1, view2):
    pixels = _denormalize(view, recipe)
    assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5


@pytest.mark.parametrize("recipe, shape, out_size", _CASES)
def test_identical_images_get_different_views(recipe, shape, out_size):
  same = np.repeat(_images(shape[1:])[None], shape[0], axis=0)
  view1, view2 = augment.two_views(jax.random.key(1), same, recipe=recipe, out_size=out_size)
  views = np.concatenate([view1, view2]).reshape(2 * shape[0], -1)
  distances = np.abs(views[:, None] - views[None]).max(-1)
  assert np.all(distances[~np.eye(len(views), dtype=bool)] > 1e-3)


@pytest.mark.parametrize("recipe, shape, out_size", _CASES)
def test_views_are_deterministic_for_a_key(recipe, shape, out_size):
  images = _images(shape)
  first = augment.two_views(jax.random.key(2), images, recipe=recipe, out_size=out_size)
  again = augment.two_views(jax.random.key(2), images, recipe=recipe, out_size=out_size)
  other = augment.two_views(jax.random.key(3), images, recipe=recipe, out_size=out_size)
  chex.assert_trees_all_equal(first, again)
  assert not np.allclose(first[0], other[0])


@pytest.mark.parametrize("axis_type", ["auto", "explicit"])
def test_two_views_keeps_a_sharded_batch_sharded(axis_type):
  from jax.sharding import AxisType, NamedSharding, PartitionSpec

  images = _images((8, 8, 8, 1))
  mesh = jax.make_mesh(
      (8,), ("batch",), axis_types=(AxisType.Auto if axis_type == "auto" else AxisType.Explicit,))
  sharded = jax.device_put(images, NamedSharding(mesh, PartitionSpec("batch")))
  jitted = jax.jit(augment.two_views, static_argnames=("recipe", "out_size"))
  with jax.set_mesh(mesh):
    views = jitted(jax.random.key(6), sharded, recipe="digits", out_size=8)
  for view in views:
    assert view.sharding.spec[0] == "batch"
  chex.assert_trees_all_close(
      views, augment.two_views(jax.random.key(6), images, recipe="digits", out_size=8), atol=1e-5)


def test_two_views_accepts_raw_keys_and_float_images():
  images = _images(_DIGITS_SHAPE)
  typed = augment.two_views(jax.random.key(5), images, recipe="digits", out_size=8)
  raw_and_float = augment.two_views(
      jax.random.PRNGKey(5), images.astype(np.float32) / 255, recipe="digits", out_size=8)
  chex.assert_trees_all_close(typed, raw_and_float, atol=1e-5)


@pytest.mark.parametrize("recipe, shape, out_size", _CASES)
def test_center_view_is_normalised_identity_at_full_size(recipe, shape, out_size):
  images = _images(shape)
  spec = augment.RECIPES[recipe]
  expected = (images / 255.0 - np.asarray(spec.mean)) / np.asarray(spec.std)
  np.testing.assert_allclose(augment.center_view(images, recipe=recipe), expected, atol=1e-5)


def test_center_view_resizes():
  view = augment.center_view(np.zeros((2, 20, 30, 3), np.uint8), recipe="simclr", out_size=16)
  chex.assert_shape(view, (2, 16, 16, 3))


@pytest.mark.parametrize("call, kwargs, error, message", [
    (augment.two_views, {"recipe": "byol"}, ValueError, "Unknown recipe 'byol'.*simclr"),
    (augment.center_view, {"recipe": "byol"}, ValueError, "Unknown recipe 'byol'"),
    (augment.two_views, {"recipe": "simclr", "images": np.zeros((4, 8, 8, 1), np.uint8)},
     ValueError, "3 channels"),
    (augment.two_views, {"recipe": "digits", "images": np.zeros((8, 8, 1), np.uint8)},
     ValueError, "rank 4"),
    (augment.two_views, {"recipe": "digits", "images": np.zeros((1, 8, 8, 1), np.int32)},
     TypeError, "uint8"),
    (augment.two_views, {"recipe": "digits", "out_size": 0}, ValueError, "out_size"),
    (augment.two_views, {"recipe": "digits", "key": 0}, TypeError, "key"),
])
def test_bad_input(call, kwargs, error, message):
  arguments = {"images": np.zeros(_DIGITS_SHAPE, np.uint8)} | kwargs
  if call is augment.two_views:
    arguments.setdefault("key", jax.random.key(0))
  with pytest.raises(error, match=message):
    call(**arguments)


def test_digits_statistics_match_the_data():
  from tfcl_jax import data

  pixels = np.concatenate([data.load_arrays("digits", s)[0] for s in ("train", "test")]) / 255
  spec = augment.RECIPES["digits"]
  np.testing.assert_allclose(spec.mean, [pixels.mean()], atol=1e-3)
  np.testing.assert_allclose(spec.std, [pixels.std()], atol=1e-3)


# Building blocks.


def test_flip_is_an_exact_mirror():
  image = np.random.default_rng(0).random((5, 7, 3)).astype(np.float32)
  flipped = geometry.flip_from_uniforms(np.array([0.3]), image, probability=0.5)
  np.testing.assert_array_equal(flipped, image[:, ::-1])
  kept = geometry.flip_from_uniforms(np.array([0.7]), image, probability=0.5)
  np.testing.assert_array_equal(kept, image)
  keys = jax.random.split(jax.random.key(1), 64)
  flip = jax.jit(jax.vmap(lambda k: geometry.random_horizontal_flip(k, image)))
  outputs = np.asarray(flip(keys))
  mirrored = [np.array_equal(out, image[:, ::-1]) for out in outputs]
  assert all(m or np.array_equal(out, image) for m, out in zip(mirrored, outputs, strict=True))
  assert 16 < sum(mirrored) < 48


def test_grayscale_matches_luma_and_has_equal_channels():
  image = np.random.default_rng(0).random((6, 6, 3)).astype(np.float32)
  gray = np.asarray(colour.grayscale_from_uniforms(np.array([0.1]), image, probability=0.2))
  luma = 0.299 * image[..., 0] + 0.587 * image[..., 1] + 0.114 * image[..., 2]
  for channel in range(3):
    np.testing.assert_allclose(gray[..., channel], luma, rtol=1e-6)
  np.testing.assert_array_equal(
      colour.grayscale_from_uniforms(np.array([0.3]), image, probability=0.2), image)


def test_hsv_round_trip_matches_colorsys():
  rgb = np.random.default_rng(0).random((200, 3)).astype(np.float32)
  rgb[:5] = [[0, 0, 0], [1, 1, 1], [0.5, 0.5, 0.5], [1, 0, 0], [0, 0, 1]]
  expected = np.array([colorsys.rgb_to_hsv(*pixel) for pixel in rgb])
  hsv = np.asarray(jax.jit(colour.rgb_to_hsv)(rgb))
  np.testing.assert_allclose(hsv, expected, atol=1e-5)
  np.testing.assert_allclose(jax.jit(colour.hsv_to_rgb)(hsv), rgb, atol=1e-5)


def test_adjust_hue_matches_colorsys():
  rgb = np.random.default_rng(1).random((4, 5, 3)).astype(np.float32)
  delta = 0.07
  expected = np.array([
      colorsys.hsv_to_rgb((h + delta) % 1.0, s, v)
      for h, s, v in (colorsys.rgb_to_hsv(*pixel) for pixel in rgb.reshape(-1, 3))])
  np.testing.assert_allclose(
      jax.jit(colour.adjust_hue)(rgb, delta).reshape(-1, 3), expected, atol=1e-5)


def test_contrast_and_saturation_match_torchvision_formulas():
  rgb = np.random.default_rng(2).random((4, 5, 3)).astype(np.float32)
  luma = rgb @ np.array([0.299, 0.587, 0.114])
  np.testing.assert_allclose(
      colour.adjust_contrast(jnp.asarray(rgb), 1.3),
      np.clip(1.3 * rgb - 0.3 * luma.mean(), 0, 1), atol=1e-6)
  np.testing.assert_allclose(
      colour.adjust_saturation(jnp.asarray(rgb), 0.6),
      np.clip(0.6 * rgb + 0.4 * luma[..., None], 0, 1), atol=1e-6)


def test_colour_jitter_keeps_range_and_changes_colours():
  image = np.random.default_rng(3).random((6, 6, 3)).astype(np.float32)
  keys = jax.random.split(jax.random.key(0), 32)
  jitter = jax.jit(jax.vmap(lambda k: colour.random_colour_jitter(k, image)))
  outputs = np.asarray(jitter(keys))
  assert outputs.min() >= 0 and outputs.max() <= 1
  unchanged = [np.array_equal(out, image) for out in outputs]
  assert 1 <= sum(unchanged) <= 16  # p = 0.8 of jittering: ~6 of 32 are left alone


def test_gaussian_blur_matches_scipy():
  image = np.random.default_rng(0).random((12, 10, 2)).astype(np.float32)
  sigma, kernel_size = 1.3, 7
  offsets = np.arange(-3, 4)
  weights = np.exp(-offsets**2 / (2 * sigma**2))
  weights /= weights.sum()
  # scipy's "mirror" reflects without repeating the edge, as torchvision's "reflect".
  expected = ndimage.correlate1d(image, weights, axis=0, mode="mirror")
  expected = ndimage.correlate1d(expected, weights, axis=1, mode="mirror")
  blurred = jax.jit(blur.gaussian_blur, static_argnames="kernel_size")(
      image, sigma=sigma, kernel_size=kernel_size)
  np.testing.assert_allclose(blurred, expected, atol=1e-6)
  with pytest.raises(ValueError, match="odd"):
    blur.gaussian_blur(image, sigma=1.0, kernel_size=4)


def test_crop_and_resize_is_an_exact_crop_at_scale_one():
  image = np.random.default_rng(0).random((10, 12, 3)).astype(np.float32)
  crop = jax.jit(geometry.crop_and_resize, static_argnames="out_size")
  np.testing.assert_allclose(
      crop(image, top=3, left=5, height=6, width=6, out_size=6), image[3:9, 5:11], atol=1e-6)
  # Shrinking and stretching: against JAX's own antialiased resampler.
  for top, left, height, width in [(1, 2, 9, 10), (2, 3, 4, 3)]:
    scale = np.array([6 / height, 6 / width])
    expected = jax.jit(jax.image.scale_and_translate, static_argnums=(1, 2, 5))(
        image, (6, 6, 3), (0, 1), scale, -np.array([top, left]) * scale, "linear")
    np.testing.assert_allclose(
        crop(image, top=top, left=left, height=height, width=width, out_size=6), expected,
        atol=1e-5)


def test_crop_boxes_follow_scale_and_ratio():
  uniforms = jax.random.uniform(jax.random.key(0), (500, geometry.CROP_UNIFORMS))
  boxes = np.asarray(jax.jit(jax.vmap(
      lambda u: geometry.crop_box_from_uniforms(u, height=64, width=48)))(uniforms))
  top, left, height, width = boxes.T
  assert np.all((top >= 0) & (left >= 0) & (top + height <= 64) & (left + width <= 48))
  # Rounding sides to integers moves area and aspect a little beyond the sampled ranges.
  area = height * width / (64 * 48)
  assert area.min() > 0.08 * 0.8 and area.max() <= 1.0
  aspect = width / height
  assert aspect.min() > 0.75 * 0.9 and aspect.max() < 4 / 3 * 1.1
  assert np.std(area) > 0.15 and len(np.unique(top)) > 20


def test_affine_warp_matches_scipy():
  image = np.random.default_rng(0).random((8, 8, 1)).astype(np.float32)
  warp = jax.jit(geometry.affine_warp, static_argnames="out_size")
  identity = warp(image, center=(4.0, 4.0), size=(8.0, 8.0), angle=0.0, out_size=8)
  np.testing.assert_allclose(identity, image, atol=1e-5)
  center, size, angle = np.array([3.6, 4.3]), np.array([6.0, 7.0]), 0.3
  out = warp(image, center=center, size=size, angle=angle, out_size=8)
  # Independent reference: output pixel centre -> input point, sampled by scipy (centres at i).
  u = (np.arange(8) + 0.5) / 8 - 0.5
  u_row, u_col = np.meshgrid(u * size[0], u * size[1], indexing="ij")
  rows = center[0] + np.cos(angle) * u_row - np.sin(angle) * u_col - 0.5
  cols = center[1] + np.sin(angle) * u_row + np.cos(angle) * u_col - 0.5
  expected = ndimage.map_coordinates(image[..., 0], [rows, cols], order=1, mode="grid-constant")
  np.testing.assert_allclose(out[..., 0], expected, atol=1e-5)


def test_affine_without_randomness_is_identity():
  image = np.random.default_rng(1).random((8, 8, 1)).astype(np.float32)
  uniforms = jax.random.uniform(jax.random.key(0), (geometry.AFFINE_UNIFORMS,))
  out = jax.jit(lambda u: geometry.affine_from_uniforms(
      u, image, out_size=8, scale=(1.0, 1.0), ratio=(1.0, 1.0), max_shift=0.0,
      max_degrees=0.0))(uniforms)
  np.testing.assert_allclose(out, image, atol=1e-5)


def test_building_blocks_vmap_like_a_loop():
  images = np.random.default_rng(0).random((3, 10, 12, 3)).astype(np.float32)
  boxes = np.array([[0, 0, 10, 12], [1, 2, 4, 3], [3, 1, 7, 9]])
  crop = jax.jit(geometry.crop_and_resize, static_argnames="out_size")
  batched = jax.jit(jax.vmap(lambda x, b: geometry.crop_and_resize(
      x, top=b[0], left=b[1], height=b[2], width=b[3], out_size=6)))(images, boxes)
  for image, (top, left, height, width), out in zip(images, boxes, batched, strict=True):
    expected = crop(image, top=top, left=left, height=height, width=width, out_size=6)
    np.testing.assert_allclose(out, expected, atol=1e-5)
