"""Mappings named by their specs (`tau=0.25`, `free`, `dynamic=0.1:0.2`); grammar: docs/specs.md.

The forms of a mapping spec are registered by the modules of their mappings (`SPECS`);
`from_spec` builds the `Mapping` of a spec; the loss-spec parser (`tfcl_jax.losses.from_spec`)
reads the mapping inside a loss spec through `SPECS` too.
"""

from __future__ import annotations

import importlib
import inspect

from tfcl_jax import _checks, specs
from tfcl_jax.mappings._base import Mapping, MappingLike
from tfcl_jax.mappings._free import temperature_free
from tfcl_jax.mappings._function import _Plain
from tfcl_jax.mappings._registry import SPECS


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
  parsed = SPECS.parse(text)
  if parsed.needs_candidates:
    counts = [arg for arg in parsed.form.args.values() if arg.default is specs.CANDIDATES]
    builder = getattr(parsed.form.build, "__name__", "the mapping's constructor")
    written = parsed.form.pattern.replace("[", "").replace("]", "")
    raise ValueError(
        f"Mapping spec {text!r} needs the candidates per anchor N, which only a loss knows: build "
        f"it with mappings.{builder}({', '.join(f'{arg.name}=N' for arg in counts)}) or the "
        f"mapping spec {written!r}, or pass {parsed.spec!r} to a loss (mapping={parsed.spec!r}), "
        "which fills in its own N.")
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
    TypeError: `mapping` is neither a `Mapping`, a str, a callable nor None; or a function of
      `tfcl_jax.mappings` left uncalled (`mappings.temperature_free` for
      `mappings.temperature_free()`, named in the message) or a schedule.
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
        parsed = SPECS.read(mapping)
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
  _refuse_uncalled(mapping)
  return Mapping("callable", _Plain(lambda cos, params, step: mapping(cos)))


def _refuse_uncalled(fn) -> None:
  """Refuses a public function or class of `tfcl_jax.mappings` or of `tfcl_jax.schedules` given as
  a mapping: none is a map `cos -> logits` (a constructor left uncalled,
  `mappings.temperature_free` for `mappings.temperature_free()`; a schedule)."""
  name = getattr(fn, "__name__", "")
  if getattr(importlib.import_module("tfcl_jax.schedules"), name, None) is fn:
    raise TypeError(
        f"mapping=schedules.{name} is a temperature schedule, not a mapping: anneal with "
        f"mapping=mappings.annealed_temperature(schedules.{name}(...)).bind(step=step).")
  if getattr(importlib.import_module("tfcl_jax.mappings"), name, None) is not fn:
    return
  if inspect.isclass(fn):
    raise TypeError(f"mapping=mappings.{name} is the class, not a mapping: build one, e.g. "
                    "mappings.temperature_free() or mappings.from_spec('free').")
  required = [
      parameter.name if parameter.kind in (parameter.POSITIONAL_ONLY,
                                           parameter.POSITIONAL_OR_KEYWORD)
      else f"{parameter.name}=..."
      for parameter in inspect.signature(fn).parameters.values()
      if parameter.default is parameter.empty
      and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)]
  raise TypeError(
      f"mapping=mappings.{name} is the function itself, not a mapping: did you mean "
      f"mappings.{name}({', '.join(required)})? (A mapping spec string works too, e.g. "
      f"mapping='free' or 'tau=0.1'.)")
