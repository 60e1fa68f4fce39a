"""Mappings named by their specs (`tau=0.25`, `free`, `dynamic=0.1:0.2`); grammar: docs/specs.md.

One parse step reads a mapping spec into its canonical string and a builder: `from_spec` builds the
`Mapping`, the loss-spec parser (`tfcl_jax.losses.from_spec`) reads the mapping inside a loss spec.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import NamedTuple

from tfcl_jax import _checks, schedules
from tfcl_jax.mappings._base import Mapping, MappingLike, _Plain, format_number
from tfcl_jax.mappings._dynamic import check_range, dynamic_temperature
from tfcl_jax.mappings._free import temperature_free
from tfcl_jax.mappings._scaled_free import learnable_free, n_aware_free
from tfcl_jax.mappings._temperature import annealed_temperature, learnable_temperature, temperature

#: The forms of a mapping spec, one a line (`from_spec`'s errors print them; docs/specs.md).
SPEC_FORMS = (
    "tau=T                  fixed temperature T > 0, e.g. tau=0.25",
    "free                   temperature-free 2 artanh(cos)",
    "learnable[=T0]         learnable exp(t) cos, initial temperature T0 (default 0.07)",
    "learnable=T0:MAX       the same with the scale exp(t) capped at MAX (CLIP: 0.07:100)",
    "learnable_free[=MAX]   free with a learnable scale exp(t) 2 artanh(cos), t = 0 at the start,"
    " optionally capped at MAX",
    "free_n=N               N-aware free (1 + log(N - 1)/log 9) 2 artanh(cos), N candidates",
    "free_n                 the same, N the loss's candidates per anchor (loss specs only)",
    "dynamic=TMIN:TMAX      DySTreSS per-pair temperature, e.g. dynamic=0.1:0.2",
    "anneal=log:T0          tau = T0 / log(step + 2)",
    "anneal=KIND:T0:T1:S    KIND in linear|exp|cosine, from T0 to T1 over S steps",
)

_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


class ParsedMapping(NamedTuple):
  """A mapping spec read and checked, not yet built.

  Attributes:
    spec: the canonical mapping spec (what `build().spec` is, but for `free_n`).
    build: `build() -> Mapping`; `build(num_candidates)` where `needs_candidates`.
    needs_candidates: the mapping needs the loss's candidates per anchor (`free_n`), which only
      the loss knows.
  """

  spec: str
  build: Callable[..., Mapping]
  needs_candidates: bool = False


def parse(text: str) -> ParsedMapping:
  """Reads a mapping spec (spaces ignored) into its canonical form and its builder.

  Raises:
    ValueError: the reason a spec is malformed or out of range (without the accepted forms,
      which each caller lists).
  """
  spec = text.strip().replace(" ", "")
  if spec == "free":
    return ParsedMapping("free", temperature_free)
  if match := re.fullmatch(rf"tau={_NUMBER}", spec):
    tau = _checks.positive_scalar(float(match[1]), name="tau")
    return ParsedMapping(f"tau={format_number(tau)}", functools.partial(temperature, tau))
  if spec == "learnable":
    return _learnable(0.07, None)
  if spec == "learnable_free":
    return ParsedMapping(spec, learnable_free)
  if match := re.fullmatch(rf"learnable_free={_NUMBER}", spec):
    max_scale = _checks.positive_scalar(float(match[1]), name="max_scale")
    return ParsedMapping(f"learnable_free={format_number(max_scale)}",
                     functools.partial(learnable_free, max_scale=max_scale))
  if spec == "free_n":
    return ParsedMapping(spec, _n_aware_free, needs_candidates=True)
  if match := re.fullmatch(r"free_n=([0-9]+)", spec):
    num_candidates = _checks.positive_int(int(match[1]), name="num_candidates", minimum=2)
    return ParsedMapping(f"free_n={num_candidates}",
                     functools.partial(n_aware_free, num_candidates=num_candidates))
  if match := re.fullmatch(rf"learnable={_NUMBER}(?::{_NUMBER})?", spec):
    return _learnable(float(match[1]), None if match[2] is None else float(match[2]))
  if match := re.fullmatch(rf"dynamic={_NUMBER}:{_NUMBER}", spec):
    tau_min, tau_max = float(match[1]), float(match[2])
    check_range(tau_min, tau_max)
    return ParsedMapping(f"dynamic={format_number(tau_min)}:{format_number(tau_max)}",
                     functools.partial(dynamic_temperature, tau_min, tau_max))
  if match := re.fullmatch(rf"anneal=log:{_NUMBER}", spec):
    tau0 = float(match[1])
    return _annealed(f"anneal=log:{format_number(tau0)}", schedules.logarithmic(tau0=tau0))
  if match := re.fullmatch(rf"anneal=(linear|exp|cosine):{_NUMBER}:{_NUMBER}:([0-9]+)", spec):
    kind, start, end, steps = match[1], float(match[2]), float(match[3]), int(match[4])
    schedule = schedules.SCHEDULES[kind](tau_start=start, tau_end=end, steps=steps)
    return _annealed(f"anneal={kind}:{format_number(start)}:{format_number(end)}:{steps}",
                     schedule)
  raise ValueError(f"{text.strip()!r} is not a mapping spec")


def _learnable(tau0: float, max_scale: float | None) -> ParsedMapping:
  _checks.positive_scalar(tau0, name="initial temperature")
  spec = f"learnable={format_number(tau0)}"
  if max_scale is not None:
    _checks.positive_scalar(max_scale, name="max_scale")
    spec = f"{spec}:{format_number(max_scale)}"
  return ParsedMapping(
      spec, functools.partial(learnable_temperature, tau=tau0, max_scale=max_scale))


def _n_aware_free(num_candidates: int) -> Mapping:
  return n_aware_free(num_candidates=num_candidates)


def _annealed(spec: str, schedule: schedules.Schedule) -> ParsedMapping:
  return ParsedMapping(spec, functools.partial(annealed_temperature, schedule, spec=spec))


def from_spec(text: str) -> Mapping:
  """Builds a mapping from its mapping spec, for configs and command lines.

  Accepted forms (`SPEC_FORMS`; docs/specs.md): `tau=0.25`, `free`, `learnable`,
  `learnable=0.07`, `learnable=0.07:100` (CLIP's cap), `learnable_free`, `learnable_free=100`,
  `free_n=511`, `dynamic=0.1:0.2`, `anneal=log:0.5`, `anneal=cosine:0.5:0.1:1000` (also
  `linear`, `exp`). A loss spec (`tfcl_jax.losses.from_spec`) names a loss together with its
  mapping; only there may `free_n` leave out `N`, which the loss fills in.

  Examples:
    >>> from tfcl_jax import mappings
    >>> mappings.from_spec("tau=0.25")(0.5).item()
    2.0
    >>> mappings.from_spec(" free ").spec
    'free'
    >>> mappings.from_spec("learnable_free=100").params
    {'t': Array(0., dtype=float32)}

  Raises:
    TypeError: `text` is not a str.
    ValueError: for unknown or malformed specs, listing the accepted forms; `free_n` without
      its candidate count.
  """
  if not isinstance(text, str):
    raise TypeError(f"mapping spec must be a str, got {type(text).__name__}.")
  try:
    parsed = parse(text)
  except ValueError as error:
    forms = "\n  ".join(SPEC_FORMS)
    message = f"Invalid mapping spec {text!r}: {error}\nAccepted forms:\n  {forms}"
    raise ValueError(message) from None
  if parsed.needs_candidates:
    raise ValueError(
        f"Mapping spec {text!r} needs the candidates per anchor N, which only a loss knows: build "
        f"it with mappings.n_aware_free(num_candidates=N) or the mapping spec 'free_n=N', or pass "
        f"{parsed.spec!r} to a loss (mapping={parsed.spec!r}), which fills in its own N.")
  return parsed.build()


def as_mapping(mapping: MappingLike | None, *, num_candidates: int | None = None) -> Mapping:
  """`mapping` as a `Mapping`: a `Mapping` as is, a mapping spec through `from_spec`, a plain
  callable `cos -> logits` wrapped, None as the default mapping of every loss (Eq. 11).

  Every function that takes a `mapping` (the losses, the analysis) reads it here. A loss
  passes its candidates per anchor as `num_candidates`, which fills in the spec `free_n`
  (`n_aware_free`): `losses.info_nce(z1, z2, mapping="free_n")` scales by its own `N`.

  Examples:
    >>> from tfcl_jax import mappings
    >>> mappings.as_mapping(lambda cos: 3.0 * cos)(0.5).item()
    1.5
    >>> mappings.as_mapping("tau=0.25").spec      # the same as mappings.from_spec("tau=0.25")
    'tau=0.25'
    >>> mappings.as_mapping(None).spec
    'free'
    >>> mappings.as_mapping("free_n", num_candidates=511).spec   # N from the loss
    'free_n=511'

  Args:
    mapping: a `Mapping`, a mapping spec, a callable `cos -> logits`, or None.
    num_candidates: the loss's candidates per anchor, an int >= 2, used only by the spec
      `free_n`; None where no loss is in sight (then `free_n` needs its `N`: `free_n=N`).

  Raises:
    TypeError: `mapping` is neither a `Mapping`, a str, a callable nor None.
    ValueError: a str that is not a mapping spec (the message lists `SPEC_FORMS`), or `free_n`
      without `num_candidates`.
  """
  if mapping is None:
    return temperature_free()
  if isinstance(mapping, Mapping):
    return mapping
  if isinstance(mapping, str):
    if num_candidates is not None:
      try:
        parsed = parse(mapping)
      except ValueError:
        parsed = None  # from_spec below says what is wrong, with the accepted forms
      if parsed is not None and parsed.needs_candidates:
        return parsed.build(_checks.positive_int(num_candidates, name="num_candidates",
                                                 minimum=2))
    return from_spec(mapping)
  if not callable(mapping):
    raise TypeError(
        f"mapping must be a callable cos -> logits (a tfcl_jax.mappings.Mapping or a plain "
        f"function), a mapping spec string such as 'free' or 'tau=0.1' (mappings.from_spec), or "
        f"None (the temperature-free mapping); got {type(mapping).__name__}.")
  return Mapping("callable", _Plain(lambda cos, params, step: mapping(cos)))
