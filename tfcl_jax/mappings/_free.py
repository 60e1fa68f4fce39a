"""The temperature-free mapping, Eq. 11: `2 artanh(c) = log((1 + c) / (1 - c))`."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax.mappings._base import ExpForm, LogSigmoidForm, Mapping, MappingFunction
from tfcl_jax.mappings._registry import SPECS

# How many units in the last place below 1 the temperature-free mapping saturates.
# A normalised dot product of a vector with itself lands within a few ulps of 1
# on either side; saturating 8 ulps early makes identical vectors give the same
# logit wherever they sit in the batch, at the cost of ~2 nats of range.
_FREE_MARGIN_ULPS = 8


def _free_margin(dtype) -> float:
  return _FREE_MARGIN_ULPS * float(jnp.finfo(dtype).epsneg)


def max_free_logit(dtype: jax.typing.DTypeLike) -> float:
  """Largest logit `temperature_free()` returns for inputs of `dtype`.

  Half-precision inputs are computed in float32, so they share its bound.

  Examples:
    >>> from tfcl_jax import mappings
    >>> round(mappings.max_free_logit("float32"), 2)
    15.25
  """
  dtype = np.dtype(dtype)
  compute = np.float64 if dtype.itemsize > 4 else np.float32
  margin = _FREE_MARGIN_ULPS * float(np.finfo(compute).epsneg)
  return math.log((2.0 - margin) / margin)


def _clip_slope(cos, low, high):
  """`d clip(c, low, high) / dc` as `jnp.clip` differentiates it: 1 inside, 1/2 on a bound."""
  return jnp.where((cos > low) & (cos < high), 1.0,
                   jnp.where((cos == low) | (cos == high), 0.5, 0.0))


def _weight_grad_of(low, high):
  def weight_grad(cos):
    # d/dc (1 + c)/(1 - c) = 2 / (1 - c)^2, times the clamp's slope.
    inverse = 1.0 / (1.0 - jnp.clip(cos, low, high))
    return 2.0 * inverse * inverse * _clip_slope(cos, low, high)

  return weight_grad


@dataclasses.dataclass(frozen=True)
class _Free(MappingFunction):
  """Eq. 11, `log1p(c) - log1p(-c)` after an 8-ulp clamp; `exp` of it is `(1 + c) / (1 - c)`."""

  def __call__(self, cos, params, step):
    margin = _free_margin(cos.dtype)
    cos = jnp.clip(cos, -1.0 + margin, 1.0 - margin)
    return jnp.log1p(cos) - jnp.log1p(-cos)

  def exp_form(self, dtype) -> ExpForm:
    low, high = -1.0 + _free_margin(dtype), 1.0 - _free_margin(dtype)

    def weight(cos):
      cos = jnp.clip(cos, low, high)
      return (1.0 + cos) / (1.0 - cos)

    # After the clamp w <= 2 / margin (4.2e6 in float32): sums of it need no shift.
    return ExpForm(0.0, weight, _weight_grad_of(low, high))

  def log_sigmoid_form(self, dtype) -> LogSigmoidForm:
    low, high = -1.0 + _free_margin(dtype), 1.0 - _free_margin(dtype)

    def term(cos, sign):
      # sigmoid(s 2 artanh c) = (1 + s c) / 2 exactly: -log of it, finite after the clamp.
      return math.log(2.0) - jnp.log1p(sign * jnp.clip(cos, low, high))

    def term_grad(cos, sign):
      return -sign / (1.0 + sign * jnp.clip(cos, low, high)) * _clip_slope(cos, low, high)

    return LogSigmoidForm(term, term_grad)


def temperature_free() -> Mapping:
  r"""The temperature-free scaled log-odds mapping (Eq. 11).

  .. math:: \operatorname{logit}\left(\frac{1 + c}{2}\right)
            = \log\frac{1 + c}{1 - c} = 2 \operatorname{artanh}(c)

  It maps `(-1, 1)` onto the whole real line, removing the representational
  limit of Eq. 1, and with it Eq. 13's gradient scale vanishes only at the
  optimum `C -> 1`.

  Numerics: computed as `log1p(c) - log1p(-c)` (exact near 0, no cancellation)
  after clamping `c` to `[-1 + m, 1 - m]`, `m = 8 ulps below 1` of the compute
  dtype. Values and gradients are finite on all of `[-1, 1]` (the gradient
  is zero past the clamp). Half-precision inputs are computed in float32. The
  largest reachable logit (`max_free_logit`): float64 35.3, float32 15.2
  (bfloat16 and float16 as float32), against 10 for `tau = 0.1`. A fixed clamp
  at 0.9999 would cap it at 9.9 and bring back the limit the mapping removes.
  Losses that exponentiate the logits use its closed form `exp(f(c)) = (1 + c)/(1 - c)`
  (`Mapping.exp_form`): one division per logit.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax import mappings
    >>> free = mappings.temperature_free()
    >>> [round(float(x), 4) for x in free(jnp.array([-0.5, 0.0, 0.5]))]
    [-1.0986, 0.0, 1.0986]

  Returns:
    A `Mapping` with no parameters.

  References:
    Kim & Kim, Temperature-Free Loss Function for Contrastive Learning,
    arXiv 2501.17683, Eq. 11.
  """
  return Mapping("free", _Free())


SPECS.register("free", temperature_free, help="temperature-free 2 artanh(cos) (Eq. 11)")
