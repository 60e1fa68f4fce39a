r"""Embedding geometry: alignment, uniformity (Wang & Isola 2020), tolerance (Wang & Liu 2021).

Each metric L2-normalises its inputs first, so it reads the hypersphere the loss sees.
"""

from __future__ import annotations

import numbers
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks, losses


def _unit_rows(z: jax.typing.ArrayLike, *, name: str) -> jax.Array:
  z = _checks.float_matrix(z, name=name)
  if z.shape[0] < 1:
    raise ValueError(f"{name} must have at least one row, got shape {z.shape}.")
  return losses.l2_normalize(z.astype(_checks.compute_dtype(z.dtype)))


def _check_exponent(value, *, name: str) -> float:
  if not isinstance(value, numbers.Real) or isinstance(value, bool):
    raise TypeError(f"{name} must be a real number, got {type(value).__name__}.")
  return cast(float, _checks.positive_scalar(value, name=name))  # any Real, returned as given


def alignment(
    z1: jax.typing.ArrayLike, z2: jax.typing.ArrayLike, *, alpha: float = 2.0
) -> jax.Array:
  r"""Alignment of positive pairs (Wang & Isola 2020).

  .. math:: \mathcal{L}_{align} = \mathbb{E}_{(x, y) \sim p_{pos}} \|f(x) - f(y)\|_2^\alpha

  with `f(x) = z1[i] / ||z1[i]||`, `f(y) = z2[i] / ||z2[i]||`. Lower is better
  aligned; it lies in `[0, 2^alpha]`. The squared distance is taken from the
  difference, not from `2 - 2 cos`, which would cancel for near-identical pairs.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.analysis import geometry
    >>> z1 = jnp.array([[1.0, 0.0], [0.0, 2.0]])
    >>> z2 = jnp.array([[0.0, 3.0], [0.0, 1.0]])
    >>> round(geometry.alignment(z1, z2).item(), 4)  # (2 + 0) / 2
    1.0

  Args:
    z1: `[N, D]` float embeddings of the first view.
    z2: `[N, D]` float embeddings of the second view; row `i` is the positive of `z1[i]`.
    alpha: exponent `> 0` (keyword-only), 2 by default as in Wang & Isola.

  Returns:
    A float32 (float64 under x64 inputs) scalar.

  References:
    Wang & Isola, Understanding Contrastive Representation Learning through
    Alignment and Uniformity on the Hypersphere, ICML 2020.
  """
  u1 = _unit_rows(z1, name="z1")
  u2 = _unit_rows(z2, name="z2")
  if u1.shape != u2.shape:
    raise ValueError(f"z1 and z2 must have the same shape [N, D], got {u1.shape} and {u2.shape}.")
  alpha = _check_exponent(alpha, name="alpha")
  squared = jnp.sum(jnp.square(u1 - u2), axis=-1)
  # d^alpha = (d^2)^(alpha/2); the where keeps the gradient finite at d = 0 for alpha < 2.
  positive = squared > 0
  powered = jnp.where(positive, jnp.where(positive, squared, 1.0) ** (alpha / 2), 0.0)
  return jnp.mean(powered)


def uniformity(z: jax.typing.ArrayLike, *, t: float = 2.0) -> jax.Array:
  r"""Uniformity of an embedding (Wang & Isola 2020).

  .. math:: \mathcal{L}_{uniform} = \log \mathbb{E}_{i \ne j} e^{-t \|f(x_i) - f(x_j)\|_2^2}

  over all ordered pairs of distinct rows (the same value as over unordered
  pairs). Lower is more uniform; it lies in `[-4t, 0]`. Computed as a
  `logsumexp` of `-t (2 - 2 cos)` so that it stays finite where every term
  underflows (large `t`, spread-out points). Memory O(N^2).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.analysis import geometry
    >>> antipodal = jnp.array([[1.0, 0.0], [-1.0, 0.0]])
    >>> geometry.uniformity(antipodal).item()  # log e^{-2 * 4}
    -8.0

  Args:
    z: `[N, D]` float embeddings, `N >= 2`.
    t: scale `> 0` (keyword-only), 2 by default as in Wang & Isola.

  Returns:
    A float32 (float64 under x64 inputs) scalar.

  References:
    Wang & Isola, ICML 2020.
  """
  u = _unit_rows(z, name="z")
  n = u.shape[0]
  if n < 2:
    raise ValueError(f"z needs N >= 2 rows to have a pair, got N = {n}.")
  t = _check_exponent(t, name="t")
  squared = jnp.maximum(2.0 - 2.0 * (u @ u.T), 0.0)
  distinct = ~jnp.eye(n, dtype=bool)
  exponents = jnp.where(distinct, -t * squared, -jnp.inf)
  return jax.nn.logsumexp(exponents) - jnp.log(jnp.asarray(n * (n - 1), u.dtype))


def tolerance(z: jax.typing.ArrayLike, labels: jax.typing.ArrayLike) -> jax.Array:
  r"""Tolerance to semantically similar samples (Wang & Liu 2021).

  .. math:: T = \mathbb{E}_{i \ne j,\; y_i = y_j} \cos(f(x_i), f(x_j))

  the mean cosine similarity over ordered pairs of distinct rows that share a
  label. Higher means same-class samples sit closer together; it lies in `[-1, 1]`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.analysis import geometry
    >>> z = jnp.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    >>> labels = jnp.array([0, 0, 1])
    >>> round(geometry.tolerance(z, labels).item(), 4)  # cos 45 degrees
    0.7071

  Args:
    z: `[N, D]` float embeddings.
    labels: `[N]` integer labels.

  Returns:
    A float32 (float64 under x64 inputs) scalar. Concrete labels with no
    same-label pair raise `ValueError`; under `jit` such labels give 0.

  References:
    Wang & Liu, Understanding the Behaviour of Contrastive Loss, CVPR 2021.
  """
  u = _unit_rows(z, name="z")
  n = u.shape[0]
  labels = jnp.asarray(labels)
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise TypeError(f"labels must have an integer dtype, got {labels.dtype}.")
  if labels.shape != (n,):
    raise ValueError(f"labels must have shape [N] = ({n},), got {labels.shape}.")
  same = (labels[:, None] == labels[None, :]) & ~jnp.eye(n, dtype=bool)
  if _checks.is_concrete(labels) and not bool(np.any(np.asarray(same))):
    raise ValueError("labels must contain at least one same-label pair (two equal labels).")
  cos = u @ u.T
  return jnp.sum(jnp.where(same, cos, 0.0)) / jnp.maximum(jnp.sum(same), 1).astype(u.dtype)
