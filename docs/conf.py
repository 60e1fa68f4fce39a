"""Sphinx configuration of the tfcl_jax documentation site (built by `.ci/docs`).

Sphinx with MyST, the layout optax and Flax publish theirs in: the write-ups in docs/ are
Markdown (myst-parser), the notebooks render through myst-nb, readers who know optax or Flax find
the same API pages, and autodoc reads the library's Google-style docstrings through napoleon.

The build runs with `-W --keep-going -n`: any warning fails it, nitpicky references included.
Two checks of the API are warnings too: a public name (a module's `__all__`, else the names it
defines without a leading underscore) without a docstring, and a public name that no page of the
API reference documents. Notebooks are never executed here: they render with the outputs the
test suite gave them (`TFCL_JAX_EXECUTED_NOTEBOOKS`), or as committed, without outputs.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import pathlib
import shutil
import sys

import nbformat
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

import tfcl_jax  # noqa: E402
from docs.api_names import home, public_modules, public_names, top_level  # noqa: E402

logger = logging.getLogger("tfcl_jax.docs")

project = "tfcl_jax"
author = "tfcl_jax developers"
copyright = "tfcl_jax developers"
release = version = tfcl_jax.__version__

extensions = [
    "myst_nb",  # also registers myst_parser for the .md pages
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
templates_path = ["_templates"]

html_theme = "sphinx_book_theme"
html_title = "tfcl_jax"
# The sidebar opens only the current page's branch: drawing every API page into every page's
# sidebar made the build about three times slower.
html_theme_options = {"show_toc_level": 2, "collapse_navbar": True}

# The write-ups open at `##` (they read as sections on GitHub); Sphinx takes the first heading
# as the page title whatever its level.
suppress_warnings = ["myst.header"]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

# Docstrings write code in single backticks, as Markdown does.
default_role = "code"

autosummary_generate = True
autosummary_ignore_module_all = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# A method without a docstring stays undocumented rather than showing Flax's or NumPy's.
autodoc_inherit_docstrings = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Offline build (no intersphinx inventories): references to other projects' types stay text.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jaxlib|flax|optax|chex|numpy|np|jnp|sparse|orbax|ml_collections|grain|"
               r"tensorflow_datasets|matplotlib|sklearn|torch|nbformat)(\..*)?"),
    (r"py:.*", r"(abc|collections\.abc|contextlib|typing|os|pathlib|numbers|re)\..*"),  # the stdlib
    (r"py:class", r"ArrayTree"),  # chex.ArrayTree (optax's state types) prints without its module
    # The private base of every family's Loss object (`losses.Loss` is the public one), named
    # unlinked among the bases of `InfoNCELoss` and `SigmoidLoss`.
    (r"py:class", r"tfcl_jax\.losses\._loss\.FamilyLoss"),
]

# Notebooks: never executed here (the tests run them).
nb_execution_mode = "off"
NOTEBOOKS = ROOT / "notebooks"
NOTEBOOKS_BUILD = DOCS / "notebooks"  # build-time copies (*.ipynb, gitignored) beside index.md


def _same_cells(executed, committed) -> bool:
  return [(c.cell_type, c.source) for c in executed.cells] == [
      (c.cell_type, c.source) for c in committed.cells]


def _say(message: str) -> None:
  # On stderr: `sphinx-build -q` (.ci/docs) hides Sphinx's own info messages.
  print(f"docs: notebook {message}", file=sys.stderr)


def _copy_notebooks() -> None:
  """Copies each notebook into docs/notebooks/: its executed form from the tests where one exists.

  `TFCL_JAX_EXECUTED_NOTEBOOKS` names the folder the notebook tests write executed copies to; a
  copy whose cells differ from the committed notebook is stale and not used.
  """
  executed_dir = os.environ.get("TFCL_JAX_EXECUTED_NOTEBOOKS")
  for stale in NOTEBOOKS_BUILD.glob("*.ipynb"):
    stale.unlink()
  for path in sorted(NOTEBOOKS.glob("*.ipynb")):
    committed = nbformat.read(path, as_version=4)
    executed_path = pathlib.Path(executed_dir, path.name) if executed_dir else None
    if executed_path is not None and executed_path.is_file():
      executed = nbformat.read(executed_path, as_version=4)
      if _same_cells(executed, committed):
        shutil.copyfile(executed_path, NOTEBOOKS_BUILD / path.name)
        _say(f"{path.name} with the outputs of {executed_path}")
        continue
      reason = f"{executed_path} is stale (its cells differ from the committed notebook)"
    elif executed_dir:
      reason = f"{executed_dir} has no {path.name}"
    else:
      reason = "TFCL_JAX_EXECUTED_NOTEBOOKS is not set"
    shutil.copyfile(path, NOTEBOOKS_BUILD / path.name)
    _say(f"{path.name} as committed, without outputs: {reason}")


# The API checks.


@functools.cache
def _attribute_docs(modname: str) -> dict[str, list[str]]:
  """Docstrings of a module's variables: `#:` comments before, or a string after, each one."""
  docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
  return {name: lines for (scope, name), lines in docs.items() if scope == ""}


def has_docstring(modname: str, name: str) -> bool:
  defmod, defname = home(modname, name)
  if not defname:
    return bool((importlib.import_module(defmod).__doc__ or "").strip())
  if any(line.strip() for line in _attribute_docs(defmod).get(defname, [])):
    return True
  node = top_level(defmod).get(defname)
  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
    return bool(ast.get_docstring(node))
  value = getattr(importlib.import_module(defmod), defname)
  own = getattr(value, "__doc__", None)
  is_api = inspect.isroutine(value) or inspect.isclass(value)
  return is_api and bool(own and own.strip()) and own != type(value).__doc__


def _check_docstrings(app) -> None:
  seen = set()
  for modname in public_modules():
    for name in public_names(modname):
      key = home(modname, name)
      if key in seen:
        continue
      seen.add(key)
      if not has_docstring(modname, name):
        where = ".".join(filter(None, key))
        where = "" if where == f"{modname}.{name}" else f" (defined as {where})"
        logger.warning("%s.%s is public and has no docstring%s", modname, name, where,
                       type="tfcl_jax", subtype="docstring")


def _documented(env) -> set[tuple[str, str]]:
  """`home` of every object that a page of the site documents."""
  keys = set()
  for fullname, entry in env.domains["py"].objects.items():
    if entry.objtype == "module":
      keys.add((fullname, ""))
      continue
    modname, _, name = fullname.rpartition(".")
    if modname in sys.modules and "." not in name:
      keys.add(home(modname, name))
  return keys


def _check_reference(app, env) -> None:
  documented = _documented(env)
  for modname in public_modules():
    if (modname, "") not in documented:
      logger.warning("module %s is public and not in the API reference", modname,
                     type="tfcl_jax", subtype="reference")
    for name in public_names(modname):
      if home(modname, name) not in documented:
        logger.warning("%s.%s is public and not in the API reference (docs/api/)", modname, name,
                       type="tfcl_jax", subtype="reference")


def _data_docstring(app, what, name, obj, options, lines) -> None:
  """A re-exported variable's docstring lives in the module that defines it; autodoc looks in
  the module that exports it."""
  if what != "data":
    return
  modname, _, attr = name.rpartition(".")
  defmod, defname = home(modname, attr)
  if defmod != modname:
    lines[:] = list(_attribute_docs(defmod).get(defname, lines))


@functools.cache
def _type_names() -> dict[str, str]:
  """Type names as the library writes them: JAX's input types by their alias, not the unions
  they stand for, and `jax.Array` by its public path."""
  import jax
  from sphinx.util.typing import stringify_annotation

  return {stringify_annotation(jax.typing.ArrayLike, "smart"): "~jax.typing.ArrayLike",
          stringify_annotation(jax.typing.DTypeLike, "smart"): "~jax.typing.DTypeLike",
          "jax.jaxlib._jax.Array": "jax.Array"}


def _rename_types(text: str | None) -> str | None:
  for long, short in _type_names().items():
    text = text and text.replace(long, short)
  return text


def _signature_types(app, what, name, obj, options, signature, return_annotation):
  # A dataclass field's `<factory>` default keeps Sphinx from parsing the signature.
  signature = signature and signature.replace("= <factory>", "= ...")
  return _rename_types(signature), _rename_types(return_annotation)


def _docstring_types(app, what, name, obj, options, lines) -> None:
  lines[:] = [_rename_types(line) for line in lines]


def _skip_fields(app, what, name, obj, skip, options):
  """Fields are documented by their class's `Attributes:` section, not as members: a
  NamedTuple's, and a dataclass field whose default is a module-level function."""
  if isinstance(getattr(obj, "__doc__", None), str) and obj.__doc__.startswith("Alias for field"):
    return True
  if inspect.isfunction(obj) and "." not in obj.__qualname__:
    return True
  return None


def setup(app):
  _copy_notebooks()
  app.connect("builder-inited", _check_docstrings)
  app.connect("env-check-consistency", _check_reference)
  app.connect("autodoc-process-docstring", _data_docstring)
  app.connect("autodoc-skip-member", _skip_fields)
  app.connect("autodoc-process-signature", _signature_types)
  app.connect("autodoc-process-docstring", _docstring_types, priority=900)  # after napoleon
