"""`MappingFunction`: the pure mapping inside a `Mapping` and what it declares to the losses
(closed forms, parameter checks, logit scale, its form in the fused kernels)."""

from __future__ import annotations

import abc
import collections.abc
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

#: A mapping's trainable scalars by name (`{"t": ...}`; empty for the fixed ones).
Params = collections.abc.Mapping[str, Any]

# Largest spread of logits, in nats, that a fixed shift may cover: `exp(f(c) - shift)` then
# stays above exp(-60) ~ 1e-26, far from float32's smallest normal (1e-38).
FIXED_SHIFT_RANGE = {4: 60.0, 8: 600.0}


class MappingFunction(abc.ABC):
  """The pure mapping inside a `Mapping`, `fn(cos, params, step) -> logits`, and what it declares.

  A mapping implements `__call__`; the other methods are its optional contract with the losses,
  each declaring nothing by default: cheaper closed forms (`exp_form`, `log_sigmoid_form`),
  conditions on its parameters (`parameter_checks`), its logit scale (`logit_scale`) with
  its cap (`max_logit_scale`), and the form the fused kernels trace (`kernel_form`).
  `Mapping` wraps a plain function `fn(cos, params, step)` in one that declares nothing.
  """

  @abc.abstractmethod
  def __call__(self, cos: jax.Array, params: Params, step: jax.Array
               ) -> jax.Array:
    """The logits of `cos` under `params` at training `step`."""

  def exp_form(self, dtype: np.dtype) -> ExpForm | None:
    """`exp(f(c) - shift)` in closed form for cosines of `dtype`, or None (no such form)."""
    del dtype
    return None

  def log_sigmoid_form(self, dtype: np.dtype) -> LogSigmoidForm | None:
    """`-log sigmoid(s f(c))` in closed form for cosines of `dtype`, or None."""
    del dtype
    return None

  def parameter_checks(self, params: Params, step: jax.Array
                       ) -> tuple[ParameterCheck, ...]:
    """The conditions its parameters must meet (none for mappings checked when built)."""
    del params, step
    return ()

  def logit_scale(self, params: Params) -> jax.Array | None:
    """The factor it multiplies cosines (or free's logits) by, or None (no single scale)."""
    del params
    return None

  def max_logit_scale(self) -> float | None:
    """The cap on a learnt logit scale (`min(exp(t), cap)`), or None (no cap)."""
    return None

  def with_batch_scale(self, scale: jax.Array) -> MappingFunction | None:
    """This mapping with the scale a loss would solve from its batch fixed to `scale`, or None:
    the mapping has no such scale (all but the batch-scaled mappings, `calibrated_free` ...)."""
    del scale
    return None

  def kernel_form(self) -> MappingFunction:
    """This mapping as the fused kernels trace it (`implementation="pallas"`): itself, unless
    it declares a form cheaper there with the same values to a few ulps (Eq. 11's
    `log((1 + c) / (1 - c))` with its derivative in closed form, for the free mappings)."""
    return self


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: a closure may hold a tracer
class _Plain(MappingFunction):
  """A plain function `fn(cos, params, step)` as a `MappingFunction` that declares nothing."""

  fn: Callable[..., jax.Array]

  def __call__(self, cos, params, step):
    return self.fn(cos, params, step)


class ParameterCheck(NamedTuple):
  """One condition on a mapping's parameter, as `Mapping.parameter_checks` returns it.

  Attributes:
    name: the parameter (`"tau"`, `"t"`, `"tau = schedule(step)"`), as errors name it.
    value: its value, traced where the parameter is.
    valid: bool scalar, whether `value` meets the condition; traced where `value` is.
    requirement: what the value must be (`"finite and > 0"`, `"finite"`).
  """

  name: str
  value: jax.Array
  valid: jax.Array
  requirement: str


def positive_check(name: str, value: jax.typing.ArrayLike) -> ParameterCheck:
  """The check of a temperature: every entry of `value` finite and > 0."""
  value = jnp.asarray(value)
  return ParameterCheck(name, value, jnp.all(jnp.isfinite(value) & (value > 0)),
                        "finite and > 0")


def finite_check(name: str, value: jax.typing.ArrayLike) -> ParameterCheck:
  """The check of a log-scale or a bias: every entry of `value` finite."""
  value = jnp.asarray(value)
  return ParameterCheck(name, value, jnp.all(jnp.isfinite(value)), "finite")


@dataclasses.dataclass(frozen=True)
class ExpForm:
  """`w(c) = exp(f(c) - shift)` and `dw/dc` in closed form, for `c` in `[-1, 1]`.

  `shift` is a constant at least `max f`, so `w <= 1` (or bounded: Eq. 11 uses `shift = 0`
  with `w <= 2 / margin`); losses then need no running maximum.
  """

  shift: float
  weight: Callable[[jax.Array], jax.Array]
  weight_grad: Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class LogSigmoidForm:
  """`t(c, s) = -log sigmoid(s f(c))` and `dt/dc` in closed form, `s = +-1` (the pair's label)."""

  term: Callable[[jax.Array, jax.Array], jax.Array]
  term_grad: Callable[[jax.Array, jax.Array], jax.Array]


def capped_exp(t: jax.typing.ArrayLike, max_scale: float | None,
               dtype: jax.typing.DTypeLike | None = None) -> jax.Array:
  """`min(exp(t), max_scale)` (`exp(t)` without a cap), computed in `dtype`: a learnt scale."""
  scale = jnp.exp(jnp.asarray(t, dtype))
  return scale if max_scale is None else jnp.minimum(scale, max_scale)


@dataclasses.dataclass(frozen=True)
class LearntScale(MappingFunction):
  """A mapping `min(exp(t), max_scale) g(cos)` with `t` in `params` (Eq. 8's `g(c) = c`,
  `learnable_free`'s `g(c) = 2 artanh(c)`): its scale, cap and parameter check, declared once.
  A subclass implements `__call__` with `self.scale(params, cos.dtype)`."""

  max_scale: float | None = None

  def scale(self, params: Params, dtype: jax.typing.DTypeLike | None = None) -> jax.Array:
    """`min(exp(t), max_scale)` in `dtype`."""
    return capped_exp(params["t"], self.max_scale, dtype)

  def logit_scale(self, params: Params) -> jax.Array:
    return self.scale(params)

  def max_logit_scale(self) -> float | None:
    return self.max_scale

  def parameter_checks(self, params: Params, step: jax.Array) -> tuple[ParameterCheck, ...]:
    # exp(t) > 0 for every finite t: only a NaN or infinite t is invalid.
    return (finite_check("t", params["t"]),)
