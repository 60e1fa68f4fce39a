"""Argument checks for the analysis functions: arrays of C, tau, N, t that broadcast."""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks


def _concrete_array(value, *, name: str):
  """The value as a NumPy array when it is known now, else None (a tracer)."""
  if isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be a real number or array, got a bool ({value!r}).")
  if isinstance(value, (str, bytes)) or value is None:
    raise TypeError(f"{name} must be a real number or array, got {type(value).__name__}.")
  if not _checks.is_concrete(value):
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
  return _checks.compute_dtype(*(jnp.asarray(a).dtype for a in arrays))
