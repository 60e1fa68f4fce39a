"""The temperature-free mapping, Eq. 11: `2 artanh(c) = log((1 + c) / (1 - c))`."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax.mappings._base import Mapping
from tfcl_jax.mappings._function import ExpForm, LogSigmoidForm, MappingFunction
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


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _odds_logit(cos, margin):
  """Eq. 11 as the fused kernels compute it, free's clamp included: `log((1 + c) / (1 - c))` of
  `c` clamped to `[-1 + margin, 1 - margin]`, one `log` and one division where
  `log1p(c) - log1p(-c)` takes two `log1p`s, with its derivative in closed form,
  `2 / ((1 - c)(1 + c))` inside the clamp and 0 outside, where autodiff would keep both
  `log1p`s' derivatives and the clamp's alive. In a float32 gradient kernel's tile that is the
  difference between 376-680 bytes spilled a thread and at most 16 (sm_80 and sm_90,
  D = 128-768; docs/losses.md). Inside the clamp its value differs from the `log1p` form by the
  ratio's rounding, a few float32 ulps of 1 (at most 2e-7 absolute)."""
  cos = jnp.clip(cos, -1.0 + margin, 1.0 - margin)
  return jnp.log((1.0 + cos) / (1.0 - cos))


@_odds_logit.defjvp
def _odds_logit_jvp(margin, primals, tangents):
  (cos,), (tangent,) = primals, tangents
  inside = jnp.abs(cos) < 1.0 - margin
  slope = jnp.where(inside, 2.0 / ((1.0 - cos) * (1.0 + cos)), 0.0)
  return _odds_logit(cos, margin), tangent * slope


def _free_logit(cos, *, kernel: bool = False):
  """Eq. 11 as the free mappings compute it: `log1p(c) - log1p(-c)` after the 8-ulp clamp; in
  the fused kernels' form (`kernel`, `MappingFunction.kernel_form`), `_odds_logit`, the same
  clamp inside. The XLA path never takes the kernels' form, so its numerics (and every
  committed run) stay those of `log1p`."""
  margin = _free_margin(cos.dtype)
  if kernel:
    return _odds_logit(cos, margin)
  cos = jnp.clip(cos, -1.0 + margin, 1.0 - margin)
  return jnp.log1p(cos) - jnp.log1p(-cos)


@dataclasses.dataclass(frozen=True, eq=False)
class _InKernel(MappingFunction):
  """A free mapping as the fused kernels trace it (`MappingFunction.kernel_form`): its call with
  `kernel=True`, Eq. 11 as `_odds_logit`."""

  inner: MappingFunction

  def __call__(self, cos, params, step):
    return self.inner(cos, params, step, kernel=True)  # pyright: ignore[reportCallIssue]


def _weight_grad_of(low, high):
  def weight_grad(cos):
    # d/dc (1 + c)/(1 - c) = 2 / (1 - c)^2, times the clamp's slope.
    inverse = 1.0 / (1.0 - jnp.clip(cos, low, high))
    return 2.0 * inverse * inverse * _clip_slope(cos, low, high)

  return weight_grad


@dataclasses.dataclass(frozen=True)
class _Free(MappingFunction):
  """Eq. 11, `log1p(c) - log1p(-c)` after an 8-ulp clamp; `exp` of it is `(1 + c) / (1 - c)`;
  `kernel`: in the fused kernels' form (`_free_logit`, `_InKernel`)."""

  def __call__(self, cos, params, step, kernel: bool = False):
    return _free_logit(cos, kernel=kernel)

  def kernel_form(self) -> MappingFunction:
    return _InKernel(self)

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


@SPECS.register("free", help="temperature-free 2 artanh(cos) (Eq. 11)")
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
