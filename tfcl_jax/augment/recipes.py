"""Augmentation recipes and the batched entry points: two random views per image, one eval view.

Runs on the device: uint8 batches in, normalised float32 views out, per-example keys via vmap.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks
from tfcl_jax.augment import blur, colour, geometry, signal

# LightlySSL's (and torchvision's) ImageNet statistics, used by the paper's SimCLR recipes.
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
# Mean and std of all 1797 digits images, scaled to [0, 1].
_DIGITS_MEAN = (0.3053,)
_DIGITS_STD = (0.3759,)


@dataclasses.dataclass(frozen=True)
class Recipe:
  """One augmentation recipe.

  Attributes:
    name: the recipe's name in `RECIPES`.
    view: `(uniforms [n], image [H, W, C] float in [0, 1], out_size) -> [out_size, out_size, C]`,
      all randomness taken from the U(0, 1) draws `uniforms`.
    num_uniforms: `(out_size, channels) -> n`, the draws one view needs.
    mean, std: per-channel statistics; views are returned as `(x - mean) / std`.
    channels: number of channels the recipe needs (`None`: any).
    spatial_dims: 2 for images `[H, W, C]`, 1 for signals `[L, C]`.
    center: `(example, out_size=...) -> view`, the evaluation view before normalisation.
  """

  name: str
  view: Callable[..., jax.Array]
  num_uniforms: Callable[[int, int], int]
  mean: tuple[float, ...]
  std: tuple[float, ...]
  channels: int | None
  spatial_dims: int = 2
  center: Callable[..., jax.Array] = geometry.center_crop


def _split(uniforms: jax.Array, counts: tuple[int, ...]) -> list[jax.Array]:
  bounds = np.cumsum((0,) + counts)
  return [uniforms[start:stop] for start, stop in zip(bounds[:-1], bounds[1:], strict=True)]


_SIMCLR_COUNTS = (geometry.CROP_UNIFORMS, geometry.FLIP_UNIFORMS, colour.JITTER_UNIFORMS,
                  colour.GRAYSCALE_UNIFORMS, blur.BLUR_UNIFORMS)


def _simclr_view(uniforms: jax.Array, image: jax.Array, out_size: int, *, with_blur: bool):
  """SimCLR (Chen et al., 2020, Appendix A) with LightlySSL's Imagenette strengths."""
  crop_u, flip_u, jitter_u, gray_u, blur_u = _split(uniforms, _SIMCLR_COUNTS)
  view = geometry.resized_crop_from_uniforms(crop_u, image, out_size=out_size, scale=(0.08, 1.0))
  view = geometry.flip_from_uniforms(flip_u, view, probability=0.5)
  view = colour.colour_jitter_from_uniforms(
      jitter_u, view, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, probability=0.8)
  view = colour.grayscale_from_uniforms(gray_u, view, probability=0.2)
  if with_blur:
    view = blur.blur_from_uniforms(
        blur_u, view, kernel_size=blur.blur_kernel_size(out_size), sigma=(0.1, 2.0),
        probability=0.5)
  return jnp.clip(view, 0.0, 1.0)


def _digits_view(uniforms: jax.Array, image: jax.Array, out_size: int):
  """Small affine warp plus pixel noise; no flips or colour (digits are grey, not symmetric)."""
  warp_u, noise_u = _split(uniforms, (geometry.AFFINE_UNIFORMS, uniforms.size - 7))
  view = geometry.affine_from_uniforms(
      warp_u, image, out_size=out_size, scale=(0.6, 1.0), max_shift=1.0, max_degrees=15.0)
  # Standard normal noise by inverting the normal CDF (clipped away from 0 and 1).
  noise = jax.scipy.special.ndtri(jnp.clip(noise_u, 1e-6, 1 - 1e-6)).reshape(view.shape)
  return jnp.clip(view + 0.05 * noise, 0.0, 1.0)


_simclr_uniforms = lambda out_size, channels: sum(_SIMCLR_COUNTS)
_digits_uniforms = lambda out_size, channels: geometry.AFFINE_UNIFORMS + out_size**2 * channels

#: Every recipe by its name (`Recipe.name`), as `two_views` and `center_view` take it.
RECIPES: dict[str, Recipe] = {
    "simclr": Recipe(
        "simclr", functools.partial(_simclr_view, with_blur=True), _simclr_uniforms,
        _IMAGENET_MEAN, _IMAGENET_STD, channels=3),
    # SimCLR's CIFAR-10 recipe drops the blur: at 32 pixels it removes too much.
    "simclr_cifar": Recipe(
        "simclr_cifar", functools.partial(_simclr_view, with_blur=False), _simclr_uniforms,
        _IMAGENET_MEAN, _IMAGENET_STD, channels=3),
    "digits": Recipe(
        "digits", _digits_view, _digits_uniforms, _DIGITS_MEAN, _DIGITS_STD, channels=None),
    # MNIST-1D's signals are already standardised (mean 0, std 1) by their generator.
    "mnist1d": Recipe(
        "mnist1d", signal.mnist1d_view, signal.mnist1d_uniforms, (0.0,), (1.0,), channels=1,
        spatial_dims=1, center=signal.center_signal),
}


def _check_recipe(recipe) -> Recipe:
  if recipe not in RECIPES:
    raise ValueError(f"Unknown recipe {recipe!r}; known recipes: {sorted(RECIPES)}.")
  return RECIPES[recipe]


def _check_images(images, recipe: Recipe) -> jax.Array:
  dtype = getattr(images, "dtype", None)
  images = jnp.asarray(images) if dtype is None else images
  dtype = np.dtype(images.dtype)
  if dtype != np.uint8 and not np.issubdtype(dtype, np.floating):
    raise TypeError(
        f"images must be uint8 (0..255) or floating (0..1), got dtype {dtype}.")
  if images.ndim != recipe.spatial_dims + 2:
    layout = "[B, H, W, C]" if recipe.spatial_dims == 2 else "[B, L, C]"
    raise ValueError(f"images must have rank {recipe.spatial_dims + 2} ({layout}) for recipe "
                     f"{recipe.name!r}, got shape {images.shape}.")
  if recipe.channels is not None and images.shape[-1] != recipe.channels:
    raise ValueError(
        f"images must have {recipe.channels} channels for recipe {recipe.name!r}, got shape "
        f"{images.shape}.")
  return images


def _check_out_size(out_size, images) -> int:
  if out_size is None:
    return int(images.shape[1])
  return _checks.positive_int(out_size, name="out_size (or None)")


def _check_key(key) -> jax.Array:
  dtype = getattr(key, "dtype", None)
  if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
    return key
  if dtype == jnp.uint32 and jnp.shape(key) == (2,):
    return key
  raise TypeError(f"key must be a PRNG key (jax.random.key(seed)), got {key!r:.80}.")


def _to_unit_float(images: jax.Array) -> jax.Array:
  if images.dtype == jnp.uint8:
    return images.astype(jnp.float32) / 255.0
  return images.astype(jnp.float32)


def _normalize(views: jax.Array, recipe: Recipe) -> jax.Array:
  mean = jnp.asarray(recipe.mean, jnp.float32)
  std = jnp.asarray(recipe.std, jnp.float32)
  return (views - mean) / std


def _shard_like_batch(x: jax.Array, images: jax.Array) -> jax.Array:
  """Under an explicit-sharding mesh, splits `x`'s leading axis as `images`' batch axis.

  `vmap` over both needs their mapped axes sharded alike; with automatic sharding (or none)
  the compiler propagates the batch sharding itself and `x` is returned as is.
  """
  spec = getattr(jax.typeof(images).sharding, "spec", None)
  if spec and spec[0] is not None:
    return jax.sharding.reshard(x, jax.sharding.PartitionSpec(spec[0]))
  return x


@functools.partial(jax.jit, static_argnames=("recipe_name", "out_size"))
def _two_views(key, images, recipe_name: str, out_size: int):
  recipe = RECIPES[recipe_name]
  # Per-view keys, then one vector of uniforms per view: a single random-bit generator to compile.
  keys = jax.random.split(key, (images.shape[0], 2))
  count = recipe.num_uniforms(out_size, images.shape[-1])
  uniforms = jax.vmap(jax.vmap(lambda view_key: jax.random.uniform(view_key, (count,))))(keys)
  uniforms = _shard_like_batch(uniforms, images)
  view = functools.partial(recipe.view, out_size=out_size)
  # Batch outermost: a batch sharded over devices stays sharded, with no communication.
  pair = lambda image_uniforms, image: jax.vmap(view, in_axes=(0, None))(image_uniforms, image)
  views = _normalize(jax.vmap(pair)(uniforms, _to_unit_float(images)), recipe)
  return views[:, 0], views[:, 1]


def two_views(
    key: jax.Array,
    images: jax.typing.ArrayLike,
    *,
    recipe: str,
    out_size: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  r"""Two independent random views of every image, normalised: the positive pairs of Eq. 1.

  Every view of every image gets its own key (`jax.random.split(key, (B, 2))`, then `vmap`).
  Recipes (float images in [0, 1], then `(x - mean) / std` per channel):

  * `"simclr"`: random resized crop (area scale (0.08, 1), aspect (3/4, 4/3)) to `out_size`,
    horizontal flip p = 0.5, colour jitter (0.4, 0.4, 0.4, 0.1) p = 0.8 in random order,
    grayscale p = 0.2, Gaussian blur p = 0.5 (sigma in (0.1, 2), kernel ~10% of `out_size`);
    ImageNet mean/std (as LightlySSL, the paper's recipes).
  * `"simclr_cifar"`: the same without blur (SimCLR's CIFAR-10 recipe).
  * `"digits"`: one bilinear warp: crop area (0.6, 1), aspect (3/4, 4/3), shift +-1 pixel,
    rotation +-15 degrees (0 outside); then Gaussian pixel noise std 0.05. No flip (digits are not
    mirror-symmetric) and no colour (grey). Mean 0.3053, std 0.3759 (the 1797 digits).
  * `"mnist1d"`: signals `[B, L, 1]` (`augment.signal.mnist1d_view`): amplitude scale, circular
    shift up to +-8 samples, correlated and i.i.d. noise and shear as MNIST-1D's generator makes
    them; no normalisation (the signals are standardised).

  Examples:
    >>> import jax, numpy as np
    >>> images = np.zeros((4, 40, 40, 3), np.uint8)
    >>> view1, view2 = two_views(jax.random.key(0), images, recipe="simclr", out_size=32)
    >>> view1.shape, view1.dtype.name
    ((4, 32, 32, 3), 'float32')

  Args:
    key: PRNG key.
    images: `[B, H, W, C]` uint8 (0..255) or float (0..1); `C = 3` for the SimCLR recipes.
    recipe: "simclr", "simclr_cifar", "digits" or "mnist1d" (static under `jit`).
    out_size: side `S` of the views (static); `None` keeps `H` (pass e.g. 128 for Imagenette's
      160-pixel images, `tfcl_jax.data.get_info(name).view_size`).

  Returns:
    `(view1, view2)`, each `[B, S, S, C]` float32, normalised.

  References:
    Chen et al., "A Simple Framework for Contrastive Learning of Visual Representations",
    ICML 2020, Appendix A.
  """
  recipe_spec = _check_recipe(recipe)
  images = _check_images(images, recipe_spec)
  return _two_views(_check_key(key), images, recipe, _check_out_size(out_size, images))


@functools.partial(jax.jit, static_argnames=("recipe_name", "out_size"))
def _center_view(images, recipe_name: str, out_size: int):
  recipe = RECIPES[recipe_name]
  crop = functools.partial(recipe.center, out_size=out_size)
  return _normalize(jax.vmap(crop)(_to_unit_float(images)), recipe)


def center_view(
    images: jax.typing.ArrayLike, *, recipe: str, out_size: int | None = None) -> jax.Array:
  """The deterministic eval-time view: largest centered square, resized to `out_size`, normalised.

  Same normalisation as `two_views` with the same `recipe`. Imagenette's 160-pixel images give
  the whole image resized to 128 (LightlySSL's eval transform: resize 128, center crop 128).

  Examples:
    >>> import numpy as np
    >>> center_view(np.zeros((2, 8, 8, 1), np.uint8), recipe="digits").shape
    (2, 8, 8, 1)

  Args:
    images: `[B, H, W, C]` uint8 (0..255) or float (0..1).
    recipe: names the normalisation ("simclr", "simclr_cifar", "digits").
    out_size: side `S` of the view; `None` keeps `min(H, W)`.

  Returns:
    `[B, S, S, C]` float32, normalised.
  """
  recipe_spec = _check_recipe(recipe)
  images = _check_images(images, recipe_spec)
  if out_size is None:
    out_size = min(images.shape[1:1 + recipe_spec.spatial_dims])
  return _center_view(images, recipe, _check_out_size(out_size, images))
