r"""Similarity-to-logit maps for InfoNCE: fixed, free, learnable, dynamic and annealed temperature.

Section 2 of Kim & Kim (arXiv 2501.17683) feeds `cos / tau` to the softmax
(Eq. 1); Section 4 replaces it with the scaled log-odds `2 artanh(cos)` (Eq. 11).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from collections.abc import Mapping as MappingType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks, schedules

LogitFn = Callable[[jax.Array, MappingType[str, jax.Array], jax.Array], jax.Array]

# How many units in the last place below 1 the temperature-free map saturates.
# A normalised dot product of a vector with itself lands within a few ulps of 1
# on either side; saturating 8 ulps early makes identical vectors give the same
# logit wherever they sit in the batch, at the cost of ~2 nats of range.
_FREE_MARGIN_ULPS = 8

# Largest spread of logits, in nats, that a fixed shift may cover: `exp(f(c) - shift)` then
# stays above exp(-60) ~ 1e-26, far from float32's smallest normal (1e-38).
_FIXED_SHIFT_RANGE = {4: 60.0, 8: 600.0}


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class Mapping:
  """A similarity-to-logit map, applied elementwise to cosine similarities.

  Call it on cosines: `mapping(cos) -> logits`. Learnable maps carry their
  trainable scalars in `params` (a dict, empty for the others); scheduled maps
  read the training `step`. Both can be overridden per call,
  `mapping(cos, params=..., step=...)`, or fixed with `mapping.bind(params=..., step=...)`,
  which is how a train step hands the current ones to a loss inside `jit`.

  A `Mapping` is a pytree: its leaves are `params` (and a bound `step`), the rest is static.
  It passes through `jax.jit`, `vmap` and `grad` as an argument; the gradient with respect to
  a `Mapping` is a `Mapping` whose `params` hold the gradients, and `optax` updates it.

  The pure map `fn` may declare cheaper closed forms that the losses ask for (`exp_form`):
  Eq. 11's `exp(2 artanh c) = (1 + c) / (1 - c)` is one division per logit.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import mappings
    >>> m = mappings.learnable_temperature(tau=0.5)
    >>> grad = jax.grad(lambda m: m(jnp.array(0.25)))(m)   # d(exp(t) c)/dt = exp(t) c
    >>> round(float(grad.params["t"]), 4), type(grad).__name__
    (0.5, 'Mapping')

  Attributes:
    spec: canonical spec string (`from_spec(mapping.spec)` rebuilds it).
    fn: `fn(cos, params, step) -> logits`, the pure map.
    params: trainable scalars, `{}` for non-learnable maps.
    scheduled: whether the map depends on `step`.
    step: the step fixed by `bind` (None: 0).
  """

  spec: str
  fn: LogitFn = dataclasses.field(repr=False)
  params: dict[str, Any] = dataclasses.field(default_factory=dict)
  scheduled: bool = False
  step: Any = dataclasses.field(default=None, repr=False)

  def tree_flatten(self):
    return (self.params, self.step), (self.spec, self.fn, self.scheduled)

  @classmethod
  def tree_unflatten(cls, aux, children):
    spec, fn, scheduled = aux
    params, step = children
    return cls(spec, fn, params, scheduled, step)

  def __call__(self, cos: jax.typing.ArrayLike, *, params=None, step=None) -> jax.Array:
    cos = jnp.asarray(cos)
    if not jnp.issubdtype(cos.dtype, jnp.floating):
      raise TypeError(f"cos must have a floating dtype, got {cos.dtype}.")
    cos = cos.astype(_checks.compute_dtype(cos.dtype))
    params = self.params if params is None else params
    step = self.bound_step() if step is None else step
    return self.fn(cos, params, step)

  def bound_step(self) -> jax.Array:
    """The step fixed by `bind`, else 0."""
    return jnp.zeros((), jnp.int32) if self.step is None else jnp.asarray(self.step)

  def bind(self, *, params=None, step=None) -> Mapping:
    """This map with its trainable `params` and training `step` fixed, as a `Mapping`.

    What a train step hands to a loss: unlike `lambda cos: m(cos, params=p, step=s)`, the
    result is still this `Mapping` (same `spec`), so the losses keep its fast forms and take
    gradients with respect to `params` and `step`-dependent values.

    Examples:
      >>> import jax.numpy as jnp
      >>> from tfcl_jax import mappings
      >>> m = mappings.learnable_temperature(tau=1.0).bind(params={"t": jnp.log(2.0)})
      >>> round(m(0.25).item(), 4), m.spec
      (0.5, 'learnable=1')

    Args:
      params: replaces `self.params` (same keys); None keeps them.
      step: the training step a scheduled map reads; None keeps the bound one (else 0).
    """
    if params is not None and set(params) != set(self.params):
      raise ValueError(
          f"params must have the keys {sorted(self.params)} of mapping {self.spec!r}, "
          f"got {sorted(params)}.")
    return dataclasses.replace(self, params=self.params if params is None else dict(params),
                               step=self.step if step is None else step)

  @property
  def learnable(self) -> bool:
    return bool(self.params)

  def exp_form(self, dtype) -> ExpForm | None:
    """The map's closed form of `exp(f(c) - shift)` for cosines of `dtype`, if it has one.

    Losses that sum `exp(logits)` (InfoNCE's logsumexp) use it instead of `exp(fn(c))`:
    a constant `shift` replaces the running maximum, and the weight and its derivative come
    from the map's own formula. None when the map declares no such form, has learnable
    parameters (their gradient goes through `fn`), or its logits span more than the dtype can
    hold under one shift (e.g. `tau < 1/30` in float32).
    """
    return self._declared("exp_form", dtype)

  def log_sigmoid_form(self, dtype) -> LogSigmoidForm | None:
    """The map's closed form of `-log sigmoid(s f(c))`, `s = +-1`, if it has one.

    The sigmoid (SigLIP) loss uses it instead of `softplus(-s f(c))`. Eq. 11 has one:
    `sigmoid(2 artanh c) = (1 + c) / 2`. None as for `exp_form`.
    """
    return self._declared("log_sigmoid_form", dtype)

  def _declared(self, name: str, dtype):
    declare = getattr(self.fn, name, None)
    if declare is None or self.params:
      return None
    return declare(jnp.dtype(dtype))


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


@dataclasses.dataclass(frozen=True)
class _Temperature:
  """`cos / tau` with a concrete `tau` (Eq. 1)."""

  tau: float

  def __call__(self, cos, params, step):
    return cos / jnp.asarray(self.tau, cos.dtype)

  def exp_form(self, dtype) -> ExpForm | None:
    if 2.0 / self.tau > _FIXED_SHIFT_RANGE[dtype.itemsize]:
      return None
    inverse = 1.0 / self.tau

    def weight(cos):
      return jnp.exp((cos - 1.0) * inverse)

    return ExpForm(inverse, weight, lambda cos: weight(cos) * inverse)


def temperature(tau: jax.typing.ArrayLike) -> Mapping:
  r"""Division by temperature, `cos / tau` (Eq. 1; SimCLR's NT-Xent).

  Logits lie in `[-1/tau, 1/tau]`, an interval of finite length `2/tau`: the
  representational limit of Example 3.1.

  Examples:
    >>> from tfcl_jax import mappings
    >>> mappings.temperature(0.5)(0.25).item()
    0.5

  Args:
    tau: temperature, > 0. May be a traced array (e.g. `schedule(step)`); a
      concrete value <= 0 raises `ValueError`.

  Returns:
    A `Mapping`.
  """
  _checks.positive_scalar(tau, name="tau")
  if _checks.is_concrete(tau):
    return Mapping(f"tau={_format(tau)}", _Temperature(float(tau)))
  return Mapping("tau=<traced>", lambda cos, params, step: cos / jnp.asarray(tau, cos.dtype))


def _free_margin(dtype) -> float:
  return _FREE_MARGIN_ULPS * float(jnp.finfo(dtype).epsneg)


def max_free_logit(dtype) -> float:
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
class _Free:
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
  r"""The temperature-free scaled log-odds map (Eq. 11).

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
  at 0.9999 would cap it at 9.9 and bring back the limit the map removes.
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


@dataclasses.dataclass(frozen=True)
class _Learnable:
  """`min(exp(t), max_scale) * cos` (Eq. 8), `t` in `params`."""

  max_scale: float | None = None

  def __call__(self, cos, params, step):
    scale = jnp.exp(jnp.asarray(params["t"], cos.dtype))
    if self.max_scale is not None:
      scale = jnp.minimum(scale, self.max_scale)
    return scale * cos


def learnable_temperature(*, tau: jax.typing.ArrayLike | None = None,
                          t: jax.typing.ArrayLike | None = None,
                          max_scale: float | None = None) -> Mapping:
  r"""CLIP's learnable temperature: `exp(t) * cos` (Eq. 8), started at temperature `tau`.

  `t = log(1 / tau)` is the log inverse temperature (the logit scale's log, stored as in
  CLIP and big_vision); it lives in `mapping.params["t"]` for the train state. Give the
  initial temperature `tau` (default 0.07, CLIP's) or `t` itself, not both:
  `learnable_temperature(tau=0.07)` is `from_spec("learnable=0.07")`. Eq. 10: the gradient
  `|dL/dt| = 2 C e^t / (1 + e^{2 C e^t})` vanishes at `C = 0` for every `t`.

  Examples:
    >>> from tfcl_jax import mappings
    >>> clip_init = mappings.learnable_temperature(tau=0.07)
    >>> round(clip_init(0.07).item(), 4), clip_init.spec
    (1.0, 'learnable=0.07')
    >>> capped = mappings.learnable_temperature(tau=0.001, max_scale=100.0)
    >>> round(capped(0.5).item(), 4)   # open_clip clamps the scale exp(t) at 100
    50.0

  Args:
    tau: initial temperature, > 0 (default 0.07 when `t` is not given).
    t: initial log inverse temperature instead of `tau`; may be a traced scalar, so that
      gradients reach it.
    max_scale: optional cap on the logit scale `exp(t)` (open_clip uses 100); None: no cap.

  Returns:
    A `Mapping` with `params == {"t": t}`.
  """
  if tau is not None and t is not None:
    raise ValueError(f"give the initial temperature tau or its log inverse t, not both "
                     f"(got tau={tau!r}, t={t!r}).")
  if max_scale is not None:
    _checks.positive_scalar(max_scale, name="max_scale")
    max_scale = float(max_scale)
  if t is None:
    tau = 0.07 if tau is None else tau
    _checks.positive_scalar(tau, name="tau")
    t = jnp.log(1.0 / jnp.asarray(tau, float)) if _checks.is_concrete(tau) else -jnp.log(tau)
  elif _checks.is_concrete(t):
    t_value = np.asarray(t)
    if t_value.ndim != 0 or not np.issubdtype(t_value.dtype, np.number) or not np.isfinite(
        t_value):
      raise ValueError(f"t must be a finite scalar, got {t!r}.")
  concrete = _checks.is_concrete(t)
  spec = f"learnable={_format(math.exp(-float(t)))}" if concrete else "learnable"
  return Mapping(spec, _Learnable(max_scale),
                 params={"t": jnp.asarray(t, float) if concrete else t})


def dynamic_tau(cos: jax.typing.ArrayLike, *, tau_min: float, tau_max: float) -> jax.Array:
  r"""DySTreSS per-pair temperature (Manna et al. 2023).

  .. math:: \tau(s) = \tau_{min} + \tfrac12(\tau_{max} - \tau_{min})(1 + \cos(\pi (1 + s)))

  Smallest (`tau_min`) at `s = 0`, largest (`tau_max`) at `s = +-1`.

  Examples:
    >>> from tfcl_jax import mappings
    >>> [round(mappings.dynamic_tau(s, tau_min=0.1, tau_max=0.2).item(), 3) for s in (-1., 0., 1.)]
    [0.2, 0.1, 0.2]
  """
  cos = jnp.asarray(cos)
  return tau_min + 0.5 * (tau_max - tau_min) * (1.0 + jnp.cos(jnp.pi * (1.0 + cos)))


@dataclasses.dataclass(frozen=True)
class _Dynamic:
  """DySTreSS: `s / stop_gradient(tau(s))`."""

  tau_min: float
  tau_max: float

  def __call__(self, cos, params, step):
    tau = dynamic_tau(cos, tau_min=self.tau_min, tau_max=self.tau_max)
    return cos / jax.lax.stop_gradient(tau)

  def exp_form(self, dtype) -> ExpForm | None:
    # |s / tau(s)| <= 1 / tau_min, so shift = 1 / tau_min bounds w by 1 as for `cos / tau_min`.
    if 2.0 / self.tau_min > _FIXED_SHIFT_RANGE[dtype.itemsize]:
      return None
    shift = 1.0 / self.tau_min
    terms = _SIN_TERMS[dtype.itemsize]

    def tau(cos):
      # dynamic_tau without the trigonometric call: (1 + cos(pi (1 + s))) / 2 = sin^2(pi s / 2).
      sine = _sin_half_pi(cos, terms)
      return self.tau_min + (self.tau_max - self.tau_min) * sine * sine

    def weight(cos):
      return jnp.exp(cos / tau(cos) - shift)

    def weight_grad(cos):
      # tau(s) is detached (DySTreSS): d/ds exp(s / tau - shift) = w / tau.
      return weight(cos) / tau(cos)

    return ExpForm(shift, weight, weight_grad)


# Taylor terms of sin(x), |x| <= pi/2, whose first omitted term is below the dtype's resolution:
# (pi/2)^17 / 17! = 6e-12 (float32), (pi/2)^23 / 23! = 4e-18 (float64).
_SIN_TERMS = {4: 8, 8: 11}


def _sin_half_pi(s: jax.Array, terms: int) -> jax.Array:
  """`sin(pi s / 2)` for `s` in `[-1, 1]`: `s` times its Taylor series in `s^2`, by Horner.

  One multiply-add per term: 5x cheaper on CPU than XLA's `sin`/`cos` (with their range
  reduction) over an `[N, N]` tile, and as exact in float32 and float64.
  """
  u = s * s
  coefficients = [(-1) ** k * (math.pi / 2) ** (2 * k + 1) / math.factorial(2 * k + 1)
                  for k in range(terms)]
  series = coefficients[-1]
  for coefficient in reversed(coefficients[:-1]):
    series = series * u + coefficient
  return s * series


def dynamic_temperature(tau_min: float, tau_max: float) -> Mapping:
  r"""DySTreSS dynamic temperature: `s / stop_gradient(tau(s))`.

  `tau(s)` is `dynamic_tau`; as in the DySTreSS code it is detached, so the
  gradient of a logit is `1 / tau(s)`.

  InfoNCE sums it in closed form, `exp(s / tau(s) - 1 / tau_min)` with
  `tau(s) = tau_min + (tau_max - tau_min) sin^2(pi s / 2)` by a Taylor series:
  loss + gradient within 1.1-1.2x of `cos / tau`'s (`python -m benchmarks.loss_bench
  --mappings tau=0.1 free dynamic=0.1:0.2`; 3.3x faster than through XLA's `cos`).

  Examples:
    >>> from tfcl_jax import mappings
    >>> mappings.dynamic_temperature(0.1, 0.2)(0.0).item()
    0.0

  Args:
    tau_min: smallest temperature, > 0.
    tau_max: largest temperature, >= tau_min.

  Returns:
    A `Mapping` with no parameters.

  References:
    Manna et al., DySTreSS: Dynamically Scaled Temperature in Self-Supervised
    Contrastive Learning, arXiv 2308.01140.
  """
  _checks.positive_scalar(tau_min, name="tau_min")
  _checks.positive_scalar(tau_max, name="tau_max")
  if tau_max < tau_min:
    raise ValueError(f"tau_max must be >= tau_min, got tau_min={tau_min}, tau_max={tau_max}.")
  return Mapping(f"dynamic={_format(tau_min)}:{_format(tau_max)}",
                 _Dynamic(float(tau_min), float(tau_max)))


@dataclasses.dataclass(frozen=True)
class _Annealed:
  """`cos / schedule(step)`."""

  schedule: schedules.Schedule

  def __call__(self, cos, params, step):
    return cos / self.schedule(step).astype(cos.dtype)


def annealed_temperature(schedule: schedules.Schedule, *, spec: str = "anneal") -> Mapping:
  """Division by a scheduled temperature, `cos / schedule(step)`.

  Examples:
    >>> from tfcl_jax import mappings, schedules
    >>> schedule = schedules.linear(tau_start=1.0, tau_end=0.5, steps=10)
    >>> mapping = mappings.annealed_temperature(schedule)
    >>> mapping(0.5, step=10).item()
    1.0
  """
  if not callable(schedule):
    raise TypeError(f"schedule must be a callable step -> tau, got {type(schedule).__name__}.")
  return Mapping(spec, _Annealed(schedule), scheduled=True)


def as_mapping(mapping) -> Mapping:
  """`mapping` as a `Mapping`: a `Mapping` as is, a plain callable `cos -> logits` wrapped.

  Examples:
    >>> from tfcl_jax import mappings
    >>> mappings.as_mapping(lambda cos: 3.0 * cos)(0.5).item()
    1.5
  """
  if isinstance(mapping, Mapping):
    return mapping
  if not callable(mapping):
    raise TypeError(
        f"mapping must be a callable cos -> logits (see tfcl_jax.mappings), got "
        f"{type(mapping).__name__}.")
  return Mapping("callable", lambda cos, params, step: mapping(cos))


def _format(x) -> str:
  return f"{float(x):g}"


SPEC_FORMS = (
    "tau=T                  fixed temperature T > 0, e.g. tau=0.25",
    "free                   temperature-free 2 artanh(cos)",
    "learnable[=T0]         learnable exp(t) cos, initial temperature T0 (default 0.07)",
    "dynamic=TMIN:TMAX      DySTreSS per-pair temperature, e.g. dynamic=0.1:0.2",
    "anneal=log:T0          tau = T0 / log(step + 2)",
    "anneal=KIND:T0:T1:S    KIND in linear|exp|cosine, from T0 to T1 over S steps",
)

_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def from_spec(text: str) -> Mapping:
  """Builds a mapping from a short spec string, for configs and command lines.

  Accepted forms (see `SPEC_FORMS`): `tau=0.25`, `free`, `learnable`,
  `learnable=0.07`, `dynamic=0.1:0.2`, `anneal=log:0.5`,
  `anneal=cosine:0.5:0.1:1000` (also `linear`, `exp`).

  Examples:
    >>> from tfcl_jax import mappings
    >>> mappings.from_spec("tau=0.25")(0.5).item()
    2.0
    >>> mappings.from_spec(" free ").spec
    'free'

  Raises:
    ValueError: for unknown or malformed specs, listing the accepted forms.
  """
  if not isinstance(text, str):
    raise TypeError(f"spec must be a str, got {type(text).__name__}.")
  spec = text.strip().replace(" ", "")
  try:
    return _parse(spec)
  except ValueError as error:
    forms = "\n  ".join(SPEC_FORMS)
    message = f"Invalid mapping spec {text!r}: {error}\nAccepted forms:\n  {forms}"
    raise ValueError(message) from None


def _parse(spec: str) -> Mapping:
  if spec == "free":
    return temperature_free()
  if match := re.fullmatch(rf"tau={_NUMBER}", spec):
    return temperature(float(match[1]))
  if spec == "learnable":
    return learnable_temperature(tau=0.07)
  if match := re.fullmatch(rf"learnable={_NUMBER}", spec):
    tau0 = _checks.positive_scalar(float(match[1]), name="initial temperature")
    return learnable_temperature(tau=tau0)
  if match := re.fullmatch(rf"dynamic={_NUMBER}:{_NUMBER}", spec):
    return dynamic_temperature(float(match[1]), float(match[2]))
  if match := re.fullmatch(rf"anneal=log:{_NUMBER}", spec):
    tau0 = float(match[1])
    schedule = schedules.logarithmic(tau0=tau0)
    return annealed_temperature(schedule, spec=f"anneal=log:{_format(tau0)}")
  if match := re.fullmatch(rf"anneal=(linear|exp|cosine):{_NUMBER}:{_NUMBER}:([0-9]+)", spec):
    kind, start, end, steps = match[1], float(match[2]), float(match[3]), int(match[4])
    schedule = schedules.SCHEDULES[kind](tau_start=start, tau_end=end, steps=steps)
    return annealed_temperature(
        schedule, spec=f"anneal={kind}:{_format(start)}:{_format(end)}:{steps}")
  raise ValueError("not a recognised form")
