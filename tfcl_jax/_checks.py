"""Argument checks shared by the public functions: clear errors that name the argument."""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x) -> bool:
  """True when `x` holds a value now (not a tracer inside jit/grad/vmap)."""
  return not isinstance(x, jax.core.Tracer)


def positive_scalar(value, *, name: str):
  """Checks that a hyperparameter is a positive real scalar when it is concrete.

  Traced values (inside `jit`, `grad`) pass through unchecked: their value is
  not known at trace time.
  """
  if isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be a real number, got a bool ({value!r}).")
  if isinstance(value, numbers.Number):
    if not np.isfinite(value) or value <= 0:
      raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
    return value
  if not is_concrete(value):
    return value
  array = np.asarray(value)
  if array.ndim != 0:
    raise ValueError(f"{name} must be a scalar, got shape {array.shape}.")
  if not np.issubdtype(array.dtype, np.number):
    raise TypeError(f"{name} must be a real number, got dtype {array.dtype}.")
  if not np.isfinite(array) or array <= 0:
    raise ValueError(f"{name} must be a finite number > 0, got {array.item()!r}.")
  return value


def positive_int(value, *, name: str, minimum: int = 1) -> int:
  """Checks that `value` is an int (not a bool) `>= minimum` and returns it as `int`."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{name} must be an int >= {minimum}, got {value!r}.")
  if value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")
  return int(value)


def float_matrix(x, *, name: str) -> jax.Array:
  """Checks that `x` is a rank-2 floating array and returns it as a `jax.Array`."""
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    x = jnp.asarray(x)
    dtype = x.dtype
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(
        f"{name} must have a floating dtype (float16, bfloat16, float32, float64), "
        f"got {dtype}."
    )
  if jnp.ndim(x) != 2:
    raise ValueError(f"{name} must have rank 2 ([N, D]), got shape {jnp.shape(x)}.")
  return jnp.asarray(x)


def compute_dtype(*dtypes) -> jnp.dtype:
  """Float32 at least: half-precision inputs are computed in float32."""
  return jnp.result_type(jnp.float32, *dtypes)


def one_of(value, allowed, *, name: str):
  if value not in allowed:
    raise ValueError(f"{name} must be one of {sorted(allowed)!r}, got {value!r}.")
  return value
