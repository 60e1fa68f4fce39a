"""Writes the tables of docs/specs.md from the spec registries: `python -m docs.make_specs`.

Each table stands between a line `<!-- the forms of REGISTRY, written by ... -->` and the line
`<!-- end of the forms -->`; tests/test_specs.py checks that the page holds what this writes.
"""

from __future__ import annotations

import pathlib
import re

from tfcl_jax import losses, mappings

PAGE = pathlib.Path(__file__).resolve().parent / "specs.md"
#: The registries whose tables the page holds, by the name its markers give.
REGISTRIES = {"tfcl_jax.losses.SPECS": losses.SPECS, "tfcl_jax.mappings.SPECS": mappings.SPECS}
END = "<!-- end of the forms -->"


def render(page: str) -> str:
  """`page` with each registry's table (`Registry.table`) between its markers."""
  for name, registry in REGISTRIES.items():
    start = f"<!-- the forms of {name}, written by python -m docs.make_specs -->\n"
    found = re.search(re.escape(start) + r".*?" + re.escape(END), page, flags=re.S)
    if found is None:
      raise ValueError(f"{PAGE} has no table of {name}: add the lines {start.strip()} and {END}.")
    page = page[:found.start()] + start + registry.table() + END + page[found.end():]
  return page


def main() -> None:
  PAGE.write_text(render(PAGE.read_text()))
  print(f"wrote the tables of {PAGE}")


if __name__ == "__main__":
  main()
