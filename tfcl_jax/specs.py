"""Spec registries: each form of a spec string declared once, beside the code that builds it.

A spec names an object by a short string for configs and command lines (`tau=0.25`,
`sigmoid/free/learn_b=prior`). A `Registry` holds the forms of one kind of spec, each declared by
one `Registry.register` call in the module of what it builds: its pattern, the typed arguments of
its metavariables, its builder and one help line. The parser, the forms that errors list, the
names suggested for a misspelt one and the tables of docs/specs.md are all read from there
(`tfcl_jax.mappings.SPECS`, `tfcl_jax.losses.SPECS`).
"""

from __future__ import annotations

import abc
import collections.abc
import dataclasses
import difflib
import re
from collections.abc import Callable, Mapping
from typing import Any

from tfcl_jax import _checks

__all__ = ["CANDIDATES", "NUMBER", "Arg", "Choice", "Count", "Deferred", "Form", "FormLines",
           "Nested", "ParsedSpec", "Positive", "Registry", "SpecError"]

#: A number as a spec writes it (`0.25`, `1e-05`, `-2`).
NUMBER = r"[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"
_TOKEN = re.compile(r"\[|\]|[A-Z][A-Z0-9_]*|<[a-z_]+>|[a-z0-9_=:/+.\-]+")
_SEPARATORS = "/:+="


class SpecError(ValueError):
  """Why a text is not a spec, without the accepted forms (`Registry.parse` adds them)."""


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


@dataclasses.dataclass(frozen=True, eq=False)
class Form:
  """One form of a spec: `pattern`, its metavariables' `args`, `build`, one `help` line.

  Attributes:
    pattern: the form as docs and errors show it (`learnable[=T0[:MAX]]`).
    build: called with the values by their args' names, those left out without a value omitted
      (the builder's defaults apply), each flag as a bool, and `spec=` the canonical spec where
      `named`.
    help: one line: what the form builds.
    kind, noun: its registry's names of a spec and of what it builds (`"mapping spec"`,
      `"mapping"`).
    args: metavariable -> `Arg`.
    check: called like `build` (without `spec` and the values the candidates complete) to check
      the values together, raising `ValueError`; None: no such check.
    named: whether `build` takes the canonical spec as `spec=`.
    name: the leading word of the pattern, by which a spec finds its forms; `""` for a pattern
      that starts with a metavariable, which takes every spec whose name no form has.
    flags: the trailing `[+word]` groups: a spec ending with `+word` passes `word=True`.
  """

  pattern: str
  build: Callable[..., Any]
  help: str
  kind: str
  noun: str
  args: Mapping[str, Arg]
  check: Callable[..., None] | None
  named: bool
  name: str
  flags: tuple[str, ...]
  nodes: tuple = dataclasses.field(repr=False)
  regex: re.Pattern = dataclasses.field(repr=False)
  literal: str = dataclasses.field(repr=False)

  def read(self, match: re.Match, flags: collections.abc.Set[str]) -> ParsedSpec:
    """The form's `ParsedSpec` of a full match of `regex`, its values read and checked."""
    values, given = {}, set()
    for key, arg in self.args.items():
      text = match[key]
      if text is None:
        values[key] = arg.default
      else:
        values[key] = arg.read(text)
        given.add(key)
    if self.check is not None:
      self.check(**{self.args[key].name: value for key, value in values.items()
                    if value is not None and not isinstance(value, Deferred)})
    spec = _write(self.nodes, self.args, values, given) + "".join(
        flag for flag in self.flags if flag in flags)
    return ParsedSpec(spec, self, {key: values[key] for key in self.args},
                      frozenset(flag[1:] for flag in flags))


@dataclasses.dataclass(frozen=True, eq=False)
class ParsedSpec(Deferred):
  """A spec read and checked, not yet built: its canonical text and what builds it.

  Attributes:
    spec: the canonical spec (what result tables and `Mapping.spec` or `Loss.spec` hold).
    form: the `Form` it matched.
    values: metavariable -> its value (a `Deferred` where the candidates complete it).
    flags: the flags it sets (`{"logq"}` for `free+logq`).
  """

  spec: str
  form: Form
  values: Mapping[str, Any]
  flags: frozenset[str] = frozenset()

  @property
  def needs_candidates(self) -> bool:
    """Whether `build` needs the candidates per anchor (`free_n`, a `prior` bias)."""
    return any(isinstance(value, Deferred) and value.needs_candidates
               for value in self.values.values())

  def needing(self) -> str:
    return f"the {self.form.noun} {self.spec!r}"

  def build(self, num_candidates: int | None = None) -> Any:
    """The object the spec names; `num_candidates`: the candidates per anchor, needed where
    `needs_candidates`.

    Raises:
      ValueError: `num_candidates` is None where it is needed, naming what needs it.
    """
    if num_candidates is None and self.needs_candidates:
      needing = [key if value is CANDIDATES else value.needing()
                 for key, value in self.values.items()
                 if isinstance(value, Deferred) and value.needs_candidates]
      raise ValueError(f"Invalid {self.form.kind} {self.spec!r}: {' and '.join(needing)} "
                       f"need{'s' if len(needing) == 1 else ''} num_candidates (the candidates "
                       "per anchor, losses.num_candidates).")
    kwargs = {self.form.args[key].name: value.build(num_candidates)
              if isinstance(value, Deferred) else value
              for key, value in self.values.items() if value is not None}
    kwargs.update({flag[1:]: flag[1:] in self.flags for flag in self.form.flags})
    if self.form.named:
      kwargs["spec"] = self.spec
    return self.form.build(**kwargs)


def _parse_pattern(pattern: str) -> tuple:
  """The nodes of a pattern: `("lit", text)`, `("var", key)`, `("opt", nodes)`."""
  stack: list[list] = [[]]
  position = 0
  for token in _TOKEN.finditer(pattern):
    if token.start() != position:
      break
    position = token.end()
    text = token[0]
    if text == "[":
      stack.append([])
    elif text == "]":
      if len(stack) == 1:
        raise ValueError(f"pattern {pattern!r} closes a group it did not open.")
      group = tuple(stack.pop())
      stack[-1].append(("opt", group))
    elif text[0].isupper() or text[0] == "<":
      stack[-1].append(("var", text.strip("<>")))
    else:
      stack[-1].append(("lit", text))
  if position != len(pattern) or len(stack) != 1:
    raise ValueError(f"pattern {pattern!r} is not lowercase text, metavariables (T0, <mapping>) "
                     "and [optional] groups.")
  return tuple(stack[0])


def _keys(nodes) -> list[str]:
  keys = []
  for kind, value in nodes:
    keys += [value] if kind == "var" else _keys(value) if kind == "opt" else []
  return keys


def _regex(nodes, args: Mapping[str, Arg]) -> str:
  parts = []
  for kind, value in nodes:
    if kind == "lit":
      parts.append(re.escape(value))
    elif kind == "var":
      parts.append(f"(?P<{value}>{args[value].regex})")
    else:
      parts.append(f"(?:{_regex(value, args)})?")
  return "".join(parts)


def _write(nodes, args, values, given) -> str:
  """The canonical text: an optional group is written where one of its metavariables was given
  or has a default to write (`learnable` is `learnable=0.07`; `learnable_free` stays)."""
  parts = []
  for kind, value in nodes:
    if kind == "lit":
      parts.append(value)
    elif kind == "var":
      parts.append(args[value].write(values[value]))
    elif any(key in given or (values[key] is not None and not isinstance(values[key], Deferred))
             for key in _keys(value)):
      parts.append(_write(value, args, values, given))
  return "".join(parts)


def _is_flag(node) -> bool:
  """Whether a node is an optional `+word` alone, a flag."""
  kind, value = node
  return (kind == "opt" and len(value) == 1 and value[0][0] == "lit"
          and re.fullmatch(r"\+[a-z_]+", value[0][1]) is not None)


def _literal(nodes) -> str:
  return "".join(value if kind == "lit" else _literal(value) if kind == "opt" else ""
                 for kind, value in nodes)


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
               **args: Arg) -> Any:
    """Declares a form: `pattern`, its builder and help line, an `Arg` per metavariable.

    A pattern is lowercase text (`=`, `:`, `/`, `+` included), metavariables (an uppercase word,
    `T0`, or `<name>`) and `[optional]` groups, which nest; a trailing `[+word]` is a flag. The
    builder gets each metavariable's value by its arg's name and each flag as a bool. Without
    `build`, a decorator that registers the function it decorates.

    Returns:
      The `Form` (to `unregister`), or the decorator.

    Raises:
      ValueError: a malformed pattern, a metavariable without an arg or an arg without a
        metavariable, a reserved character, a pattern registered already, a help that is not
        one line.
    """
    if build is None:
      def decorate(function):
        self.register(pattern, function, help=help, check=check, named=named, **args)
        return function

      return decorate
    nodes = _parse_pattern(pattern)
    keys = _keys(nodes)
    declared = {**{key: arg for key, arg in self._args.items() if key in keys}, **args}
    if sorted(keys) != sorted(declared) or len(set(keys)) != len(keys):
      raise ValueError(f"pattern {pattern!r} has the metavariables {keys}, each once; got args "
                       f"for {sorted(declared)}.")
    flags = []
    while nodes and _is_flag(nodes[-1]):
      flags.insert(0, nodes[-1][1][0][1])
      nodes = nodes[:-1]
    literal = _literal(nodes)
    if any(char in literal + "".join(flags) for char in self.reserved):
      raise ValueError(f"pattern {pattern!r} holds a character reserved for an outer spec "
                       f"({self.reserved!r}).")
    if not help.strip() or "\n" in help:
      raise ValueError(f"help of {pattern!r} must be one line, got {help!r}.")
    if any(form.pattern == pattern for form in self._forms):
      raise ValueError(f"{self.kind} form {pattern!r} is registered already.")
    name = re.match(r"[a-z][a-z0-9_]*", pattern)
    form = Form(pattern, build, help.strip(), self.kind, self.noun, declared, check,
                self.named if named is None else named, name[0] if name else "", tuple(flags),
                nodes, re.compile(_regex(nodes, declared)), literal)
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
