"""Writes what the registries declare into the docs: `python -m docs.make_specs` (`--check`:
fails if a page is out of date, writing nothing).

* the tables of docs/specs.md, one per spec registry (`Registry.table`), each a generated block
  (`experiments.framework.blocks`) between a line `<!-- the forms of REGISTRY, written by ... -->`
  and the line `<!-- end of the forms -->`;
* the list of public names on the API pages of the packages the registries extend
  (docs/api/mappings.rst, docs/api/losses.rst: their `__all__`, which a registered constructor
  joins), between the comments `.. the public names of MODULE, written by ...` and
  `.. end of the public names of MODULE`.

tests/specs/test_registry.py checks that the pages hold what this writes (and
tests/cross/test_api_pages.py that every public name has its page).
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re
import sys

from experiments.framework import blocks
from tfcl_jax import losses, mappings

DOCS = pathlib.Path(__file__).resolve().parent
PAGE = DOCS / "specs.md"
#: The registries whose tables the page holds, by the name its markers give.
REGISTRIES = {"tfcl_jax.losses.SPECS": losses.SPECS, "tfcl_jax.mappings.SPECS": mappings.SPECS}
#: The API pages whose lists of names this writes, by the module they list.
API_PAGES = {"tfcl_jax.mappings": DOCS / "api" / "mappings.rst",
             "tfcl_jax.losses": DOCS / "api" / "losses.rst"}
COMMAND = "python -m docs.make_specs"
END = "<!-- end of the forms -->"


def render(page: str) -> str:
  """`page` with each registry's table (`Registry.table`) between its markers."""
  try:
    return blocks.fill(page, {f"the forms of {name}": registry.table()
                              for name, registry in REGISTRIES.items()},
                       command=COMMAND, end=END)
  except ValueError as error:
    raise ValueError(f"{PAGE}: {error}") from error


def names_block(modname: str) -> str:
  """The autosummary of `modname`'s `__all__` (its submodules left to their own sections)."""
  module = importlib.import_module(modname)
  names = [name for name in module.__all__ if not inspect.ismodule(getattr(module, name))]
  return ".. autosummary::\n   :toctree: generated\n\n" + "".join(
      f"   {name}\n" for name in names) + "\n"


def render_api(page: str, modname: str) -> str:
  """`page` (an API page) with `modname`'s names between its markers."""
  start = f".. the public names of {modname}, written by {COMMAND}\n\n"
  end = f".. end of the public names of {modname}\n"
  found = re.search(re.escape(start) + ".*?^" + re.escape(end), page, flags=re.S | re.M)
  if found is None:
    raise ValueError(f"{API_PAGES[modname]}: no list of {modname}: add the lines "
                     f"{start.strip()} and {end.strip()}.")
  return page[:found.start()] + start + names_block(modname) + end + page[found.end():]


def pages() -> dict[pathlib.Path, str]:
  """Every page this writes, as it writes it."""
  written = {PAGE: render(PAGE.read_text())}
  written |= {path: render_api(path.read_text(), modname) for modname, path in API_PAGES.items()}
  return written


def main(argv: list[str]) -> int:
  """Writes the pages; with `--check`, writes nothing and fails (1) if one is out of date."""
  if set(argv) - {"--check"}:
    raise SystemExit(f"usage: {COMMAND} [--check]; got {argv}")
  written = pages()
  stale = [path for path, text in written.items() if path.read_text() != text]
  if "--check" in argv:
    for path in stale:
      print(f"out of date: {path} (run {COMMAND})")
    return int(bool(stale))
  for path in stale:
    path.write_text(written[path])
    print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
