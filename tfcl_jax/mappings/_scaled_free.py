r"""Free mappings with a scale, `s 2 artanh(c)` (Eq. 11 at `s = 1`): the scale learnt from `s = 1`
(`learnable_free`) or set by the candidate count `N` (`n_aware_free`)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks, specs
from tfcl_jax.mappings._base import Mapping, format_number
from tfcl_jax.mappings._free import (
  _clip_slope,
  _Free,
  _free_logit,
  _free_margin,
  _InKernel,
  max_free_logit,
)
from tfcl_jax.mappings._function import ExpForm, LearntScale, LogSigmoidForm, MappingFunction
from tfcl_jax.mappings._registry import SPECS

# The range of log w, w = exp(s f(c) - shift), that a fixed shift must keep the weights in, per
# dtype size. Float32: below e^60 the weights leave room for sums over 2^30 candidates and for
# dw/dc's factor 2 s / (1 - c^2) (at most e^17) under float32's largest e^88, and above e^-80 they
# stay normal (smallest e^-87). Float64 the same against e^709 and e^-708.
_LOG_WEIGHT_RANGE = {4: (-80.0, 60.0), 8: (-700.0, 600.0)}


@dataclasses.dataclass(frozen=True)
class _ScaledFree(MappingFunction):
  """`scale * 2 artanh(c)` with a concrete `scale`; `exp` of it is `((1 + c)/(1 - c))^scale`.
  `kernel`: Eq. 11 in the fused kernels' form (`_free._free_logit`, `_free._InKernel`)."""

  scale: float

  def __call__(self, cos, params, step, kernel: bool = False):
    return jnp.asarray(self.scale, cos.dtype) * _free_logit(cos, kernel=kernel)

  def kernel_form(self) -> MappingFunction:
    return _InKernel(self)

  def logit_scale(self, params) -> jax.Array:
    return jnp.asarray(self.scale)

  def exp_form(self, dtype) -> ExpForm | None:
    if self.scale == 1.0:
      return _Free().exp_form(dtype)
    scale = self.scale
    low_log, high_log = _LOG_WEIGHT_RANGE[dtype.itemsize]
    bound = scale * max_free_logit(dtype)  # logits lie in [-bound, bound]
    shift = max(0.0, bound - high_log)
    if -bound - shift < low_log:  # the logits span more than one shift can hold
      return None
    low, high = -1.0 + _free_margin(dtype), 1.0 - _free_margin(dtype)

    def weight(cos):
      # ((1 + c)/(1 - c))^s = exp(s 2 artanh c), finite after free's clamp.
      return jnp.exp(scale * _free_logit(cos) - shift)

    def weight_grad(cos):
      clipped = jnp.clip(cos, low, high)
      return (weight(cos) * (2.0 * scale) / ((1.0 - clipped) * (1.0 + clipped))
              * _clip_slope(cos, low, high))

    return ExpForm(shift, weight, weight_grad)

  def log_sigmoid_form(self, dtype) -> LogSigmoidForm:
    if self.scale == 1.0:
      return _Free().log_sigmoid_form(dtype)
    scale = self.scale
    low, high = -1.0 + _free_margin(dtype), 1.0 - _free_margin(dtype)

    def odds(cos, sign):
      # sigmoid(s y 2 artanh c) = (1 + y c)^s / ((1 + y c)^s + (1 - y c)^s); this is the log of
      # the second term over the first, `-s y 2 artanh c`.
      clipped = jnp.clip(cos, low, high)
      return scale * (jnp.log1p(-sign * clipped) - jnp.log1p(sign * clipped))

    def term(cos, sign):
      return jax.nn.softplus(odds(cos, sign))

    def term_grad(cos, sign):
      clipped = jnp.clip(cos, low, high)
      return (-sign * (2.0 * scale) / ((1.0 - clipped) * (1.0 + clipped))
              * jax.nn.sigmoid(odds(cos, sign)) * _clip_slope(cos, low, high))

    return LogSigmoidForm(term, term_grad)


def free_scale(num_candidates: int) -> float:
  r"""The N-aware free mapping's scale, `s(N) = 1 + log(N - 1) / log 9`.

  On the paper's pattern `[C, -C, ..., -C]` a mapping `s 2 artanh(c)` gives the positive the
  softmax probability `1 / (1 + (N - 1) r^{2s})`, `r = (1 - C)/(1 + C)` (Eq. 12 with a scale).
  `s(N)` is the scale at which `N - 1` negatives leave the positive at `C = 1/2` the
  probability one negative leaves it under free (`N = 2`, `s = 1`):
  `(N - 1) 3^{-2 s} = 3^{-2}`.

  Examples:
    >>> from tfcl_jax import mappings
    >>> [round(mappings.free_scale(n), 3) for n in (2, 10, 511, 8192)]
    [1.0, 2.0, 3.837, 5.101]

  Args:
    num_candidates: `N`, the candidates per anchor (the positive included), an int >= 2.

  Returns:
    `s(N)`, a Python float; exactly 1.0 at `N = 2`.
  """
  n = _checks.positive_int(num_candidates, name="num_candidates", minimum=2)
  return 1.0 + math.log(n - 1) / math.log(9.0)


@SPECS.register("free_n[=N]",
                N=specs.Count("num_candidates", minimum=2, default=specs.CANDIDATES),
                help="N-aware free (1 + log(N - 1)/log 9) 2 artanh(cos), N >= 2 candidates; "
                     "N left out: the loss's candidates per anchor (in a loss only)")
def n_aware_free(*, num_candidates: int) -> Mapping:
  r"""The N-aware free mapping, `s(N) 2 artanh(c)`, `s(N) = 1 + log(N - 1) / log 9` (`free_scale`).

  .. math:: f_N(c) = \left(1 + \frac{\log(N - 1)}{\log 9}\right) \log\frac{1 + c}{1 - c}

  Eq. 11 at `N = 2` (`s = 1`), sharper as `N` grows (`s = 3.84` at `N = 511`, `5.10` at
  `N = 8192`), as the best temperature of Eq. 7 falls with `N`. On the pattern
  `[C, -C, ..., -C]` its gradient scale is Eq. 13 with the scale `s`:
  `|dL/dC| = s (N - 1) (4 / (1 - C^2)) r^{2s} / (1 + (N - 1) r^{2s})`, `r = (1 - C)/(1 + C)`.

  No parameter is learnt. The losses use its closed forms: `exp(f_N(c)) = ((1 + c)/(1 - c))^s`
  (`Mapping.exp_form`, with a fixed shift when `s` times `max_free_logit` passes 60 nats in
  float32; none past 70 nats, `s > 4.6` there, where the losses take the running maximum) and
  `sigmoid(f_N(c)) = (1 + c)^s / ((1 + c)^s + (1 - c)^s)` (`Mapping.log_sigmoid_form`). Values
  and gradients are finite on all of `[-1, 1]`: `c` is clamped as in `temperature_free`.

  Its mapping spec is `free_n=N`; a loss spec names it `free_n`, the loss filling in its own
  candidate count (`losses.from_spec("free_n", num_candidates=...)`).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax import mappings
    >>> m = mappings.n_aware_free(num_candidates=10)      # s = 2
    >>> [round(float(x), 4) for x in m(jnp.array([-0.5, 0.0, 0.5]))]
    [-2.1972, 0.0, 2.1972]
    >>> m.spec, mappings.n_aware_free(num_candidates=2)(0.5).item() == mappings.temperature_free()(
    ...     0.5).item()
    ('free_n=10', True)

  Args:
    num_candidates: `N`, the candidates per anchor (the positive included), an int >= 2
      (`losses.num_candidates`).

  Returns:
    A `Mapping` with no parameters.

  Raises:
    TypeError, ValueError: `num_candidates` is not an int >= 2.

  References:
    Kim & Kim, arXiv 2501.17683, Eq. 7, 11 and 13.
  """
  scale = free_scale(num_candidates)
  return Mapping(f"free_n={int(num_candidates)}", _ScaledFree(scale))


@dataclasses.dataclass(frozen=True)
class _LearnableFree(LearntScale):
  """`min(exp(t), max_scale) * 2 artanh(c)`, `t` in `params`; `kernel` as `_ScaledFree`'s."""

  def __call__(self, cos, params, step, kernel: bool = False):
    return self.scale(params, cos.dtype) * _free_logit(cos, kernel=kernel)

  def kernel_form(self) -> MappingFunction:
    return _InKernel(self)


@SPECS.register("learnable_free[=MAX]", MAX=specs.Positive("max_scale"),
                help="free with a learnable scale exp(t) 2 artanh(cos), t = 0 at the start, "
                     "the scale capped at MAX")
def learnable_free(*, max_scale: float | None = None) -> Mapping:
  r"""Free with a learnable scale: `exp(t) 2 artanh(c)`, `t = 0` at the start (Eq. 11).

  .. math:: f_t(c) = \min(e^t, \text{max\_scale}) \log\frac{1 + c}{1 - c}

  It is `temperature_free` until training moves `t` (`mapping.params["t"]`, stored as CLIP's
  log-scale, Eq. 8). On the pattern `[C, -C, ..., -C]` with `s = exp(t)`,
  `|dL/dt| = 4 s artanh(C) (N - 1) r^{2s} / (1 + (N - 1) r^{2s})`, `r = (1 - C)/(1 + C)`: zero
  at `C = 0`, as Eq. 10 for CLIP's `exp(t) c`. Values and gradients are finite on all of
  `[-1, 1]` (`c` clamped as in `temperature_free`). The losses take its gradient through the
  mapping itself: like every learnable map it declares no closed form to them.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import mappings
    >>> m = mappings.learnable_free(max_scale=100.0)
    >>> m.spec, round(m(0.5).item(), 4), float(m.params["t"])   # free at the start
    ('learnable_free=100', 1.0986, 0.0)
    >>> round(jax.grad(lambda m: m(jnp.array(0.5)))(m).params["t"].item(), 4)  # d f/dt = f
    1.0986
    >>> float(mappings.logit_scale(m.bind(params={"t": jnp.log(1e3)})))  # capped
    100.0

  Args:
    max_scale: optional cap on the scale `exp(t)`; None: no cap. The cap is
      `min(exp(t), max_scale)` in the forward pass, as in `learnable_temperature`: past it `t`
      gets no gradient.

  Returns:
    A `Mapping` with `params == {"t": 0.0}`.

  References:
    Kim & Kim, arXiv 2501.17683, Eq. 8, 10 and 11.
  """
  spec = "learnable_free"
  if max_scale is not None:
    _checks.positive_scalar(max_scale, name="max_scale")
    max_scale = float(np.asarray(max_scale))
    spec = f"{spec}={format_number(max_scale)}"
  return Mapping(spec, _LearnableFree(max_scale), params={"t": jnp.zeros((), float)})
