"""Shared notebook plumbing: build a notebook from (kind, source) cells; execute one headless.

The generators (`notebooks/make_*.py`) and the notebook tests use these functions; the tests
keep each executed notebook for the documentation (`keep_executed`).
"""

from __future__ import annotations

import os

import nbformat
from nbformat import v4

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(cells, path: str) -> None:
  """Writes `cells` (`("md" | "code", source)` pairs) as an output-free notebook at `path`."""
  notebook = v4.new_notebook()
  notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
  notebook.metadata["colab"] = {"provenance": []}
  notebook.cells = [v4.new_markdown_cell(source) if kind == "md" else v4.new_code_cell(source)
                    for kind, source in cells]
  nbformat.write(notebook, path)


def keep_executed(notebook, path: str) -> None:
  """Writes the executed `notebook` of `path` under the same file name into the folder that
  `TFCL_JAX_EXECUTED_NOTEBOOKS` names, if it is set: the documentation shows these outputs."""
  folder = os.environ.get("TFCL_JAX_EXECUTED_NOTEBOOKS")
  if folder:
    os.makedirs(folder, exist_ok=True)
    nbformat.write(notebook, os.path.join(folder, os.path.basename(path)))


def figure_backend() -> str:
  """Matplotlib's backend for a headless run: figures go into the outputs (inline) when the
  executed notebooks are kept for the documentation, nowhere (Agg) otherwise."""
  if os.environ.get("TFCL_JAX_EXECUTED_NOTEBOOKS"):
    return "module://matplotlib_inline.backend_inline"
  return "Agg"


def execute(path: str, workdir: str, env: dict[str, str], *, timeout: int = 120) -> str:
  """Runs the notebook at `path` headless with this checkout on the path; returns its stdout.

  Raises `nbclient.exceptions.CellExecutionError` on the first failing cell, and
  `ValueError` if the committed notebook holds outputs. The executed notebook is kept for the
  documentation (`keep_executed`).
  """
  import nbclient

  notebook = nbformat.read(path, as_version=4)
  if any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"):
    raise ValueError(f"{path} holds outputs: regenerate it: python -m notebooks.make_NAME.")
  saved = {key: os.environ.get(key) for key in [*env, "PYTHONPATH", "MPLBACKEND", "JAX_PLATFORMS"]}
  os.environ.update({"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                     "MPLBACKEND": figure_backend(), "JAX_PLATFORMS": "cpu", **env})
  try:
    client = nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": workdir}})
    client.execute()
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value
  keep_executed(notebook, path)
  return "".join(output.get("text", "") for cell in notebook.cells
                 for output in cell.get("outputs", []) if output.get("output_type") == "stream")


COLAB_NOTE = (
    "**On Colab**: upload this notebook (File → Upload notebook) and the package's wheel "
    "(`python -m build` in a checkout writes it to `dist/`) to the Files pane, or set "
    "`TFCL_JAX_SOURCE` in the first cell to any pip source of the package; the first cell "
    "installs it. Elsewhere the cell does nothing and the installed `tfcl_jax` is used.")


def colab_install_cell(extras: str = "") -> str:
  """The first code cell: on Colab, installs tfcl_jax (with `extras`, e.g. `"[experiments]"`)
  from `TFCL_JAX_SOURCE` or an uploaded wheel, with one clear error when there is neither."""
  return f'''import glob
import pathlib
import subprocess
import sys

# On Colab, tfcl_jax is installed from TFCL_JAX_SOURCE: a wheel path, a URL or a directory,
# anything pip takes. Left empty, the cell looks for an uploaded wheel /content/tfcl_jax-*.whl.
TFCL_JAX_SOURCE = ""


def install_tfcl_jax(source, extras="{extras}", uploads="/content"):
  """Installs tfcl_jax{extras} from `source` (or the newest uploaded wheel) with pip."""
  wheels = sorted(glob.glob(f"{{uploads}}/tfcl_jax-*.whl"))
  source = source or (wheels[-1] if wheels else "")
  if not source:
    raise RuntimeError(
        "tfcl_jax is not on PyPI: upload its wheel (python -m build writes it to dist/) to "
        f"{{uploads}} in the Files pane, or set TFCL_JAX_SOURCE to a wheel, URL or directory.")
  if pathlib.Path(source).exists():
    source = pathlib.Path(source).resolve().as_uri()
  command = [sys.executable, "-m", "pip", "install", "-q", f"tfcl_jax{{extras}} @ {{source}}"]
  subprocess.run(command, check=True)
  return command


if "google.colab" in sys.modules:
  install_tfcl_jax(TFCL_JAX_SOURCE)'''
