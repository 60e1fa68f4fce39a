"""Gaussian blur of one image `[H, W, C]` with a per-example (traced) sigma, as in SimCLR.

Separable: two 1-D passes as sums of shifted copies, so a traced sigma and `vmap` cost no more
than a fixed one.
"""

from __future__ import annotations

from typing import cast

import jax
import jax.numpy as jnp

#: U(0, 1) draws one blur takes (`blur_from_uniforms`), apply or not and sigma.
BLUR_UNIFORMS = 2


def blur_kernel_size(image_size: int) -> int:
  """SimCLR's kernel: about 10% of the image side, made odd (`2 * (size // 20) + 1`).

  Examples:
    >>> blur_kernel_size(128), blur_kernel_size(96), blur_kernel_size(224)
    (13, 9, 23)
  """
  return 2 * ((image_size // 10) // 2) + 1


def gaussian_blur(
    image: jax.typing.ArrayLike, *, sigma: jax.typing.ArrayLike, kernel_size: int) -> jax.Array:
  r"""`image [H, W, C]` convolved with a normalised Gaussian of std `sigma` pixels.

  Weights `w_k ~ exp(-k^2 / (2 sigma^2))` for `k = -r..r` (`kernel_size = 2r + 1`), normalised
  to sum 1; borders reflect without repeating the edge (torchvision's "reflect" padding).

  Examples:
    >>> import jax.numpy as jnp
    >>> flat = jnp.full((5, 5, 1), 0.25)
    >>> bool(jnp.allclose(gaussian_blur(flat, sigma=1.0, kernel_size=3), flat))
    True

  Args:
    image: `[H, W, C]` float; H and W must exceed `kernel_size // 2`.
    sigma: blur std in pixels (> 0; may be traced).
    kernel_size: odd kernel side (static).

  Returns:
    `[H, W, C]` float32.
  """
  if kernel_size % 2 != 1:
    raise ValueError(f"kernel_size must be odd, got {kernel_size}.")
  image = jnp.asarray(image, jnp.float32)
  radius = kernel_size // 2
  if radius >= min(image.shape[:2]):
    raise ValueError(
        f"kernel_size = {kernel_size} is too large for an image of shape {image.shape}.")
  offsets = jnp.arange(-radius, radius + 1, dtype=jnp.float32)
  weights = jnp.exp(-0.5 * (offsets / sigma) ** 2)
  weights = weights / jnp.sum(weights)
  for axis in (0, 1):
    padding = [(0, 0)] * image.ndim
    padding[axis] = (radius, radius)
    padded = jnp.pad(image, padding, mode="reflect")
    length = image.shape[axis]
    image = cast(jax.Array, sum(  # kernel_size >= 1 terms: never the empty sum's 0
        weights[k] * jax.lax.slice_in_dim(padded, k, k + length, axis=axis)
        for k in range(kernel_size)))
  return image


def blur_from_uniforms(
    uniforms: jax.Array,
    image: jax.typing.ArrayLike,
    *,
    kernel_size: int,
    sigma: tuple[float, float] = (0.1, 2.0),
    probability: float = 0.5,
) -> jax.Array:
  """`gaussian_blur` with `sigma ~ U(sigma)`, applied with probability `probability`.

  Args:
    uniforms: `[BLUR_UNIFORMS]` draws from U(0, 1): apply or not, sigma.
    image: `[H, W, C]` float.
    kernel_size: odd kernel side (static), e.g. `blur_kernel_size(H)`.
    sigma: range of the blur std in pixels.
    probability: chance of blurring.

  Returns:
    `[H, W, C]` float32.
  """
  image = jnp.asarray(image, jnp.float32)
  std = sigma[0] + (sigma[1] - sigma[0]) * uniforms[1]
  blurred = gaussian_blur(image, sigma=std, kernel_size=kernel_size)
  return jnp.where(uniforms[0] < probability, blurred, image)


def random_gaussian_blur(key: jax.Array, image: jax.typing.ArrayLike, **options) -> jax.Array:
  """`blur_from_uniforms` with its uniforms drawn from `key`; `options` are its keywords.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> random_gaussian_blur(jax.random.key(0), jnp.zeros((16, 16, 3)), kernel_size=3).shape
    (16, 16, 3)
  """
  return blur_from_uniforms(jax.random.uniform(key, (BLUR_UNIFORMS,)), image, **options)
