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


@dataclasses.dataclass(frozen=True, eq=False)
class Mapping:
  """A similarity-to-logit map, applied elementwise to cosine similarities.

  Call it on cosines: `mapping(cos) -> logits`. Learnable maps carry their
  trainable scalars in `params` (a dict, empty for the others); scheduled maps
  read the training `step`. Both can be overridden per call,
  `mapping(cos, params=..., step=...)`, or fixed with `mapping.bind(params=..., step=...)`,
  which is how a train step hands the current ones to a loss inside `jit`.

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
    result is still this `Mapping` (same `spec`), so the blockwise kernels keep their Eq. 11
    fast path and take gradients with respect to `params` and `step`-dependent values.

    Examples:
      >>> import jax.numpy as jnp
      >>> from tfcl_jax import mappings
      >>> m = mappings.learnable_temperature(0.0).bind(params={"t": jnp.log(2.0)})
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
  spec = f"tau={_format(tau)}" if _checks.is_concrete(tau) else "tau=<traced>"
  return Mapping(spec, lambda cos, params, step: cos / jnp.asarray(tau, cos.dtype))


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

  def fn(cos, params, step):
    margin = _free_margin(cos.dtype)
    cos = jnp.clip(cos, -1.0 + margin, 1.0 - margin)
    return jnp.log1p(cos) - jnp.log1p(-cos)

  return Mapping("free", fn)


def learnable_temperature(t: jax.typing.ArrayLike) -> Mapping:
  r"""CLIP's learnable temperature: `exp(t) * cos` (Eq. 8).

  `t` is the log inverse temperature, so `tau = exp(-t)`; it is stored in
  `mapping.params["t"]` for the train state. Eq. 10: its gradient
  `|dL/dt| = 2 C e^t / (1 + e^{2 C e^t})` vanishes at `C = 0` for every `t`.

  Examples:
    >>> import math
    >>> from tfcl_jax import mappings
    >>> clip_init = mappings.learnable_temperature(math.log(1 / 0.07))
    >>> round(clip_init(0.07).item(), 4)
    1.0

  Args:
    t: log inverse temperature; a float or a (traced) scalar array, so that
      gradients reach it.

  Returns:
    A `Mapping` with `params == {"t": t}`.
  """
  if _checks.is_concrete(t):
    t_value = np.asarray(t)
    if t_value.ndim != 0 or not np.isfinite(t_value):
      raise ValueError(f"t must be a finite scalar, got {t!r}.")

  def fn(cos, params, step):
    return jnp.exp(jnp.asarray(params["t"], cos.dtype)) * cos

  spec = f"learnable={_format(math.exp(-float(t)))}" if _checks.is_concrete(t) else "learnable"
  return Mapping(spec, fn, params={"t": jnp.asarray(t, float) if _checks.is_concrete(t) else t})


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


def dynamic_temperature(tau_min: float, tau_max: float) -> Mapping:
  r"""DySTreSS dynamic temperature: `s / stop_gradient(tau(s))`.

  `tau(s)` is `dynamic_tau`; as in the DySTreSS code it is detached, so the
  gradient of a logit is `1 / tau(s)`.

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

  def fn(cos, params, step):
    return cos / jax.lax.stop_gradient(dynamic_tau(cos, tau_min=tau_min, tau_max=tau_max))

  return Mapping(f"dynamic={_format(tau_min)}:{_format(tau_max)}", fn)


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

  def fn(cos, params, step):
    return cos / schedule(step).astype(cos.dtype)

  return Mapping(spec, fn, scheduled=True)


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
    return learnable_temperature(math.log(1 / 0.07))
  if match := re.fullmatch(rf"learnable={_NUMBER}", spec):
    tau0 = _checks.positive_scalar(float(match[1]), name="initial temperature")
    return learnable_temperature(math.log(1 / tau0))
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
