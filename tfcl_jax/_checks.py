"""Argument checks shared by the public functions: clear errors that name the argument."""

from __future__ import annotations

import math
import numbers

import jax
import jax.core
import jax.numpy as jnp
import numpy as np


def is_concrete(x) -> bool:
  """True when `x` holds a value now (not a tracer inside jit/grad/vmap)."""
  return not isinstance(x, jax.core.Tracer)


def is_differentiated(x) -> bool:
  """True when `x` is a tracer of an autodiff transformation (`jax.grad`, `jax.vjp`, `jax.jvp`)
  at the current level: a tracer that carries a primal and a tangent. Under `jit`, `vmap` or
  `checkpoint` inside the differentiation the tracer at the top is theirs: False."""
  return isinstance(x, jax.core.Tracer) and hasattr(x, "primal") and hasattr(x, "tangent")


def positive_scalar(value, *, name: str):
  """Checks that a hyperparameter is a positive real scalar when it is concrete.

  Traced values (inside `jit`, `grad`) pass through unchecked: their value is
  not known at trace time.
  """
  if isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be a real number, got a bool ({value!r}).")
  if isinstance(value, numbers.Real):
    if not math.isfinite(value) or value <= 0:
      raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
    return value
  if not is_concrete(value):
    return value
  array = np.asarray(value)
  if array.ndim != 0:
    raise ValueError(f"{name} must be a scalar, got shape {array.shape}.")
  if not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
    raise TypeError(f"{name} must be a real number, got dtype {array.dtype}.")
  if not np.isfinite(array) or array <= 0:
    raise ValueError(f"{name} must be a finite number > 0, got {array.item()!r}.")
  return value


def training_step(step, *, name: str = "step"):
  """Checks a training step: an integer scalar, `>= 0` where it is concrete (a traced step, the
  train state's inside `jit`, for its dtype and shape only), and returns it.

  Raises:
    TypeError: a bool, a float or another non-integer step.
    ValueError: not a scalar, or a concrete step below 0.
  """
  dtype = getattr(step, "dtype", None)
  if isinstance(step, (bool, np.bool_)) or (dtype is None and not isinstance(step, int)) or (
      dtype is not None and not jnp.issubdtype(dtype, jnp.integer)):
    raise TypeError(f"{name} must be an integer (the training step, e.g. the train state's "
                    f"step), got {step!r}.")
  if jnp.ndim(step) != 0:
    raise ValueError(f"{name} must be a scalar (the training step), got shape "
                     f"{jnp.shape(step)}.")
  if is_concrete(step) and int(np.asarray(step)) < 0:
    raise ValueError(f"{name} must be >= 0 (a schedule starts at step 0), got "
                     f"{int(np.asarray(step))}.")
  return step


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
  """Float32 at least: the dtype of the statistics and the loss for half-precision inputs."""
  return jnp.result_type(jnp.float32, *dtypes)


def one_of(value, allowed, *, name: str):
  if value not in allowed:
    raise ValueError(f"{name} must be one of {sorted(allowed)!r}, got {value!r}.")
  return value


# The analysis functions' arguments: arrays of C, tau, N, t that broadcast (Sections 3-4).


def _concrete_array(value, *, name: str):
  """The value as a NumPy array when it is known now, else None (a tracer)."""
  if isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be a real number or array, got a bool ({value!r}).")
  if isinstance(value, (str, bytes)) or value is None:
    raise TypeError(f"{name} must be a real number or array, got {type(value).__name__}.")
  if not is_concrete(value):
    return None
  array = np.asarray(value)
  if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
    raise TypeError(f"{name} must be real-valued, got dtype {array.dtype}.")
  return array


def cosine(C, *, name: str = "C", low_open: bool = False, high_open: bool = False) -> jax.Array:
  """C: a float (or floating array) in [-1, 1], with the ends excluded as asked."""
  if isinstance(C, numbers.Integral) or (
      hasattr(C, "dtype") and not jnp.issubdtype(C.dtype, jnp.floating)):
    raise TypeError(f"{name} must be a float or a floating array, got "
                    f"{getattr(C, 'dtype', type(C).__name__)}.")
  array = _concrete_array(C, name=name)
  if array is not None:
    if not np.issubdtype(array.dtype, np.floating):
      raise TypeError(f"{name} must be a float or a floating array, got dtype {array.dtype}.")
    low = array <= -1 if low_open else array < -1
    high = array >= 1 if high_open else array > 1
    if np.any(~np.isfinite(array) | low | high):
      interval = ("(" if low_open else "[") + "-1, 1" + (")" if high_open else "]")
      bad = array[~np.isfinite(array) | low | high].ravel()[0]
      raise ValueError(f"{name} must lie in {interval} (a cosine similarity), got {bad!r}.")
  return jnp.asarray(C)


def temperature(tau, *, name: str = "tau") -> jax.Array:
  array = _concrete_array(tau, name=name)
  if array is not None and np.any(~np.isfinite(array) | (array <= 0)):
    bad = array[~np.isfinite(array) | (array <= 0)].ravel()[0]
    raise ValueError(f"{name} must be finite and > 0, got {bad!r}.")
  return jnp.asarray(tau)


def count(N, *, name: str = "N") -> jax.Array:
  array = _concrete_array(N, name=name)
  if array is not None:
    if not np.issubdtype(array.dtype, np.integer):
      raise TypeError(f"{name} (number of candidates) must be an integer, got dtype {array.dtype}.")
    if np.any(array < 2):
      raise ValueError(f"{name} must be >= 2 (one positive and at least one negative), got "
                       f"{array[array < 2].ravel()[0]!r}.")
  return jnp.asarray(N)


def static_count(N, *, name: str = "N") -> int:
  """N as a Python int >= 2: it fixes array shapes, so it cannot be traced."""
  if isinstance(N, (bool, np.bool_)) or not isinstance(N, (numbers.Integral, np.integer)):
    raise TypeError(f"{name} must be a Python int (it sets the number of candidates), got "
                    f"{type(N).__name__}.")
  if N < 2:
    raise ValueError(f"{name} must be >= 2 (one positive and at least one negative), got {N}.")
  return int(N)


def log_scale(t, *, name: str = "t") -> jax.Array:
  array = _concrete_array(t, name=name)
  if array is not None and np.any(~np.isfinite(array)):
    raise ValueError(f"{name} must be finite, got {array[~np.isfinite(array)].ravel()[0]!r}.")
  return jnp.asarray(t)


def float_dtype(*arrays) -> jnp.dtype:
  """float32 at least; float64 when an input is float64 under x64."""
  return compute_dtype(*(jnp.asarray(a).dtype for a in arrays))
