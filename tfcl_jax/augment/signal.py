"""Views of 1-D signals: MNIST-1D's own transforms, in JAX, as augmentations.

`mnist1d.data.make_dataset` turns each digit template into an example by scaling, translating,
adding correlated and i.i.d. noise and shearing it (Greydanus 2020). `mnist1d_view` applies the
same kinds of transforms to a generated signal, with the randomness of one view taken from a
vector of U(0, 1) draws (`MNIST1D_UNIFORMS(length, channels)` of them), as every recipe of
`tfcl_jax.augment` does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

SCALE = 0.4  #: amplitude factor 1 + SCALE (u - 1/2), the generator's `scale_coeff`
MAX_SHIFT = 8  #: circular shift of up to +-8 of the 40 samples (a fifth of the signal)
CORR_NOISE = 0.25  #: the generator's `corr_noise_scale`, noise smoothed by a Gaussian of sigma 2
CORR_SIGMA = 2.0  #: the sigma of the Gaussian that smooths the correlated noise
IID_NOISE = 0.02  #: the generator's `iid_noise_scale`
SHEAR = 0.75  #: the generator's `shear_scale`; minus SHEAR (u - 1/2) times a ramp -1/2 .. 1/2


def mnist1d_uniforms(length: int, channels: int) -> int:
  """How many U(0, 1) draws one `mnist1d_view` of a `[length, channels]` signal takes."""
  return 3 + 2 * length * channels


def _gaussian_kernel(sigma: float) -> np.ndarray:
  radius = int(4 * sigma + 0.5)  # scipy.ndimage.gaussian_filter's default truncation
  x = np.arange(-radius, radius + 1, dtype=np.float64)
  kernel = np.exp(-0.5 * (x / sigma) ** 2)
  return (kernel / kernel.sum()).astype(np.float32)


def mnist1d_view(uniforms: jax.Array, signal: jax.Array, out_size: int) -> jax.Array:
  """One random view of `signal [L, C]`: scale, circular shift, correlated and i.i.d. noise, shear,
  then linear resampling to `[out_size, C]`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.augment import signal
    >>> u = jax.random.uniform(jax.random.key(0), (signal.mnist1d_uniforms(40, 1),))
    >>> signal.mnist1d_view(u, jnp.zeros((40, 1)), 40).shape
    (40, 1)
  """
  length, channels = signal.shape
  scale_u, shift_u, shear_u = uniforms[0], uniforms[1], uniforms[2]
  normals = jax.scipy.special.ndtri(jnp.clip(uniforms[3:], 1e-6, 1 - 1e-6))
  corr, iid = normals.reshape(2, length, channels)
  view = signal * (1.0 + SCALE * (scale_u - 0.5))
  shift = jnp.floor(shift_u * (2 * MAX_SHIFT + 1)).astype(jnp.int32) - MAX_SHIFT
  view = jnp.roll(view, shift, axis=0)
  kernel = jnp.asarray(_gaussian_kernel(CORR_SIGMA))
  smooth = jax.vmap(lambda x: jnp.convolve(x, kernel, mode="same"), in_axes=1, out_axes=1)
  view = view + CORR_NOISE * smooth(corr) + IID_NOISE * iid
  ramp = jnp.linspace(-0.5, 0.5, length)[:, None]
  view = view - SHEAR * (shear_u - 0.5) * ramp
  if out_size != length:
    view = jax.image.resize(view, (out_size, channels), "linear")
  return view


def center_signal(signal: jax.Array, *, out_size: int) -> jax.Array:
  """The evaluation view: the signal itself, linearly resampled to `out_size` if needed."""
  signal = jnp.asarray(signal, jnp.float32)
  if signal.shape[0] == out_size:
    return signal
  return jax.image.resize(signal, (out_size, signal.shape[-1]), "linear")
