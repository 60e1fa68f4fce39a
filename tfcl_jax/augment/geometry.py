"""Geometric augmentations of one image `[H, W, C]` float: crops, flips, small affine warps.

Each random operation `random_X(key, ...)` draws `X_UNIFORMS` uniforms and calls
`X_from_uniforms(uniforms, ...)`; recipes draw one vector per view for all operations at once,
because every separate draw costs XLA another copy of the random-bit generator to compile.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# torchvision's RandomResizedCrop draws up to 10 boxes and keeps the first that fits.
_CROP_ATTEMPTS = 10
#: U(0, 1) draws one random resized crop takes (`crop_box_from_uniforms`).
CROP_UNIFORMS = 2 * _CROP_ATTEMPTS + 2
#: U(0, 1) draws one random horizontal flip takes (`flip_from_uniforms`).
FLIP_UNIFORMS = 1
#: U(0, 1) draws one random affine warp takes (`affine_from_uniforms`).
AFFINE_UNIFORMS = 7


def _between(uniforms: jax.Array, low: float, high: float) -> jax.Array:
  """Mappings U(0, 1) draws to U(low, high)."""
  return low + (high - low) * uniforms


def _triangle_weights(positions: jax.Array, size: int, half_width) -> jax.Array:
  """`[len(positions), size]` linear-interpolation weights of pixels `0..size-1` at `positions`.

  Pixel `i` sits at `i` (callers shift by 1/2); a triangle of half-width `half_width` (> 1 when
  shrinking: antialiasing, as `jax.image.scale_and_translate`).
  """
  distance = jnp.abs(positions[:, None] - jnp.arange(size, dtype=jnp.float32)[None, :])
  return jnp.maximum(0.0, 1.0 - distance / half_width)


def crop_and_resize(
    image: jax.typing.ArrayLike,
    *,
    top: jax.typing.ArrayLike,
    left: jax.typing.ArrayLike,
    height: jax.typing.ArrayLike,
    width: jax.typing.ArrayLike,
    out_size: int,
) -> jax.Array:
  r"""The box `image[top:top+height, left:left+width]` resized to `out_size x out_size`.

  Output pixel `o` samples the input at `top + (o + 1/2) height / out_size` (pixel centers at
  `i + 1/2`) with a triangle kernel of half-width `max(1, height / out_size)`, normalised:
  bilinear, antialiased when shrinking (as `jax.image.scale_and_translate`). The resize is two
  small matrix products `W_rows @ image @ W_cols^T`, so a traced box costs one compiled shape.

  Examples:
    >>> import jax.numpy as jnp
    >>> image = jnp.arange(16.0).reshape(4, 4, 1)
    >>> crop_and_resize(image, top=1, left=2, height=2, width=2, out_size=2)[..., 0].tolist()
    [[6.0, 7.0], [10.0, 11.0]]

  Args:
    image: `[H, W, C]` float.
    top, left, height, width: the box in pixels (scalars, may be traced).
    out_size: side of the output.

  Returns:
    `[out_size, out_size, C]` float32.
  """
  image = jnp.asarray(image, jnp.float32)
  grid = (jnp.arange(out_size, dtype=jnp.float32) + 0.5) / out_size

  def weights(start, extent, size):
    extent = jnp.asarray(extent, jnp.float32)
    half_width = jnp.maximum(extent / out_size, 1.0)
    w = _triangle_weights(start + grid * extent - 0.5, size, half_width)
    return w / jnp.sum(w, axis=1, keepdims=True)

  row_weights = weights(top, height, image.shape[0])
  column_weights = weights(left, width, image.shape[1])
  return jnp.einsum("oi,ijc,pj->opc", row_weights, image, column_weights,
                    precision=jax.lax.Precision.HIGHEST)


def crop_box_from_uniforms(
    uniforms: jax.Array,
    *,
    height: int,
    width: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> jax.Array:
  r"""torchvision's RandomResizedCrop box `(top, left, box_height, box_width)` from uniforms.

  Up to 10 draws of area fraction `U(scale)` and aspect `w / h = exp U(log ratio)`, sides rounded
  to integers; the first that fits, else the whole image (aspect clamped to `ratio`); uniform
  integer position.

  Examples:
    >>> import jax.numpy as jnp
    >>> crop_box_from_uniforms(jnp.full((CROP_UNIFORMS,), 0.5), height=32, width=32).tolist()
    [4, 4, 24, 24]

  Args:
    uniforms: `[CROP_UNIFORMS]` draws from U(0, 1).
    height, width: image size (static).
    scale: range of the box area as a fraction of the image area.
    ratio: range of the box aspect ratio `width / height`.

  Returns:
    int32 `[4]`: top, left, box height, box width.
  """
  area = height * width * _between(uniforms[:_CROP_ATTEMPTS], *scale)
  aspect = jnp.exp(_between(
      uniforms[_CROP_ATTEMPTS:2 * _CROP_ATTEMPTS], math.log(ratio[0]), math.log(ratio[1])))
  box_width = jnp.round(jnp.sqrt(area * aspect)).astype(jnp.int32)
  box_height = jnp.round(jnp.sqrt(area / aspect)).astype(jnp.int32)
  fits = (box_width > 0) & (box_width <= width) & (box_height > 0) & (box_height <= height)
  first = jnp.argmax(fits)
  fallback_height, fallback_width = _center_box_size(height, width, ratio)
  box_height = jnp.where(fits[first], box_height[first], fallback_height)
  box_width = jnp.where(fits[first], box_width[first], fallback_width)
  # Uniform integer position: floor(u * number of positions), u < 1.
  position = uniforms[2 * _CROP_ATTEMPTS:]
  top = jnp.floor(position[0] * (height - box_height + 1)).astype(jnp.int32)
  left = jnp.floor(position[1] * (width - box_width + 1)).astype(jnp.int32)
  return jnp.stack([top, left, box_height, box_width])


def _center_box_size(height: int, width: int, ratio: tuple[float, float]) -> tuple[int, int]:
  """The fallback box of RandomResizedCrop: the whole image, its aspect clamped to `ratio`."""
  if width / height < ratio[0]:
    return round(width / ratio[0]), width
  if width / height > ratio[1]:
    return height, round(height * ratio[1])
  return height, width


def resized_crop_from_uniforms(
    uniforms: jax.Array,
    image: jax.typing.ArrayLike,
    *,
    out_size: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> jax.Array:
  """SimCLR's random resized crop: the box `crop_box_from_uniforms`, resized by `crop_and_resize`.

  Args:
    uniforms: `[CROP_UNIFORMS]` draws from U(0, 1).
    image: `[H, W, C]` float.
    out_size: side of the output.
    scale, ratio: as `crop_box_from_uniforms`.

  Returns:
    `[out_size, out_size, C]` float32.
  """
  image = jnp.asarray(image, jnp.float32)
  top, left, box_height, box_width = crop_box_from_uniforms(
      uniforms, height=image.shape[0], width=image.shape[1], scale=scale, ratio=ratio)
  return crop_and_resize(
      image, top=top, left=left, height=box_height, width=box_width, out_size=out_size)


def random_resized_crop(key: jax.Array, image: jax.typing.ArrayLike, **options) -> jax.Array:
  """`resized_crop_from_uniforms` with its uniforms drawn from `key`; `options` its keywords.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> random_resized_crop(jax.random.key(0), jnp.zeros((40, 40, 3)), out_size=32).shape
    (32, 32, 3)
  """
  uniforms = jax.random.uniform(key, (CROP_UNIFORMS,))
  return resized_crop_from_uniforms(uniforms, image, **options)


def center_crop(image: jax.typing.ArrayLike, *, out_size: int) -> jax.Array:
  """The largest centered square of `image [H, W, C]`, resized to `[out_size, out_size, C]`.

  Examples:
    >>> import jax.numpy as jnp
    >>> center_crop(jnp.ones((6, 8, 1)), out_size=3).shape
    (3, 3, 1)
  """
  image = jnp.asarray(image, jnp.float32)
  height, width = image.shape[:2]
  side = min(height, width)
  top, left = (height - side) // 2, (width - side) // 2
  image = image[top:top + side, left:left + side]
  if side == out_size:
    return image
  return jax.image.resize(image, (out_size, out_size, image.shape[-1]), "linear", antialias=True)


def flip_from_uniforms(
    uniforms: jax.Array, image: jax.typing.ArrayLike, *, probability: float = 0.5) -> jax.Array:
  """`image [H, W, C]` mirrored left-right when `uniforms[0] < probability`."""
  image = jnp.asarray(image)
  return jnp.where(uniforms[0] < probability, image[:, ::-1], image)


def random_horizontal_flip(
    key: jax.Array, image: jax.typing.ArrayLike, **options) -> jax.Array:
  """`image [H, W, C]` mirrored left-right with probability `probability` (default 1/2).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> image = jnp.array([[[1.0], [2.0]]])
    >>> random_horizontal_flip(jax.random.key(0), image, probability=1.0)[..., 0].tolist()
    [[2.0, 1.0]]
  """
  return flip_from_uniforms(jax.random.uniform(key, (FLIP_UNIFORMS,)), image, **options)


def affine_warp(
    image: jax.typing.ArrayLike,
    *,
    center: jax.typing.ArrayLike,
    size: jax.typing.ArrayLike,
    angle: jax.typing.ArrayLike,
    out_size: int,
) -> jax.Array:
  r"""The box of `size = (height, width)` around `center`, rotated by `angle`, on an output grid.

  Output point `u in [-1/2, 1/2]^2` (pixel centers of an `out_size` grid) samples the input at
  `center + R(angle) diag(size) u` (row, column; input pixel centers at `i + 1/2`), bilinearly;
  outside the image reads 0 (the digits' background).

  Examples:
    >>> import jax.numpy as jnp
    >>> image = jnp.arange(4.0).reshape(2, 2, 1)
    >>> affine_warp(image, center=(1, 1), size=(2, 2), angle=jnp.pi / 2, out_size=2)[..., 0]
    Array([[2., 0.],
           [3., 1.]], dtype=float32)

  Args:
    image: `[H, W, C]` float.
    center: `(row, column)` of the box center, in pixels.
    size: `(height, width)` of the box, in pixels.
    angle: rotation in radians.
    out_size: side of the output.

  Returns:
    `[out_size, out_size, C]` float32.
  """
  image = jnp.asarray(image, jnp.float32)
  center = jnp.asarray(center, jnp.float32)
  size = jnp.asarray(size, jnp.float32)
  cos, sin = jnp.cos(angle), jnp.sin(angle)
  grid = (jnp.arange(out_size, dtype=jnp.float32) + 0.5) / out_size - 0.5
  u_row, u_col = jnp.meshgrid(grid * size[0], grid * size[1], indexing="ij")
  rows = (center[0] + cos * u_row - sin * u_col - 0.5).reshape(-1)
  cols = (center[1] + sin * u_row + cos * u_col - 0.5).reshape(-1)
  # Dense bilinear weights: tiny for 8x8 images, and one product instead of gathers.
  row_weights = _triangle_weights(rows, image.shape[0], 1.0)
  column_weights = _triangle_weights(cols, image.shape[1], 1.0)
  out = jnp.einsum("oi,oj,ijc->oc", row_weights, column_weights, image,
                   precision=jax.lax.Precision.HIGHEST)
  return out.reshape(out_size, out_size, image.shape[-1])


def affine_from_uniforms(
    uniforms: jax.Array,
    image: jax.typing.ArrayLike,
    *,
    out_size: int,
    scale: tuple[float, float] = (0.6, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    max_shift: float = 1.0,
    max_degrees: float = 15.0,
) -> jax.Array:
  r"""`affine_warp` with a random box, shift and rotation: a crop-resize for tiny images.

  Box area fraction `U(scale)` and aspect `exp U(log ratio)` (sides at most the image's), placed
  uniformly inside the image, shifted by `U(-max_shift, max_shift)^2` pixels and rotated by
  `U(-max_degrees, max_degrees)` degrees. Sub-pixel boxes suit 8x8 digits, where integer boxes
  (`crop_box_from_uniforms`) would allow only a handful of sizes.

  Args:
    uniforms: `[AFFINE_UNIFORMS]` draws from U(0, 1).
    image: `[H, W, C]` float.
    out_size: side of the output.
    scale: range of the box area as a fraction of the image area.
    ratio: range of the box aspect ratio `width / height`.
    max_shift: largest shift of the box, in pixels, along each axis.
    max_degrees: largest rotation, in degrees.

  Returns:
    `[out_size, out_size, C]` float32.
  """
  image = jnp.asarray(image, jnp.float32)
  extent = jnp.array(image.shape[:2], jnp.float32)
  area = _between(uniforms[0], *scale)
  aspect = jnp.exp(_between(uniforms[1], math.log(ratio[0]), math.log(ratio[1])))
  size = jnp.minimum(jnp.stack([jnp.sqrt(area / aspect), jnp.sqrt(area * aspect)]), 1.0) * extent
  shift = _between(uniforms[4:6], -max_shift, max_shift)
  center = size / 2 + uniforms[2:4] * (extent - size) + shift
  angle = jnp.deg2rad(_between(uniforms[6], -max_degrees, max_degrees))
  return affine_warp(image, center=center, size=size, angle=angle, out_size=out_size)
