"""`tfcl_jax.analysis.figures`: every figure's autodiff points on its closed form, and its plot."""

from __future__ import annotations

import jax
import matplotlib
import numpy as np
import pytest

from tfcl_jax.analysis import figures

matplotlib.use("Agg")

GRID = dict(points=5, line_points=30)
MAKERS = {
    "figure2_eq4": lambda: figures.figure2(taus=(0.1, 1.0), **GRID),
    "figure3_eq4_tau": lambda: figures.figure3(cs=(0.5, 1.0), **GRID),
    "figure4_eq7": lambda: figures.figure4(tau=0.25, ns=(2, 16), **GRID),
    "figure5_eq13": lambda: figures.figure5(ns=(2, 16), **GRID),
    "eq10_learnable_t": lambda: figures.eq10_figure(ts=(0.0, 2.0), **GRID),
    "sigmoid_scale": lambda: figures.sigmoid_figure(n=8, taus=(0.5,), **GRID),
    "sigmoid_learnable_t": lambda: figures.sigmoid_t_figure(n=8, ts=(1.0,), biases=(0.0,), **GRID),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_autodiff_points_lie_on_the_closed_form_in_float64(name):
  with jax.enable_x64(True):
    figure = MAKERS[name]()
  assert figure.name == name
  for curve in figure.curves:
    assert curve.x.shape == curve.closed.shape == curve.autodiff.shape == (5,)
    assert curve.line_x.shape == curve.line_y.shape == (30,)
    np.testing.assert_allclose(curve.autodiff, curve.closed, rtol=1e-9, atol=1e-12)


def test_figure5_closed_form_is_eq13_by_hand():
  with jax.enable_x64(True):
    figure = figures.figure5(ns=(16,), **GRID)
  (curve,) = figure.curves
  c = curve.x
  eq13 = 4 * 15 * (1 - c) / ((1 + c) * (16 * (1 - c) ** 2 + 4 * c))
  np.testing.assert_allclose(curve.closed, eq13, rtol=1e-12)
  assert curve.x[-1] == 1.0 - 1e-6  # the last point stands in for C = 1


def test_plot_draws_a_line_and_points_per_curve():
  import matplotlib.pyplot as plt

  figure = figures.figure4(tau=0.25, ns=(2, 4, 8), **GRID)
  fig, ax = plt.subplots()
  assert figures.plot(figure, ax) is ax
  assert len(ax.lines) == 2 * 3 + 1  # line + points per curve, and the legend's marker
  assert ax.get_title() == figure.title
  plt.close(fig)
