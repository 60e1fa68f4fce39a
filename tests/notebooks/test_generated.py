"""Every committed notebook is what its generator (`notebooks/make_NAME.py`) writes."""

from __future__ import annotations

import importlib
import pathlib

import nbformat
import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"


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


def _install_cell(name):
  notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
  return next(cell.source for cell in notebook.cells if cell.cell_type == "code")


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")))
def test_the_colab_cell_installs_from_an_uploaded_wheel_or_says_what_is_missing(
    name, tmp_path, monkeypatch):
  import subprocess
  import sys
  import types

  calls = []
  monkeypatch.setattr(subprocess, "run", lambda command, check: calls.append(command))
  source = _install_cell(name)
  assert "github.com" not in source
  exec(source, {})  # not on Colab: nothing is installed
  assert calls == []
  monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
  namespace = {}
  with pytest.raises(RuntimeError, match="upload its wheel .* or set TFCL_JAX_SOURCE"):
    exec(source, namespace)  # on Colab, with no wheel in /content and no source set
  assert calls == []
  for version in ("0.1.0", "0.2.0"):
    (tmp_path / f"tfcl_jax-{version}-py3-none-any.whl").write_bytes(b"")
  command = namespace["install_tfcl_jax"]("", uploads=str(tmp_path))
  extras = "[experiments,data]" if name == "quickstart" else ""
  wheel = (tmp_path / "tfcl_jax-0.2.0-py3-none-any.whl").resolve().as_uri()
  assert command[-1] == f"tfcl_jax{extras} @ {wheel}"  # the newest upload, as a file URL
  assert command[1:5] == ["-m", "pip", "install", "-q"]
  url = "https://example.org/tfcl_jax-0.1.0-py3-none-any.whl"
  assert namespace["install_tfcl_jax"](url)[-1] == f"tfcl_jax{extras} @ {url}"
  assert calls == [command, [*command[:-1], f"tfcl_jax{extras} @ {url}"]]
