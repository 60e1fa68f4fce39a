"""Runs `python -m experiments.gradient_scales --workdir=DIR` and checks its files and numbers."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import numpy as np

FIGURES = ("figure2_eq4", "figure3_eq4_tau", "figure4_eq7", "figure5_eq13", "eq10_learnable_t",
           "sigmoid_scale", "sigmoid_learnable_t")


def test_gradient_scales_cli(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, MPLBACKEND="Agg", JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, "-m", "experiments.gradient_scales", f"--workdir={tmp_path}",
       # Fewer points and curves than the paper's config: the grids are covered by unit tests.
       "--config.autodiff_points=6", "--config.line_points=50", "--config.ns=(2, 16)",
       "--config.eq10_ts=(0.0, 2.0)", "--config.sigmoid_taus=(0.5,)", "--config.sigmoid_ts=(2.0,)"],
      cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "| figure | curve | points | max abs diff |" in result.stdout  # the table, printed
  for name in FIGURES:
    png = tmp_path / f"{name}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
  for name in ("results.csv", "results.md"):
    assert (tmp_path / name).stat().st_size > 0
  with open(tmp_path / "gradient_scales.csv") as f:
    rows = list(csv.DictReader(f))
  assert list(rows[0]) == ["figure", "curve", "x", "closed_form", "autodiff", "abs_diff"]
  # Figures 2-5, Eq. 10 and the sigmoid pair: 4 + 4 + 2 + 2 + 2 + 4 + 2 curves of 6 points.
  assert len(rows) == 20 * 6
  assert {r["figure"] for r in rows} == set(FIGURES)
  closed = np.array([float(r["closed_form"]) for r in rows])
  auto = np.array([float(r["autodiff"]) for r in rows])
  assert np.all(np.isfinite(auto))
  np.testing.assert_allclose(np.array([float(r["abs_diff"]) for r in rows]), np.abs(closed - auto))
  assert np.max(np.abs(closed - auto)) < 1e-12
  # Independent spot check of Figure 5's closed form (Eq. 13) at one CSV point.
  row = next(r for r in rows if r["figure"] == "figure5_eq13" and r["curve"] == "N=16")
  c = float(row["x"])
  np.testing.assert_allclose(float(row["closed_form"]),
                             4 * 15 * (1 - c) / ((1 + c) * (16 * (1 - c) ** 2 + 4 * c)), rtol=1e-12)
