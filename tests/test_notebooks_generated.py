"""Every committed notebook is what its generator (`notebooks/make_NAME.py`) writes."""

from __future__ import annotations

import importlib
import pathlib

import nbformat
import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"


def test_every_notebook_has_a_generator():
  notebooks = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
  generators = sorted(p.stem[len("make_"):] for p in NOTEBOOKS.glob("make_*.py"))
  assert notebooks == generators


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_equals_its_generator(name):
  cells = importlib.import_module(f"notebooks.make_{name}").CELLS
  notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
  kinds = {"md": "markdown", "code": "code"}
  assert [(kinds[kind], source) for kind, source in cells] == [
      (cell.cell_type, cell.source) for cell in notebook.cells], (
      f"regenerate it: python -m notebooks.make_{name}")
  assert not any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")
