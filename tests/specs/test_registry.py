"""`tfcl_jax.specs`: a registry's parser, canonical strings, errors and table, read from the forms
registered (their args and patterns, `_args` and `_forms`, through it); docs/specs.md holds the
tables of the library's registries, and the API pages their packages' names."""

from __future__ import annotations

import re

import pytest

from docs import make_specs
from tfcl_jax import losses, mappings, specs


def _registry():
  """A registry of the grammar's every feature: a nested optional pair with a written default,
  an optional value without one, a count the loss fills in, a choice, a check across values."""
  shapes = specs.Registry("shape spec", "shape")
  shapes.register("box[=W[:H]]", lambda width, height=None: ("box", width, height),
                  W=specs.Positive("width", default=1.0), H=specs.Positive("height"),
                  help="a box, W by H")
  shapes.register("dot", lambda: ("dot",), help="a dot")
  shapes.register("ring[=N]", lambda sides: ("ring", sides),
                  N=specs.Count("sides", minimum=3, default=specs.CANDIDATES),
                  help="N sides; N left out: the candidates")
  shapes.register("wave=KIND:S", lambda kind, steps: ("wave", kind, steps),
                  KIND=specs.Choice("kind", ("sine", "saw")), S=specs.Count("steps"),
                  help="a wave of S steps")
  shapes.register("span=A:B", lambda low, high: ("span", low, high),
                  A=specs.Positive("low"), B=specs.Positive("high"),
                  check=lambda low, high: _ordered(low, high), help="from A to B")
  return shapes


def _ordered(low, high):
  if high < low:
    raise ValueError(f"high must be >= low, got low={low}, high={high}.")


@pytest.mark.parametrize("text, canonical, built", [
    ("box", "box=1", ("box", 1.0, None)),              # the default is written
    (" box = 2.50 ", "box=2.5", ("box", 2.5, None)),   # spaces dropped, g format
    ("box=2:3e0", "box=2:3", ("box", 2.0, 3.0)),
    ("dot", "dot", ("dot",)),
    ("ring=05", "ring=5", ("ring", 5)),
    ("wave=saw:10", "wave=saw:10", ("wave", "saw", 10)),
    ("span=1:1", "span=1:1", ("span", 1.0, 1.0)),
])
def test_canonical_spec_and_build(text, canonical, built):
  parsed = _registry().parse(text)
  assert parsed.spec == canonical and not parsed.needs_candidates
  assert parsed.build() == built
  assert _registry().parse(canonical).spec == canonical


def test_a_count_the_candidates_fill_in():
  parsed = _registry().parse("ring")
  assert parsed.spec == "ring" and parsed.needs_candidates
  assert parsed.build(7) == ("ring", 7)
  with pytest.raises(ValueError, match=re.escape("Invalid shape spec 'ring': N needs "
                                                 "num_candidates")):
    parsed.build()


@pytest.mark.parametrize("text, reason", [
    ("bx=2", "'bx=2' is not a shape spec: no shape is named 'bx'; did you mean 'box'?"),
    ("box=0", "width must be a finite number > 0, got 0.0."),
    ("box=a", "'box=a' is not a shape spec: expected box[=W[:H]]"),
    ("box=1:2:3", "expected box[=W[:H]]"),
    ("wave=tri:3", "expected wave=KIND:S; kind is one of sine, saw"),
    ("ring=2", "sides must be an int >= 3, got 2."),
    ("span=2:1", "high must be >= low, got low=2.0, high=1.0."),
    ("dot:1", "expected dot; ':' belongs to box[=W[:H]], span=A:B, wave=KIND:S"),
    ("", "'' is not a shape spec: it is empty"),
])
def test_errors_say_what_is_wrong_then_the_forms(text, reason):
  with pytest.raises(ValueError) as error:
    _registry().parse(text)
  first, accepted, *forms = str(error.value).splitlines()
  assert first.startswith(f"Invalid shape spec {text!r}: ") and first.endswith(reason)
  assert accepted == "Accepted forms:" and len(forms) == 5  # every form, one a line
  assert re.fullmatch(r"  span=A:B +from A to B", forms[3])


def test_not_a_string():
  with pytest.raises(TypeError, match="shape spec must be a str, got float"):
    _registry().parse(1.0)


def test_flags_and_named_builders_and_nested_specs():
  shapes = _registry()
  drawings = specs.Registry("drawing spec", "drawing", named=True,
                            args={"shape": specs.Nested("shape", shapes)})
  drawings.register("<shape>[+filled]", lambda spec, shape, filled: (spec, shape, filled),
                    help="a shape")
  drawings.register("framed:<shape>", lambda spec, shape: (spec, shape, "framed"),
                    help="a framed shape")
  assert drawings.parse("box=2+filled").build() == ("box=2+filled", ("box", 2.0, None), True)
  assert drawings.parse("framed:ring").build(5) == ("framed:ring", ("ring", 5), "framed")
  with pytest.raises(ValueError, match=re.escape(
      "+filled goes with <shape>[+filled] only; framed:<shape> (a framed shape) takes none")):
    drawings.parse("framed:dot+filled")
  with pytest.raises(ValueError, match=re.escape("no shape is named 'bx'")) as error:
    drawings.parse("framed:bx")
  assert "where <shape> is a shape spec:\n  box[=W[:H]]" in str(error.value)
  with pytest.raises(ValueError, match="nothing precedes \\+filled"):
    drawings.parse("+filled")


@pytest.mark.parametrize("pattern, args, message", [
    ("cone=R", {}, "metavariables \\['R'\\], each once"),
    ("cone", {"R": specs.Positive("radius")}, "got args for \\['R'\\]"),
    ("cone=R:R", {"R": specs.Positive("radius")}, "each once"),
    ("cone=[R", {"R": specs.Positive("radius")}, "not lowercase text"),
    ("cone]", {}, "closes a group"),
    ("Cone", {}, "metavariables \\['C'\\]"),
    ("box[=W[:H]]", {"W": specs.Positive("w"), "H": specs.Positive("h")}, "registered already"),
])
def test_registration_errors(pattern, args, message):
  with pytest.raises(ValueError, match=message):
    _registry().register(pattern, lambda **kwargs: None, help="x", **args)


def test_reserved_characters_and_help_lines():
  reserved = specs.Registry("part spec", "part", reserved="/")
  with pytest.raises(ValueError, match="reserved"):
    reserved.register("a/b", lambda: None, help="x")
  with pytest.raises(ValueError, match="one line"):
    reserved.register("a", lambda: None, help="two\nlines")


def test_decorator_unregister_and_live_lines():
  shapes = _registry()
  lines = specs.FormLines(shapes)
  count = len(lines)

  @shapes.register("tall_cone=R", help="a tall cone", fixed={"tall": True},
                   R=specs.Positive("radius"))
  @shapes.register("cone=R", help="a cone", R=specs.Positive("radius"))
  def cone(*, radius, tall=False):
    return ("cone", radius, tall)

  assert cone(radius=1.0) == ("cone", 1.0, False)  # the decorator returns the function
  assert shapes.parse("cone=2").build() == ("cone", 2.0, False)
  assert shapes.parse("tall_cone=2").build() == ("cone", 2.0, True)  # the form's fixed keywords
  assert shapes.builders()["cone"] is cone  # the public builders, each once
  assert "<lambda>" not in shapes.builders()  # a lambda's name is no public name
  shapes.unregister("tall_cone=R")
  assert len(lines) == count + 1 and any(line.startswith("cone=R") for line in lines)
  shapes.unregister("cone=R")
  assert len(lines) == count
  with pytest.raises(ValueError, match="no shape is named 'cone'"):
    shapes.parse("cone=2")
  with pytest.raises(ValueError, match="no shape spec form"):
    shapes.unregister("cone=R")


def test_table_escapes_bars():
  shapes = specs.Registry("shape spec", "shape")
  shapes.register("a", lambda: None, help="x|y")
  assert shapes.table() == "| form | the shape |\n|---|---|\n| `a` | x\\|y |\n"


def test_docs_pages_hold_what_the_registries_declare():
  for path, text in make_specs.pages().items():
    assert path.read_text() == text, f"regenerate {path}: python -m docs.make_specs"
  page = make_specs.PAGE.read_text()
  for registry in make_specs.REGISTRIES.values():
    assert registry.table() in page
  for modname, path in make_specs.API_PAGES.items():
    assert make_specs.names_block(modname) in path.read_text()


def test_no_loss_family_shadows_a_mapping():
  # A loss spec's name picks its family before any mapping: the two sets of names stay apart.
  assert losses.SPECS.names() and mappings.SPECS.names()
  assert set(losses.SPECS.names()).isdisjoint(mappings.SPECS.names())

