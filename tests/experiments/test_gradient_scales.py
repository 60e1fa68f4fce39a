"""Runs `python -m experiments.gradient_scales --workdir=DIR` and checks its files and numbers."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments.framework import plan

FIGURES = ("figure2_eq4", "figure3_eq4_tau", "figure4_eq7", "figure5_eq13", "eq10_learnable_t",
           "scaled_free_scale", "learnable_free_t", "sigmoid_scale", "sigmoid_learnable_t")


@pytest.mark.slow
def test_gradient_scales_cli(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ, MPLBACKEND="Agg", JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, "-m", "experiments.gradient_scales", f"--workdir={tmp_path}",
       # Fewer points and curves than the paper's config: the grids are covered by unit tests.
       "--config.autodiff_points=6", "--config.line_points=50", "--config.ns=(2, 16)",
       "--config.eq10_ts=(0.0, 2.0)", "--config.scaled_free_ns=(2, 16)",
       "--config.sigmoid_taus=(0.5,)", "--config.sigmoid_ts=(2.0,)"],
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
  # Figures 2-5, Eq. 10, the scaled free pair and the sigmoid pair: 4 + 4 + 2 + 2 + 2 + (2 + 3)
  # + (2 + 1) + 4 + 2 curves of 6 points.
  assert len(rows) == 28 * 6
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


def test_make_figures_passes_the_config_to_every_figure(monkeypatch):
  """Each figure function gets its config fields (the figures: tests/analysis/test_figures.py)."""
  from experiments import gradient_scales
  from experiments.configs import gradient_scales_paper
  from tfcl_jax.analysis import figures

  makers = ("figure2", "figure3", "figure4", "figure5", "eq10_figure", "scaled_free_figure",
            "learnable_free_t_figure", "sigmoid_figure", "sigmoid_t_figure")
  for name in makers:
    monkeypatch.setattr(figures, name, lambda name=name, **kwargs: (name, kwargs))
  config = gradient_scales_paper.get_config()
  made = dict(gradient_scales.make_figures(config))
  assert list(made) == list(makers)
  grid = dict(points=config.autodiff_points, line_points=config.line_points,
              c_one_offset=config.c_one_offset)
  assert made["scaled_free_figure"] == dict(ns=(2, 64, 512), tau=0.1, **grid)
  assert made["learnable_free_t_figure"] == dict(ns=(2, 64, 512), clip_t=2.6593, **grid)
  gradient_scales.check_config(config)
  for field, bad in (("scaled_free_ns", (2, 1)), ("scaled_free_ns", ()),
                     ("scaled_free_tau", 0.0), ("clip_t", float("inf"))):
    broken = gradient_scales_paper.get_config()
    broken[field] = bad
    with pytest.raises(plan.ConfigError, match=f"config.{field}"):
      gradient_scales.check_config(broken)
