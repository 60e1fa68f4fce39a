"""One form of a spec (`Form`: a pattern, its metavariables' args, its builder and help line,
compiled to a regular expression) and a spec read by it (`ParsedSpec`), not yet built."""

from __future__ import annotations

import collections.abc
import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from tfcl_jax.specs._args import CANDIDATES, Arg, Deferred

_TOKEN = re.compile(r"\[|\]|[A-Z][A-Z0-9_]*|<[a-z_]+>|[a-z0-9_=:/+.\-]+")


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
    fixed: the keywords `build` always gets for this form (`{"symmetric": True}`).
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
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @classmethod
  def compile(cls, pattern: str, build: Callable[..., Any], *, help: str, kind: str, noun: str,
              args: Mapping[str, Arg], check: Callable[..., None] | None, named: bool,
              shared: Mapping[str, Arg] | None = None, reserved: str = "",
              fixed: Mapping[str, Any] | None = None) -> Form:
    """The form of `pattern` (`Registry.register`'s grammar) with the `args` of its
    metavariables (and those of `shared` it holds), checked: each metavariable has one arg and
    each arg one metavariable, no character of `reserved` in its text, `help` one line."""
    nodes = _parse_pattern(pattern)
    keys = _keys(nodes)
    args = {**{key: arg for key, arg in (shared or {}).items() if key in keys}, **args}
    if sorted(keys) != sorted(args) or len(set(keys)) != len(keys):
      raise ValueError(f"pattern {pattern!r} has the metavariables {keys}, each once; got args "
                       f"for {sorted(args)}.")
    flags = []
    while nodes and _is_flag(nodes[-1]):
      flags.insert(0, nodes[-1][1][0][1])
      nodes = nodes[:-1]
    literal = _literal(nodes)
    if any(char in literal + "".join(flags) for char in reserved):
      raise ValueError(f"pattern {pattern!r} holds a character reserved for an outer spec "
                       f"({reserved!r}).")
    if not help.strip() or "\n" in help:
      raise ValueError(f"help of {pattern!r} must be one line, got {help!r}.")
    name = re.match(r"[a-z][a-z0-9_]*", pattern)
    return cls(pattern, build, help.strip(), kind, noun, dict(args), check, named,
               name[0] if name else "", tuple(flags), nodes, re.compile(_regex(nodes, args)),
               literal, dict(fixed or {}))

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
    kwargs.update(self.form.fixed)
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
