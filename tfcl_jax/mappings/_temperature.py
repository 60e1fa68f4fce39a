"""Temperature mappings: fixed `cos / tau` (Eq. 1), learnable `exp(t) cos` (Eq. 8), annealed."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks, schedules, specs
from tfcl_jax.mappings._base import Mapping, format_number
from tfcl_jax.mappings._batch_scaled import BatchScaled
from tfcl_jax.mappings._function import (
  FIXED_SHIFT_RANGE,
  ExpForm,
  LearntScale,
  MappingFunction,
  ParameterCheck,
  positive_check,
)
from tfcl_jax.mappings._registry import SPECS


@dataclasses.dataclass(frozen=True)
class _Temperature(MappingFunction):
  """`cos / tau` with a concrete `tau` (Eq. 1)."""

  tau: float

  def __call__(self, cos, params, step):
    return cos / jnp.asarray(self.tau, cos.dtype)

  def logit_scale(self, params) -> jax.Array:
    return jnp.asarray(1.0 / self.tau)

  def exp_form(self, dtype) -> ExpForm | None:
    if 2.0 / self.tau > FIXED_SHIFT_RANGE[dtype.itemsize]:
      return None
    inverse = 1.0 / self.tau

    def weight(cos):
      return jnp.exp((cos - 1.0) * inverse)

    return ExpForm(inverse, weight, lambda cos: weight(cos) * inverse)


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, as a tracer must be
class _TracedTemperature(MappingFunction):
  """`cos / tau` with a traced `tau`, known only when the program runs."""

  tau: jax.Array

  def __call__(self, cos, params, step):
    return cos / jnp.asarray(self.tau, cos.dtype)

  def parameter_checks(self, params, step) -> tuple[ParameterCheck, ...]:
    return (positive_check("tau", self.tau),)


@SPECS.register("tau=T", T=specs.Positive("tau"),
                help="fixed temperature T > 0: cos / T (Eq. 1), e.g. tau=0.25")
def temperature(tau: jax.typing.ArrayLike) -> Mapping:
  r"""Division by temperature, `cos / tau` (Eq. 1; SimCLR's NT-Xent).

  Logits lie in `[-1/tau, 1/tau]`, an interval of finite length `2/tau`: the
  representational limit of Example 3.1.

  A traced `tau` (inside `jit`) is not known when the mapping is built: the losses check it
  under `check_finite="checkify"` (`Mapping.parameter_checks`, a `checkify` check). Without that
  check a traced `tau = 0` gives infinite logits (NaN at `cos = 0`) and a non-finite loss
  (NaN for `losses.info_nce`), and `tau < 0` logits of the wrong sign: a finite but
  meaningless loss.

  Examples:
    >>> import jax
    >>> from jax.experimental import checkify
    >>> from tfcl_jax import losses, mappings
    >>> mappings.temperature(0.5)(0.25).item()
    0.5
    >>> z = jax.random.normal(jax.random.key(0), (4, 8))
    >>> loss = jax.jit(lambda tau: losses.info_nce(z, z, mapping=mappings.temperature(tau),
    ...                                            check_finite="checkify"))
    >>> error, _ = checkify.checkify(loss)(0.0)
    >>> print(error.get())  # doctest: +ELLIPSIS
    tau must be finite and > 0 (check_finite), got 0.0 (mapping 'tau=<traced>')...

  Args:
    tau: temperature, > 0. May be a traced array (e.g. `schedule(step)`); a
      concrete value <= 0 raises `ValueError`, a traced one is checked by the losses'
      `check_finite="checkify"`.

  Returns:
    A `Mapping`.
  """
  _checks.positive_scalar(tau, name="tau")
  if _checks.is_concrete(tau):
    return Mapping(f"tau={format_number(tau)}", _Temperature(float(np.asarray(tau))))
  return Mapping("tau=<traced>", _TracedTemperature(jnp.asarray(tau)))


@dataclasses.dataclass(frozen=True)
class _Learnable(LearntScale):
  """`min(exp(t), max_scale) * cos` (Eq. 8), `t` in `params`."""

  def __call__(self, cos, params, step):
    return self.scale(params, cos.dtype) * cos


@SPECS.register("learnable[=T0[:MAX]]",
                T0=specs.Positive("tau", default=0.07), MAX=specs.Positive("max_scale"),
                help="learnable exp(t) cos (Eq. 8) from temperature T0 (default 0.07), the scale "
                     "capped at MAX (CLIP: learnable=0.07:100)")
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
    >>> mappings.learnable_temperature(tau=0.07, max_scale=100.0).spec  # CLIP's
    'learnable=0.07:100'

  Args:
    tau: initial temperature, > 0 (default 0.07 when `t` is not given).
    t: initial log inverse temperature instead of `tau`; may be a traced scalar, so that
      gradients reach it: a traced `t` is the caller's, and the mapping counts as bound
      (`Mapping.params_given`; a concrete `t` or `tau` gives an unbound one, to bind).
    max_scale: optional cap on the logit scale `exp(t)` (open_clip uses 100); None: no cap.
      The cap is `min(exp(t), max_scale)` in the forward pass: past it `t` gets no gradient,
      where open_clip clamps `t` itself after each step; both hold the scale at the cap.

  Returns:
    A `Mapping` with `params == {"t": t}`.
  """
  if tau is not None and t is not None:
    raise ValueError(f"give the initial temperature tau or its log inverse t, not both "
                     f"(got tau={tau!r}, t={t!r}).")
  if max_scale is not None:
    _checks.positive_scalar(max_scale, name="max_scale")
    max_scale = float(max_scale)
  initial = None  # the initial temperature the spec names: `tau` as given, else exp(-t)
  given_t = t is not None
  if t is None:
    tau = 0.07 if tau is None else tau
    _checks.positive_scalar(tau, name="tau")
    if _checks.is_concrete(tau):
      initial = float(np.asarray(tau))
      t = jnp.log(1.0 / jnp.asarray(tau, float))
    else:
      t = -jnp.log(tau)
  elif _checks.is_concrete(t):
    t_value = np.asarray(t)
    if t_value.ndim != 0 or not np.issubdtype(t_value.dtype, np.number) or not np.isfinite(
        t_value):
      raise ValueError(f"t must be a finite scalar, got {t!r}.")
  concrete = _checks.is_concrete(t)
  if concrete and initial is None:
    initial = math.exp(-float(np.asarray(t)))
  spec = "learnable" if initial is None else f"learnable={format_number(initial)}"
  # Built inside a trace (jit, shard_map), `t` from a concrete `tau` is traced, its spec not.
  if max_scale is not None and initial is not None:
    spec = f"{spec}:{format_number(max_scale)}"
  # A traced `t` is the caller's (a parameter inside `jax.grad`): bound, as by `bind(params=)`.
  return Mapping(spec, _Learnable(max_scale),
                 params={"t": jnp.asarray(t, float) if concrete else t},
                 bound=given_t and not concrete)


def logit_scale(mapping: Mapping, *, params: dict | None = None) -> jax.Array | None:
  r"""A temperature mapping's factor on the cosines: `1 / tau`, or `min(exp(t), max_scale)`.

  A scaled free mapping (`learnable_free`, `n_aware_free`) has one too: the factor `s` of
  `s 2 artanh(cos)`. For a learnable mapping (Eq. 8) this is the effective scale, the cap included,
  at `mapping.params` or at the `params` given (e.g. a train state's `params["loss"]`, which holds
  the mapping's `t`); CLIP logs it as `logit_scale`. Mappings that are not one factor times the
  cosine or times Eq. 11 (free, DySTreSS, annealed, callables) have none. A batch-scaled mapping
  (`calibrated_free`, `accuracy_free`, `perplexity_free`) has the scale it was bound to
  (`bind(scale=s)`: a scalar, or `[M]` per anchor), and None unbound: the loss solves it per batch
  (`losses.batch_scale` returns it).

  Examples:
    >>> from tfcl_jax import mappings
    >>> round(float(mappings.logit_scale(mappings.learnable_temperature(tau=0.07))), 3)
    14.286
    >>> capped = mappings.learnable_temperature(tau=0.001, max_scale=100.0)
    >>> float(mappings.logit_scale(capped))          # exp(t) = 1000, capped
    100.0
    >>> float(mappings.logit_scale(mappings.temperature(0.5)))
    2.0
    >>> float(mappings.logit_scale(mappings.n_aware_free(num_candidates=10)))   # s(10)
    2.0
    >>> mappings.logit_scale(mappings.calibrated_free()) is None           # solved per batch
    True
    >>> float(mappings.logit_scale(mappings.calibrated_free().bind(scale=3.0)))
    3.0

  Args:
    mapping: a mapping from `temperature`, `learnable_temperature`, `learnable_free` or
      `n_aware_free`.
    params: the learnable mapping's `{"t": ...}` to read instead of `mapping.params`.

  Returns:
    A float scalar array; for a batch-scaled mapping its bound scale, or None.

  Raises:
    TypeError: `mapping` has no single logit scale.
  """
  if isinstance(mapping, Mapping):
    scale = mapping.fn.logit_scale(mapping.params if params is None else params)
    if scale is not None or isinstance(mapping.fn, BatchScaled):
      return scale
  spec = mapping.spec if isinstance(mapping, Mapping) else type(mapping).__name__
  raise TypeError(f"mapping must be a fixed or learnable temperature (cos / tau, "
                  f"min(exp(t), max_scale) cos) or a scaled free mapping (s 2 artanh(cos)) to have "
                  f"a logit scale; got {spec!r}.")


def max_logit_scale(mapping: Mapping) -> float | None:
  """The cap on a learnable mapping's logit scale, `max_scale` of `min(exp(t), max_scale)`, or None.

  CLIP caps its learnt scale at 100 (spec `learnable=0.07:100`); a scale that reaches the cap
  stops learning. None for an uncapped learnable mapping and for every mapping without a learnt
  scale.

  Examples:
    >>> from tfcl_jax import mappings
    >>> mappings.max_logit_scale(mappings.from_spec("learnable=0.07:100"))
    100.0
    >>> mappings.max_logit_scale(mappings.from_spec("learnable_free")) is None
    True

  Args:
    mapping: any `Mapping`.
  """
  if not isinstance(mapping, Mapping):
    raise TypeError(f"mapping must be a Mapping, got {type(mapping).__name__}.")
  return mapping.fn.max_logit_scale()


@dataclasses.dataclass(frozen=True)
class _Annealed(MappingFunction):
  """`cos / schedule(step)`."""

  schedule: schedules.Schedule

  def __call__(self, cos, params, step):
    return cos / self.schedule(step).astype(cos.dtype)

  def parameter_checks(self, params, step) -> tuple[ParameterCheck, ...]:
    return (positive_check("tau = schedule(step)", self.schedule(step)),)


def annealed_temperature(schedule: schedules.Schedule, *, spec: str = "anneal") -> Mapping:
  """Division by a scheduled temperature, `cos / schedule(step)`.

  The schedule's `tau` at the bound step is checked (finite, > 0) by the losses'
  `check_finite="checkify"`, like a traced `temperature(tau)`; the schedules of
  `tfcl_jax.schedules` stay above 0 by construction.

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


@SPECS.register("anneal=log:T0", named=True, T0=specs.Positive("tau0"),
                help="cos / tau(step), tau = T0 / log(step + 2)")
def _log_annealed(*, tau0: float, spec: str) -> Mapping:
  return annealed_temperature(schedules.logarithmic(tau0=tau0), spec=spec)


@SPECS.register("anneal=KIND:T0:T1:S", named=True,
                KIND=specs.Choice("kind", ("linear", "exp", "cosine")),
                T0=specs.Positive("tau_start"), T1=specs.Positive("tau_end"),
                S=specs.Count("steps"),
                help="cos / tau(step), tau from T0 to T1 over S steps, KIND linear, exp or cosine")
def _interpolated(*, kind: str, tau_start: float, tau_end: float, steps: int,
                  spec: str) -> Mapping:
  schedule = schedules.SCHEDULES[kind](tau_start=tau_start, tau_end=tau_end, steps=steps)
  return annealed_temperature(schedule, spec=spec)
