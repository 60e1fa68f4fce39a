r"""Gradient and Langevin steps for embeddings living on the unit sphere S^(d-1).

Used by the studies that optimise embeddings directly (no network), as in the
Langevin-annealing analysis of InfoNCE: `dz = -grad V dt + sqrt(2 / beta(t)) dW` on the sphere.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks, losses


def random_sphere(key: jax.Array, shape: tuple[int, ...], *, dtype=jnp.float32) -> jax.Array:
  """Points drawn uniformly on the unit sphere along the last axis.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import langevin
    >>> z = langevin.random_sphere(jax.random.key(0), (4, 3))
    >>> bool(jnp.allclose(jnp.linalg.norm(z, axis=-1), 1.0, atol=1e-6))
    True

  Args:
    key: PRNG key.
    shape: output shape `[..., d]`, `d >= 2`.
    dtype: floating dtype of the result.

  Returns:
    `[..., d]` unit vectors (normalised in float32, then cast to `dtype`).
  """
  if len(shape) == 0 or shape[-1] < 2:
    raise ValueError(f"shape must end with a dimension d >= 2, got {shape!r}.")
  return losses.l2_normalize(jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def tangent(z: jax.typing.ArrayLike, v: jax.typing.ArrayLike) -> jax.Array:
  r"""Projection of `v` onto the tangent space of the sphere at `z`: `v - <v, z> z`.

  This is the Riemannian gradient when `v` is the Euclidean gradient at a unit `z`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax import langevin
    >>> langevin.tangent(jnp.array([1.0, 0.0]), jnp.array([3.0, 4.0])).tolist()
    [0.0, 4.0]

  Args:
    z: `[..., d]` unit vectors.
    v: `[..., d]` vectors, same shape as `z`.

  Returns:
    `[..., d]` tangent vectors, in the dtype of `v` (computed in float32 at least).
  """
  z, v = jnp.asarray(z), jnp.asarray(v)
  if z.shape != v.shape:
    raise ValueError(f"z and v must have the same shape, got {z.shape} and {v.shape}.")
  dtype = _checks.compute_dtype(z.dtype, v.dtype)
  z32, v32 = z.astype(dtype), v.astype(dtype)
  return (v32 - jnp.sum(v32 * z32, axis=-1, keepdims=True) * z32).astype(v.dtype)


def langevin_step(
    z: jax.typing.ArrayLike,
    gradient: jax.typing.ArrayLike,
    *,
    key: jax.Array | None,
    lr: jax.typing.ArrayLike,
    beta: jax.typing.ArrayLike = math.inf,
) -> jax.Array:
  r"""One projected Langevin step on the sphere (Euler-Maruyama with retraction).

  .. math:: z' = \frac{z - \eta\, P_z \nabla V + \sqrt{2\eta/\beta}\, P_z \xi}
                     {\lVert \cdot \rVert}, \qquad \xi \sim \mathcal N(0, I)

  `P_z` is `tangent`; dividing by the norm retracts onto the sphere. With
  `beta = inf` (or `key=None`) it is plain Riemannian gradient descent. Updates
  are computed in float32 at least and cast back to the dtype of `z`, so
  low-precision embeddings are stored, not just computed, in that precision.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import langevin
    >>> z = jnp.array([[1.0, 0.0]])
    >>> # V(z) = -z_2 pulls towards (0, 1): the step rotates z that way.
    >>> z = langevin.langevin_step(z, jnp.array([[0.0, -1.0]]), key=None, lr=0.1)
    >>> [round(float(x), 4) for x in z[0]]
    [0.995, 0.0995]
    >>> key = jax.random.key(0)
    >>> noisy = langevin.langevin_step(z, jnp.zeros_like(z), key=key, lr=0.1, beta=1.0)
    >>> round(float(jnp.linalg.norm(noisy)), 5)
    1.0

  Args:
    z: `[..., d]` float unit vectors.
    gradient: Euclidean gradient of the potential at `z`, same shape.
    key: PRNG key for the noise; `None` for no noise.
    lr: step size `eta` > 0.
    beta: inverse temperature of the noise, > 0; `inf` for no noise. May be
      traced (a schedule `beta(t)`).

  Returns:
    `[..., d]` unit vectors in the dtype of `z`.

  References:
    Roberts & Tweedie 1996 (Langevin diffusions); Langevin-based temperature
    annealing for InfoNCE (see `shared/papers/003`), Theorem 1.
  """
  z = jnp.asarray(z)
  if not jnp.issubdtype(z.dtype, jnp.floating):
    raise TypeError(f"z must have a floating dtype, got {z.dtype}.")
  gradient = jnp.asarray(gradient)
  if gradient.shape != z.shape:
    raise ValueError(f"gradient must have the shape of z {z.shape}, got {gradient.shape}.")
  _checks.positive_scalar(lr, name="lr")
  if _checks.is_concrete(beta) and not float(np.asarray(beta)) > 0:
    raise ValueError(f"beta must be > 0 (inf for no noise), got {beta!r}.")
  dtype = _checks.compute_dtype(z.dtype)
  z32 = z.astype(dtype)
  update = -jnp.asarray(lr, dtype) * gradient.astype(dtype)
  if key is not None:
    noise = jax.random.normal(key, z.shape, dtype)
    # beta = inf gives scale 0 (2 * lr / inf = 0), so one code path serves SGD too.
    update = update + jnp.sqrt(2.0 * jnp.asarray(lr, dtype) / jnp.asarray(beta, dtype)) * noise
  moved = z32 + tangent(z32, update)
  return losses.l2_normalize(moved).astype(z.dtype)
