"""Writes the tables of docs/specs.md from the spec registries: `python -m docs.make_specs`.

Each table is a generated block (`experiments.framework.blocks`) between a line
`<!-- the forms of REGISTRY, written by ... -->` and the line `<!-- end of the forms -->`;
tests/test_specs.py checks that the page holds what this writes.
"""

from __future__ import annotations

import pathlib

from experiments.framework import blocks
from tfcl_jax import losses, mappings

PAGE = pathlib.Path(__file__).resolve().parent / "specs.md"
#: The registries whose tables the page holds, by the name its markers give.
REGISTRIES = {"tfcl_jax.losses.SPECS": losses.SPECS, "tfcl_jax.mappings.SPECS": mappings.SPECS}
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


def main() -> None:
  PAGE.write_text(render(PAGE.read_text()))
  print(f"wrote the tables of {PAGE}")


if __name__ == "__main__":
  main()
