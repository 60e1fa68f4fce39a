"""What a spec's metavariables stand for (`Arg`: its text, value, canonical text and default) and
values the loss's candidates complete (`Deferred`)."""

from __future__ import annotations

import abc
import dataclasses
import re
from typing import Any

from tfcl_jax import _checks

#: A number as a spec writes it (`0.25`, `1e-05`, `-2`).
NUMBER = r"[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"


class Deferred(abc.ABC):
  """A value of a spec that the loss's candidates per anchor may complete (`ParsedSpec.build`)."""

  @property
  @abc.abstractmethod
  def needs_candidates(self) -> bool:
    """Whether `build` needs `num_candidates`."""

  @abc.abstractmethod
  def build(self, num_candidates: int | None) -> Any:
    """The value, given the candidates per anchor (None where they are not known)."""

  def needing(self) -> str:
    """What needs the candidates, as an error names it (`"a prior bias"`)."""
    return "it"


class _Candidates(Deferred):
  """The default of a count that only the loss knows: its candidates per anchor."""

  @property
  def needs_candidates(self) -> bool:
    return True

  def build(self, num_candidates):
    return num_candidates

  def __repr__(self):
    return "CANDIDATES"


#: The default of a `Count` that the loss fills in with its candidates per anchor (`free_n`).
CANDIDATES = _Candidates()


class Arg(abc.ABC):
  """What a metavariable of a pattern stands for: its text (`regex`), its value (`read`, which
  checks it and raises `ValueError` naming `name`), its canonical text (`write`) and the value
  of a metavariable left out of an optional group (`default`)."""

  name: str
  default: Any = None

  @property
  def regex(self) -> str:
    """The text of a value (a regular expression without capturing groups)."""
    return NUMBER

  @abc.abstractmethod
  def read(self, text: str) -> Any:
    """The value of `text` (a match of `regex`), checked."""

  def write(self, value) -> str:
    """The canonical text of `value`."""
    return str(value)

  def note(self) -> str | None:
    """What an error adds about the values it takes (a choice's words), or None."""
    return None


@dataclasses.dataclass(frozen=True)
class Positive(Arg):
  """A finite number > 0, written in Python's `g` format (`0.50` is `0.5`)."""

  name: str
  default: float | None = None

  def read(self, text):
    return _checks.positive_scalar(float(text), name=self.name)

  def write(self, value):
    return f"{float(value):g}"


@dataclasses.dataclass(frozen=True)
class Count(Arg):
  """An int >= `minimum` (`0511` is `511`); `default=CANDIDATES`: the loss's candidates."""

  name: str
  minimum: int = 1
  default: Any = None

  @property
  def regex(self) -> str:
    return "[0-9]+"

  def read(self, text):
    return _checks.positive_int(int(text), name=self.name, minimum=self.minimum)


@dataclasses.dataclass(frozen=True)
class Choice(Arg):
  """One of the words `choices`."""

  name: str
  choices: tuple[str, ...]
  default: str | None = None

  @property
  def regex(self) -> str:
    return "|".join(map(re.escape, sorted(self.choices, key=len, reverse=True)))

  def read(self, text):
    return text

  def note(self):
    return f"{self.name} is one of {', '.join(self.choices)}"
