"""`Registry`: the forms of one kind of spec, each registered beside what it builds, and the parser,
errors, help lines and docs table read from them; `Nested`, a spec of another registry inside."""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import re
from collections.abc import Callable, Mapping
from typing import Any

from tfcl_jax.specs._args import Arg
from tfcl_jax.specs._forms import Form, ParsedSpec

_SEPARATORS = "/:+="


class SpecError(ValueError):
  """Why a text is not a spec, without the accepted forms (`Registry.parse` adds them)."""


@dataclasses.dataclass(frozen=True)
class Nested(Arg):
  """A spec of another registry (a loss spec's `<mapping>`), its value a `ParsedSpec`."""

  name: str
  registry: Registry
  default: None = None

  @property
  def regex(self) -> str:
    reserved = re.escape(self.registry.reserved)
    return f"[^{reserved}]+?" if reserved else ".+?"

  def read(self, text):
    return self.registry.read(text)

  def write(self, value):
    return value.spec


class Registry:
  """The forms of one kind of spec, each registered beside what it builds.

  Examples:
    >>> from tfcl_jax import specs
    >>> shapes = specs.Registry("shape spec", "shape")
    >>> form = shapes.register("box=W[:H]", lambda width, height=None: (width, height or width),
    ...                        W=specs.Positive("width"), H=specs.Positive("height"),
    ...                        help="a W x H box (H = W when left out)")
    >>> parsed = shapes.parse(" box = 2.0 ")
    >>> parsed.spec, parsed.build()
    ('box=2', (2.0, 2.0))
    >>> shapes.lines()
    ('box=W[:H]  a W x H box (H = W when left out)',)
    >>> shapes.parse("bx=2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Invalid shape spec 'bx=2': ... no shape is named 'bx'; did you mean 'box'?
    Accepted forms:
      box=W[:H]  a W x H box (H = W when left out)

  Args:
    kind: what errors call a spec (`"mapping spec"`).
    noun: what errors call the object (`"mapping"`).
    named: whether builders take the canonical spec as `spec=` (a form may say otherwise).
    reserved: characters no form's text holds: they separate the spec of an outer registry
      (`"/"`: a loss spec's options follow its mapping spec after `/`).
    args: metavariables every form may use without declaring them (a loss spec's `<mapping>`).
  """

  def __init__(self, kind: str, noun: str, *, named: bool = False, reserved: str = "",
               args: Mapping[str, Arg] | None = None):
    self.kind, self.noun, self.named, self.reserved = kind, noun, named, reserved
    self._args = dict(args or {})
    self._forms: list[Form] = []

  def register(self, pattern: str, build: Callable[..., Any] | None = None, *, help: str,
               check: Callable[..., None] | None = None, named: bool | None = None,
               fixed: Mapping[str, Any] | None = None, **args: Arg) -> Any:
    """Declares a form: `pattern`, its builder and help line, an `Arg` per metavariable.

    A pattern is lowercase text (`=`, `:`, `/`, `+` included), metavariables (an uppercase word,
    `T0`, or `<name>`) and `[optional]` groups, which nest; a trailing `[+word]` is a flag. The
    builder gets each metavariable's value by its arg's name, each flag as a bool and the
    keywords `fixed` (what the form sets, e.g. `symmetric=True` for `clip:`). Without `build`, a
    decorator that registers the function or class it decorates, beside its code::

      @SPECS.register("free", help="temperature-free 2 artanh(cos) (Eq. 11)")
      def temperature_free() -> Mapping:
        ...

    Returns:
      The `Form` (to `unregister`), or the decorator.

    Raises:
      ValueError: a malformed pattern, a metavariable without an arg or an arg without a
        metavariable, a reserved character, a pattern registered already, a help that is not
        one line.
    """
    if build is None:
      def decorate(function):
        self.register(pattern, function, help=help, check=check, named=named, fixed=fixed,
                      **args)
        return function

      return decorate
    if any(form.pattern == pattern for form in self._forms):
      raise ValueError(f"{self.kind} form {pattern!r} is registered already.")
    form = Form.compile(pattern, build, help=help, kind=self.kind, noun=self.noun, args=args,
                        shared=self._args, check=check,
                        named=self.named if named is None else named, reserved=self.reserved,
                        fixed=fixed)
    self._forms.append(form)
    return form

  def unregister(self, form: Form | str) -> None:
    """Removes a form (or the form of a pattern)."""
    found = [f for f in self._forms if f is form or f.pattern == form]
    if not found:
      raise ValueError(f"no {self.kind} form {form!r} is registered.")
    self._forms.remove(found[0])

  @property
  def forms(self) -> tuple[Form, ...]:
    """The forms, those without a name first, then by name (in registration order within)."""
    return tuple(sorted(self._forms, key=lambda form: (form.name != "", form.name)))

  def builders(self) -> dict[str, Callable[..., Any]]:
    """The public builders of the forms by their names (a `__name__` that is an identifier
    without a leading underscore), each once, in the order of `forms`: what a package exports of
    its registry."""
    return {form.build.__name__: form.build for form in self.forms
            if _public(getattr(form.build, "__name__", ""))}

  def names(self) -> list[str]:
    """The names of the forms, each once, sorted."""
    return sorted({form.name for form in self._forms if form.name})

  def lines(self) -> tuple[str, ...]:
    """One line per form, `pattern  help`, as errors list them."""
    width = max((len(form.pattern) for form in self._forms), default=0) + 2
    return tuple(f"{form.pattern:<{width}}{form.help}" for form in self.forms)

  def table(self) -> str:
    """The forms as a Markdown table (docs/specs.md)."""
    rows = [f"| `{form.pattern}` | {form.help.replace('|', chr(92) + '|')} |"
            for form in self.forms]
    return "\n".join([f"| form | the {self.noun} |", "|---|---|", *rows]) + "\n"

  def read(self, text: str) -> ParsedSpec:
    """`parse` without the accepted forms in its errors: a `SpecError` says what is wrong."""
    stem = text.strip().replace(" ", "")
    flags = set()
    for flag in {flag for form in self._forms for flag in form.flags}:
      if stem.endswith(flag):
        stem = stem[:-len(flag)]
        flags.add(flag)
    if not stem:
      raise SpecError(f"{text!r} is not a {self.kind}: " + (
          f"nothing precedes {' and '.join(sorted(flags))}" if flags else "it is empty"))
    head = re.match(r"[A-Za-z0-9_]*", stem)[0]  # pyright: ignore[reportOptionalSubscript]
    candidates = [form for form in self.forms if form.name == head]
    default = not candidates
    if default:
      candidates = [form for form in self.forms if not form.name]
    if not candidates:
      raise SpecError(f"{stem!r} is not a {self.kind}: no {self.noun} is named {head!r}"
                      + self._suggest(head))
    for form in candidates:
      match = form.regex.fullmatch(stem)
      if match is not None:
        refused = sorted(flags - set(form.flags))
        if refused:
          takers = ", ".join(f.pattern for f in self.forms if refused[0] in f.flags)
          raise SpecError(f"{refused[0]} goes with {takers} only; {form.pattern} ({form.help}) "
                          f"takes none")
        return form.read(match, flags)
    notes = [note for form in candidates for arg in form.args.values() if (note := arg.note())]
    raise SpecError(f"{stem!r} is not a {self.kind}: expected "
                    + " or ".join(form.pattern for form in candidates)
                    + "".join(f"; {note}" for note in dict.fromkeys(notes))
                    + self._separators(stem, candidates)
                    + (self._suggest(head) if default and head else ""))

  def parse(self, text: str) -> ParsedSpec:
    """Reads a spec (spaces ignored) into its canonical form and its builder.

    Raises:
      TypeError: `text` is not a str.
      ValueError: what is wrong, then the accepted forms (and those of the specs it nests).
    """
    if not isinstance(text, str):
      raise TypeError(f"{self.kind} must be a str, got {type(text).__name__}.")
    try:
      return self.read(text)
    except ValueError as error:
      raise ValueError(self.message(text, str(error))) from None

  def message(self, text: str, reason: str) -> str:
    """An error about `text`: `reason`, then the accepted forms (and those of nested specs)."""
    lines = [f"Invalid {self.kind} {text!r}: {reason}", "Accepted forms:",
             *(f"  {line}" for line in self.lines())]
    nested = {key: arg.registry for form in self.forms for key, arg in form.args.items()
              if isinstance(arg, Nested)}
    for key, registry in nested.items():
      lines += [f"where <{key}> is a {registry.kind}:", *(f"  {line}" for line in registry.lines())]
    return "\n".join(lines)

  def _suggest(self, head: str) -> str:
    close = difflib.get_close_matches(head.lower(), self.names(), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(map(repr, close))}?" if close else ""

  def _separators(self, stem: str, candidates: list[Form]) -> str:
    """Where `stem` holds a separator that none of `candidates` takes but other forms have."""
    for char in _SEPARATORS:
      if char not in stem or any(
          char in form.literal + "".join(form.flags)
          or any(re.fullmatch(arg.regex, char) for arg in form.args.values())
          for form in candidates):
        continue
      owners = [form.pattern for form in self.forms if char in form.literal]
      if owners:
        return f"; {char!r} belongs to {', '.join(owners)}"
    return ""


def _public(name: str) -> bool:
  return name.isidentifier() and not name.startswith("_")


class FormLines(collections.abc.Sequence):
  """The forms of a registry, one line each (`Registry.lines`), read when used: a form
  registered later shows up."""

  def __init__(self, registry: Registry):
    self._registry = registry

  def __getitem__(self, index):
    return self._registry.lines()[index]

  def __len__(self):
    return len(self._registry.lines())

  def __repr__(self):
    return repr(self._registry.lines())
