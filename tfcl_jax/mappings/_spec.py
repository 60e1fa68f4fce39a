"""Mappings named by short spec strings (`tau=0.25`, `free`, `dynamic=0.1:0.2`), for configs."""

from __future__ import annotations

import re

from tfcl_jax import _checks, schedules
from tfcl_jax.mappings._base import Mapping, format_number
from tfcl_jax.mappings._dynamic import dynamic_temperature
from tfcl_jax.mappings._free import temperature_free
from tfcl_jax.mappings._temperature import annealed_temperature, learnable_temperature, temperature

#: The forms of a mapping spec, one a line (`from_spec`'s errors print them).
SPEC_FORMS = (
    "tau=T                  fixed temperature T > 0, e.g. tau=0.25",
    "free                   temperature-free 2 artanh(cos)",
    "learnable[=T0]         learnable exp(t) cos, initial temperature T0 (default 0.07)",
    "learnable=T0:MAX       the same with the scale exp(t) capped at MAX (CLIP: 0.07:100)",
    "dynamic=TMIN:TMAX      DySTreSS per-pair temperature, e.g. dynamic=0.1:0.2",
    "anneal=log:T0          tau = T0 / log(step + 2)",
    "anneal=KIND:T0:T1:S    KIND in linear|exp|cosine, from T0 to T1 over S steps",
)

_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def from_spec(text: str) -> Mapping:
  """Builds a mapping from a short spec string, for configs and command lines.

  Accepted forms (see `SPEC_FORMS`): `tau=0.25`, `free`, `learnable`,
  `learnable=0.07`, `learnable=0.07:100` (CLIP's cap), `dynamic=0.1:0.2`, `anneal=log:0.5`,
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
  if match := re.fullmatch(rf"learnable={_NUMBER}:{_NUMBER}", spec):
    tau0 = _checks.positive_scalar(float(match[1]), name="initial temperature")
    return learnable_temperature(tau=tau0, max_scale=float(match[2]))
  if match := re.fullmatch(rf"learnable={_NUMBER}", spec):
    tau0 = _checks.positive_scalar(float(match[1]), name="initial temperature")
    return learnable_temperature(tau=tau0)
  if match := re.fullmatch(rf"dynamic={_NUMBER}:{_NUMBER}", spec):
    return dynamic_temperature(float(match[1]), float(match[2]))
  if match := re.fullmatch(rf"anneal=log:{_NUMBER}", spec):
    tau0 = float(match[1])
    schedule = schedules.logarithmic(tau0=tau0)
    return annealed_temperature(schedule, spec=f"anneal=log:{format_number(tau0)}")
  if match := re.fullmatch(rf"anneal=(linear|exp|cosine):{_NUMBER}:{_NUMBER}:([0-9]+)", spec):
    kind, start, end, steps = match[1], float(match[2]), float(match[3]), int(match[4])
    schedule = schedules.SCHEDULES[kind](tau_start=start, tau_end=end, steps=steps)
    return annealed_temperature(
        schedule, spec=f"anneal={kind}:{format_number(start)}:{format_number(end)}:{steps}")
  raise ValueError("not a recognised form")
