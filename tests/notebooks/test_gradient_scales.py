"""Executes notebooks/gradient_scales.ipynb headless and fails on any cell error."""

from __future__ import annotations

import os

import nbclient
import nbformat
import pytest

from notebooks import nbtools

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


pytestmark = pytest.mark.notebook  # not in the default run; .ci/run runs them and keeps the outputs

def test_gradient_scales_notebook_runs(tmp_path, monkeypatch):
  notebook = nbformat.read(os.path.join(ROOT, "notebooks", "gradient_scales.ipynb"), as_version=4)
  assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), (
      "commit the notebook without outputs (python -m notebooks.make_gradient_scales)")
  # The kernel inherits this environment: the package from this checkout, CPU, no display.
  monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  monkeypatch.setenv("MPLBACKEND", nbtools.figure_backend())
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                   resources={"metadata": {"path": str(tmp_path)}})
  client.execute()  # raises CellExecutionError on the first failing cell
  nbtools.keep_executed(notebook, "gradient_scales.ipynb")
  printed = "".join(out.get("text", "") for cell in notebook.cells
                    for out in cell.get("outputs", []) if out.get("output_type") == "stream")
  assert "max |Eq. 13 - autodiff|" in printed
