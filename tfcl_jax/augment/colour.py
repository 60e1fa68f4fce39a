"""Colour augmentations of one RGB image `[H, W, 3]` float in [0, 1], torchvision semantics.

Colour jitter (brightness, contrast, saturation, hue in a random order) and random grayscale,
as in SimCLR (Chen et al., 2020, Appendix A). `random_X(key, ...)` draws `X_UNIFORMS`
uniforms and calls `X_from_uniforms` (see `geometry` for why).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# ITU-R 601 luma, as torchvision's rgb_to_grayscale.
_LUMA = (0.299, 0.587, 0.114)
#: U(0, 1) draws one colour jitter takes (`colour_jitter_from_uniforms`).
JITTER_UNIFORMS = 9
#: U(0, 1) draws one random grayscale takes (`grayscale_from_uniforms`), apply or not.
GRAYSCALE_UNIFORMS = 1


def grayscale(image: jax.typing.ArrayLike) -> jax.Array:
  """Luma `0.299 R + 0.587 G + 0.114 B` of `image [H, W, 3]`, repeated on 3 channels.

  Examples:
    >>> import jax.numpy as jnp
    >>> grayscale(jnp.array([[[1.0, 0.0, 0.0]]])).tolist()
    [[[0.29899999499320984, 0.29899999499320984, 0.29899999499320984]]]
  """
  image = jnp.asarray(image, jnp.float32)
  luma = image @ jnp.asarray(_LUMA, jnp.float32)
  return jnp.repeat(luma[..., None], 3, axis=-1)


def rgb_to_hsv(image: jax.typing.ArrayLike) -> jax.Array:
  """Hue, saturation, value in [0, 1] of `image [..., 3]` RGB in [0, 1] (hue 0 for greys).

  Examples:
    >>> import jax.numpy as jnp
    >>> rgb_to_hsv(jnp.array([0.0, 0.5, 1.0])).tolist()
    [0.5833333134651184, 1.0, 1.0]
  """
  image = jnp.asarray(image, jnp.float32)
  red, green, blue = image[..., 0], image[..., 1], image[..., 2]
  value = jnp.max(image, axis=-1)
  chroma = value - jnp.min(image, axis=-1)
  # Greys (chroma 0) and black (value 0) would divide by zero: give them hue and saturation 0.
  safe_chroma = jnp.where(chroma > 0, chroma, 1.0)
  saturation = jnp.where(value > 0, chroma / jnp.where(value > 0, value, 1.0), 0.0)
  hue = jnp.where(
      value == red, jnp.mod((green - blue) / safe_chroma, 6.0),
      jnp.where(value == green, (blue - red) / safe_chroma + 2.0,
                (red - green) / safe_chroma + 4.0))
  hue = jnp.where(chroma > 0, hue / 6.0, 0.0)
  return jnp.stack([hue, saturation, value], axis=-1)


def hsv_to_rgb(image: jax.typing.ArrayLike) -> jax.Array:
  """RGB of `image [..., 3]` HSV in [0, 1]: channel n is `v - v s clip(min(k, 4 - k), 0, 1)`.

  with `k = (n + 6 h) mod 6` and `n = 5, 3, 1` for R, G, B.

  Examples:
    >>> import jax.numpy as jnp
    >>> [round(x, 4) for x in hsv_to_rgb(jnp.array([0.5833333, 1.0, 1.0])).tolist()]
    [0.0, 0.5, 1.0]
  """
  image = jnp.asarray(image, jnp.float32)
  hue, saturation, value = image[..., 0:1], image[..., 1:2], image[..., 2:3]
  k = jnp.mod(jnp.asarray([5.0, 3.0, 1.0]) + 6.0 * hue, 6.0)
  return value - value * saturation * jnp.clip(jnp.minimum(k, 4.0 - k), 0.0, 1.0)


def adjust_brightness(image: jax.Array, factor: jax.typing.ArrayLike) -> jax.Array:
  """`clip(factor * image, 0, 1)`."""
  return jnp.clip(image * factor, 0.0, 1.0)


def adjust_contrast(image: jax.Array, factor: jax.typing.ArrayLike) -> jax.Array:
  """Blend with the image's mean luma: `clip(factor * image + (1 - factor) * mean, 0, 1)`."""
  mean = jnp.mean(image @ jnp.asarray(_LUMA, jnp.float32))
  return jnp.clip(factor * image + (1.0 - factor) * mean, 0.0, 1.0)


def adjust_saturation(image: jax.Array, factor: jax.typing.ArrayLike) -> jax.Array:
  """Blend with the grayscale image: `clip(factor * image + (1 - factor) * gray, 0, 1)`."""
  return jnp.clip(factor * image + (1.0 - factor) * grayscale(image), 0.0, 1.0)


def adjust_hue(image: jax.Array, delta: jax.typing.ArrayLike) -> jax.Array:
  """Hue rotated by `delta` turns (in [-0.5, 0.5]) in HSV space; saturation and value kept.

  Examples:
    >>> import jax.numpy as jnp
    >>> [round(x, 4) for x in adjust_hue(jnp.array([[[1.0, 0.0, 0.0]]]), 1 / 3)[0, 0].tolist()]
    [0.0, 1.0, 0.0]
  """
  hsv = rgb_to_hsv(image)
  hue = jnp.mod(hsv[..., 0] + delta, 1.0)
  return hsv_to_rgb(jnp.stack([hue, hsv[..., 1], hsv[..., 2]], axis=-1))


def colour_jitter_from_uniforms(
    uniforms: jax.Array,
    image: jax.typing.ArrayLike,
    *,
    brightness: float = 0.4,
    contrast: float = 0.4,
    saturation: float = 0.4,
    hue: float = 0.1,
    probability: float = 0.8,
) -> jax.Array:
  """torchvision's ColorJitter, applied with probability `probability`.

  Factors `U(1 - s, 1 + s)` for brightness, contrast and saturation, hue shift `U(-hue, hue)`,
  the four applied in a random order. Under `vmap` the switch becomes a select, so each of the
  four steps computes all four operations.

  Examples:
    >>> import jax.numpy as jnp
    >>> uniforms = jnp.array([0.0, 1.0, 0.5, 0.5, 0.5, 0.1, 0.2, 0.3, 0.4])
    >>> colour_jitter_from_uniforms(uniforms, jnp.full((1, 1, 3), 0.5))[0, 0].tolist()
    [0.699999988079071, 0.699999988079071, 0.699999988079071]

  Args:
    uniforms: `[JITTER_UNIFORMS]` draws from U(0, 1): `[0]` apply or not, `[1:5]` the four
      factors, the order of `[5:9]` the order of the operations.
    image: `[H, W, 3]` float in [0, 1].
    brightness, contrast, saturation: strengths `s` (factors in `[1 - s, 1 + s]`).
    hue: maximal hue shift in turns (at most 0.5).
    probability: chance of applying the jitter at all.

  Returns:
    `[H, W, 3]` float32 in [0, 1].
  """
  image = jnp.asarray(image, jnp.float32)
  low = jnp.asarray([1 - brightness, 1 - contrast, 1 - saturation, -hue], jnp.float32)
  high = jnp.asarray([1 + brightness, 1 + contrast, 1 + saturation, hue], jnp.float32)
  factors = low + (high - low) * uniforms[1:5]
  order = jnp.argsort(uniforms[5:9])
  operations = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)
  branches = [lambda x, i=i, op=op: op(x, factors[i]) for i, op in enumerate(operations)]
  # A loop, not four unrolled switches: one copy of each branch keeps compile time down.
  jittered = jax.lax.fori_loop(
      0, 4, lambda step, x: jax.lax.switch(order[step], branches, x), image)
  return jnp.where(uniforms[0] < probability, jittered, image)


def random_colour_jitter(key: jax.Array, image: jax.typing.ArrayLike, **options) -> jax.Array:
  """`colour_jitter_from_uniforms` with its uniforms drawn from `key`; `options` its keywords.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> out = random_colour_jitter(jax.random.key(0), jnp.full((4, 4, 3), 0.5))
    >>> out.shape, bool((out >= 0).all() & (out <= 1).all())
    ((4, 4, 3), True)
  """
  uniforms = jax.random.uniform(key, (JITTER_UNIFORMS,))
  return colour_jitter_from_uniforms(uniforms, image, **options)


def grayscale_from_uniforms(
    uniforms: jax.Array, image: jax.typing.ArrayLike, *, probability: float = 0.2) -> jax.Array:
  """`grayscale(image)` when `uniforms[0] < probability`, else `image [H, W, 3]`."""
  image = jnp.asarray(image, jnp.float32)
  return jnp.where(uniforms[0] < probability, grayscale(image), image)


def random_grayscale(key: jax.Array, image: jax.typing.ArrayLike, **options) -> jax.Array:
  """`grayscale(image)` with probability `probability` (default 0.2), else `image`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> out = random_grayscale(jax.random.key(0), jnp.eye(3)[None], probability=1.0)
    >>> bool((out[..., 0] == out[..., 2]).all())
    True
  """
  uniforms = jax.random.uniform(key, (GRAYSCALE_UNIFORMS,))
  return grayscale_from_uniforms(uniforms, image, **options)
