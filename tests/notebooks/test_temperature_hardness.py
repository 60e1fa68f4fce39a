"""Executes notebooks/temperature_hardness.ipynb headless (coarse grid); fails on any cell error."""

from __future__ import annotations

import os

import pytest

from notebooks import nbtools

pytestmark = pytest.mark.notebook  # not in the default run; .ci/run runs them and keeps the outputs


def test_temperature_hardness_notebook_runs(tmp_path):
  path = os.path.join(nbtools.ROOT, "notebooks", "temperature_hardness.ipynb")
  with open(path) as file:
    assert 'if \\"google.colab\\" in sys.modules' in file.read()  # the guarded Colab install.
  printed = nbtools.execute(path, str(tmp_path), {"TFCL_NOTEBOOK_SMALL": "1"})
  # The notebook's own checks of the closed form and of both limits.
  deviation = float(printed.split("(up to a constant):")[1].split()[0])
  assert deviation < 1e-6
  assert "free mapping equivalent tau falls with hardness: True" in printed
  ratios = printed.split("first-order error ratio per decade of tau:")[1].splitlines()[0]
  assert all(90 < float(r.strip(" '[]")) < 110 for r in ratios.split(","))  # error ~ tau^-2
