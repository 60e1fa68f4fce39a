"""The API reference (docs/api/*.rst) against the library, without Sphinx: every public module and
name has its page (`docs.api_names`: a module's `__all__`, each name under the path it is
defined at), every name a page lists exists, and every constructor a registry holds is exported
by its package (so that its page lists it: `python -m docs.make_specs`)."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

from docs import api_names
from tfcl_jax import losses, mappings

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs" / "api").glob("*.rst"))


def listed(text: str) -> tuple[set[str], set[tuple[str, str]]]:
  """`(modules, names)` a page documents: its `automodule`s, and `(module, name)` of every
  entry of its autosummaries under the `currentmodule` before it (`~a.b` is `a.b` there)."""
  modules = set(re.findall(r"^\.\. automodule:: (\S+)", text, flags=re.M))
  names, current, inside = set(), None, False
  for line in text.splitlines():
    if match := re.match(r"\.\. currentmodule:: (\S+)", line):
      current = match[1]
    elif line.startswith(".. autosummary::"):
      inside = True
    elif inside and line.startswith("   ") and not line.strip().startswith(":"):
      dotted = f"{current}.{line.strip().lstrip('~')}"
      module, _, name = dotted.rpartition(".")
      names.add((module, name))
    elif inside and line and not line.startswith(" "):
      inside = False
  return modules, names


def _documented() -> tuple[set[str], set[tuple[str, str]]]:
  modules, names = set(), set()
  for page in PAGES:
    page_modules, page_names = listed(page.read_text())
    modules |= page_modules
    names |= page_names
  return modules, names


def test_the_pages_are_read():
  text = (".. automodule:: a\n\n.. currentmodule:: a\n\n.. autosummary::\n   :toctree: x\n\n"
          "   f\n   ~b.g\n\nprose\n   not_an_entry\n")
  assert listed(text) == ({"a"}, {("a", "f"), ("a.b", "g")})


@pytest.mark.parametrize("modname", api_names.public_modules())
def test_every_public_module_and_name_has_its_page(modname):
  modules, names = _documented()
  homes = {api_names.home(module, name) for module, name in names}
  assert modname in modules, f"{modname} has no automodule in docs/api/"
  missing = [name for name in api_names.public_names(modname)
             if not (home := api_names.home(modname, name))[1] == "" and home not in homes]
  assert not missing, f"{modname}: no page lists {missing} (docs/api/; python -m docs.make_specs)"


def test_every_listed_name_exists():
  _, names = _documented()
  gone = [f"{module}.{name}" for module, name in sorted(names)
          if not hasattr(importlib.import_module(module), name)]
  assert not gone


@pytest.mark.parametrize("package", [mappings, losses])
def test_every_registered_constructor_is_exported(package):
  builders = package.SPECS.builders()
  assert builders and set(builders) <= set(package.__all__)
  assert all(getattr(package, name) is builder for name, builder in builders.items())
