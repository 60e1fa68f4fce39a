"""The library's public names and where each is defined: what the API reference documents.

`docs/conf.py` checks, while Sphinx builds, that every public name has a docstring and a page;
`docs/make_specs.py` writes the name lists of the pages the registries extend;
tests/cross/test_api_pages.py checks the pages against these names without Sphinx. A module's
public names are its `__all__`, else the names it defines (not imports) without a leading `_`;
each is documented once, under the shortest path that exports it (`home`: where it is defined).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil

import tfcl_jax


def public_modules() -> list[str]:
  """`tfcl_jax` and every module under it with no path component starting with `_`."""
  found = pkgutil.walk_packages(tfcl_jax.__path__, "tfcl_jax.")
  return ["tfcl_jax"] + sorted(
      info.name for info in found if not any(p.startswith("_") for p in info.name.split(".")))


@functools.cache
def top_level(modname: str) -> dict[str, ast.stmt]:
  """The statement that binds each module-level name (outside functions and classes)."""
  module = importlib.import_module(modname)
  source = inspect.getsource(module)
  bound: dict[str, ast.stmt] = {}

  def visit(statements):
    for node in statements:
      names = []
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names = [node.name]
      elif isinstance(node, ast.Assign):
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
      elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        names = [node.target.id]
      elif isinstance(node, (ast.Import, ast.ImportFrom)):
        names = [(a.asname or a.name).split(".")[0] for a in node.names]
      elif isinstance(node, (ast.If, ast.Try)):
        visit(node.body + node.orelse + getattr(node, "finalbody", []) +
              [s for h in getattr(node, "handlers", []) for s in h.body])
      for name in names:
        bound.setdefault(name, node)

  visit(ast.parse(source).body)
  return bound


def public_names(modname: str) -> list[str]:
  """A module's `__all__`, else the names it defines (not imports) without a leading `_`."""
  module = importlib.import_module(modname)
  if hasattr(module, "__all__"):
    return list(module.__all__)
  return [name for name, node in top_level(modname).items()
          if not name.startswith("_") and not isinstance(node, (ast.Import, ast.ImportFrom))]


def home(modname: str, name: str) -> tuple[str, str]:
  """Where `modname.name` is defined: follows `from X import name` to the module that binds it."""
  node = top_level(modname).get(name)
  if isinstance(node, ast.ImportFrom) and node.level == 0:
    alias = next(a for a in node.names if (a.asname or a.name) == name)
    target = f"{node.module}.{alias.name}"
    if inspect.ismodule(getattr(importlib.import_module(modname), name, None)):
      return target, ""
    return home(node.module, alias.name)
  if node is None and inspect.ismodule(getattr(importlib.import_module(modname), name, None)):
    return f"{modname}.{name}", ""
  return modname, name
