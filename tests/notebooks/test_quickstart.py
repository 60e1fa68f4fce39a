"""Executes notebooks/quickstart.ipynb headless in a small setting (1 epoch)."""

from __future__ import annotations

import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

from notebooks import nbtools
from tests.helpers import xla_flags

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"


pytestmark = pytest.mark.notebook  # not in the default run; .ci/run runs them and keeps the outputs

def test_quickstart_notebook_runs(monkeypatch):
  pytest.importorskip("ipykernel")
  root = str(NOTEBOOK.parents[1])
  monkeypatch.setenv("TFCL_QUICKSTART_EPOCHS", "1")
  monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))
  monkeypatch.setenv("MPLBACKEND", nbtools.figure_backend())
  # One device in the kernel: conftest's 8 host devices would only slow compilation here.
  monkeypatch.setenv("XLA_FLAGS", xla_flags.with_host_devices(1))
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  NotebookClient(notebook, timeout=300, kernel_name="python3",
                 resources={"metadata": {"path": root}}).execute()
  nbtools.keep_executed(notebook, str(NOTEBOOK))
  outputs = "".join(output.get("text", "") for cell in notebook.cells
                    if cell.cell_type == "code" for output in cell.get("outputs", []))
  for spec in ("tau=0.1", "tau=1", "free"):
    assert f"{spec:8s} kNN top-1 after 1 epochs" in outputs
