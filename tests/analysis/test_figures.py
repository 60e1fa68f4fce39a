"""`tfcl_jax.analysis.figures`: every figure's autodiff points on its closed form, and its plot."""

from __future__ import annotations

import jax
import matplotlib
import numpy as np
import pytest

from tests.helpers.marks import widest
from tfcl_jax.analysis import figures

matplotlib.use("Agg")

GRID = dict(points=5, line_points=30)
MAKERS = {
    "figure2_eq4": lambda: figures.figure2(taus=(0.1, 1.0), **GRID),
    "figure3_eq4_tau": lambda: figures.figure3(cs=(0.5, 1.0), **GRID),
    "figure4_eq7": lambda: figures.figure4(tau=0.25, ns=(2, 16), **GRID),
    "figure5_eq13": lambda: figures.figure5(ns=(2, 16), **GRID),
    "eq10_learnable_t": lambda: figures.eq10_figure(ts=(0.0, 2.0), **GRID),
    "scaled_free_scale": lambda: figures.scaled_free_figure(ns=(2, 16), tau=0.1, **GRID),
    "learnable_free_t": lambda: figures.learnable_free_t_figure(ns=(2, 16), **GRID),
    "sigmoid_scale": lambda: figures.sigmoid_figure(n=8, taus=(0.5,), **GRID),
    "sigmoid_learnable_t": lambda: figures.sigmoid_t_figure(n=8, ts=(1.0,), biases=(0.0,), **GRID),
}


# The default run's four: Eq. 4 at a temperature, Eq. 10, both sigmoid scales; the figures
# whose closed forms are also checked by hand below in the heavy run.
@pytest.mark.parametrize("name", widest(*sorted(MAKERS), quick=(
    "figure3_eq4_tau", "eq10_learnable_t", "sigmoid_scale", "sigmoid_learnable_t")))
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


def _scaled_free_np(c, n, s):
  """The pattern's |dL/dC| and |dL/dt| under s 2 artanh(c), from L = log(1 + (N-1) r^2s); the
  naive 1 - c^2 loses about 1e-11 of relative accuracy at C = 1 - 1e-6, hence rtol 1e-9."""
  r = (1 - c) / (1 + c)
  negatives = (n - 1) * r ** (2 * s) / (1 + (n - 1) * r ** (2 * s))
  return 4 * s / (1 - c**2) * negatives, 4 * s * np.arctanh(c) * negatives


def test_scaled_free_figures_closed_forms_by_hand():
  with jax.enable_x64(True):
    scale = figures.scaled_free_figure(ns=(2, 64), tau=0.1, **GRID)
    t = figures.learnable_free_t_figure(ns=(2, 64), clip_t=2.0, **GRID)
  curves = {curve.label: curve for curve in scale.curves}
  assert list(curves) == ["free, N=2", "tau=0.1, N=2", "free, N=64", "free_n, N=64 (s=2.89)",
                          "tau=0.1, N=64"]  # free_n is free at N = 2: not drawn twice
  s = 1 + np.log(63) / np.log(9)  # s(64), so that 63 3^(-2s) = 3^(-2)
  for label, scale_s in (("free, N=64", 1.0), ("free_n, N=64 (s=2.89)", s)):
    c = curves[label].x
    np.testing.assert_allclose(curves[label].closed, _scaled_free_np(c, 64, scale_s)[0],
                               rtol=1e-9)
  c = curves["tau=0.1, N=64"].x
  np.testing.assert_allclose(curves["tau=0.1, N=64"].closed,
                             63 * 20 / (63 + np.exp(20 * c)), rtol=1e-12)  # Eq. 7
  *learnable, clip = t.curves
  for curve, n in zip(learnable, (2, 64), strict=True):
    np.testing.assert_allclose(curve.closed, _scaled_free_np(curve.x, n, 1.0)[1], rtol=1e-9)
    assert curve.autodiff[0] == 0.0 and curve.x[0] == 0.0  # C = 0: t gets no gradient
  np.testing.assert_allclose(clip.closed, 2 * clip.x * np.exp(2.0)
                             / (1 + np.exp(2 * clip.x * np.exp(2.0))), rtol=1e-12)  # Eq. 10
  assert clip.autodiff[0] == 0.0


def test_plot_draws_a_line_and_points_per_curve():
  import matplotlib.pyplot as plt

  figure = figures.figure4(tau=0.25, ns=(2, 4, 8), **GRID)
  fig, ax = plt.subplots()
  assert figures.plot(figure, ax) is ax
  assert len(ax.lines) == 2 * 3 + 1  # line + points per curve, and the legend's marker
  assert ax.get_title() == figure.title
  plt.close(fig)
