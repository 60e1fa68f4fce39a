r"""The gradient-scale figures of Sections 3-4 (Figures 2-5, Eq. 10) and their sigmoid analogues.

Each function returns a `Figure`: for every curve, the closed form on a fine grid (a line) and,
at a few points, the same closed form beside the autodiff value through the library's loss
(`gradients.gradient_scale`, `sigmoid.sigmoid_gradient_scale`). `plot` draws one with
matplotlib. `experiments/gradient_scales.py` writes them all to PNG and CSV; the notebooks draw
them inline; both go through these functions.

Autodiff cannot reach `|C| = 1` (the cosine of the pattern is quadratic at the pole), so the last
point of a C axis is `1 - c_one_offset`. Call inside `jax.enable_x64(True)` for float64 (closed
form and autodiff then agree to about 1e-12).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import mappings
from tfcl_jax.analysis import closed_forms, gradients, sigmoid


@dataclasses.dataclass(frozen=True)
class Curve:
  """One curve: the closed form `line_y` over `line_x`; `closed` and `autodiff` at `x`."""

  label: str
  line_x: np.ndarray
  line_y: np.ndarray
  x: np.ndarray
  closed: np.ndarray
  autodiff: np.ndarray


@dataclasses.dataclass(frozen=True)
class Figure:
  """A figure: its file `name`, `title`, axes and curves."""

  name: str
  title: str
  xlabel: str
  curves: tuple[Curve, ...]
  ylabel: str = "gradient scale"
  xscale: str = "linear"


def _c_points(points: int, c_one_offset: float, *, start: float) -> np.ndarray:
  grid = np.linspace(start, 1.0, points)
  grid[-1] = 1.0 - c_one_offset
  return grid


def _by_tau(c: np.ndarray, taus: np.ndarray, n: int) -> np.ndarray:
  """Autodiff |dL/dC| with cos/tau, `[len(taus), len(c)]`, one compiled program."""
  fn = jax.jit(jax.vmap(
      lambda tau, c: gradients.gradient_scale(mappings.temperature(tau), c, n), in_axes=(0, None)))
  return np.asarray(fn(jnp.asarray(taus), jnp.asarray(c)))


def _by_n(mapping, c: np.ndarray, ns: Sequence[int]) -> list[np.ndarray]:
  """Autodiff |dL/dC| for each N (static: a Python loop) in one compiled program."""
  fn = jax.jit(lambda c: [gradients.gradient_scale(mapping, c, n) for n in ns])
  return [np.asarray(scale) for scale in fn(jnp.asarray(c))]


def figure2(*, taus: Sequence[float] = (0.1, 0.25, 0.5, 1.0), points: int = 20,
            line_points: int = 400, c_one_offset: float = 1e-6) -> Figure:
  """Figure 2: Eq. 4, `|dL/dC|` over C with division by tau, N = 2.

  Examples:
    >>> from tfcl_jax.analysis import figures
    >>> fig = figures.figure2(taus=(0.5,), points=4, line_points=8)
    >>> (curve,) = fig.curves
    >>> curve.label, bool(abs(curve.closed - curve.autodiff).max() < 1e-4)
    ('tau=0.5', True)
  """
  x = _c_points(points, c_one_offset, start=0.025)
  line_x = np.linspace(0.0, 1.0, line_points)
  auto = _by_tau(x, np.asarray(taus), 2)
  return Figure(
      name="figure2_eq4", xlabel="C", title="Figure 2: Eq. 4, |dL/dC| with division by tau (N = 2)",
      curves=tuple(Curve(f"tau={tau:g}", line_x, np.asarray(closed_forms.eq4(line_x, tau)), x,
                         np.asarray(closed_forms.eq4(x, tau)), auto[k])
                   for k, tau in enumerate(taus)))


def figure3(*, cs: Sequence[float] = (0.25, 0.5, 0.75, 1.0),
            tau_range: tuple[float, float] = (0.02, 1.0), points: int = 20,
            line_points: int = 400, c_one_offset: float = 1e-6) -> Figure:
  """Figure 3: Eq. 4 over tau (log axis) at fixed C, N = 2."""
  low, high = tau_range
  x = np.geomspace(low, high, points)
  line_x = np.geomspace(low, high, line_points)
  clipped = np.minimum(np.asarray(cs, np.float64), 1.0 - c_one_offset)
  auto = _by_tau(clipped, x, 2)  # [tau, C]
  curves = []
  for k, (label, c) in enumerate(zip(cs, clipped, strict=True)):
    name = f"C={label:g}" if c == label else f"C->1 (1-{c_one_offset:g})"
    curves.append(Curve(name, line_x, np.asarray(closed_forms.eq4(c, line_x)), x,
                        np.asarray(closed_forms.eq4(c, x)), auto[:, k]))
  return Figure(name="figure3_eq4_tau", xlabel="tau", xscale="log",
                title="Figure 3: Eq. 4 over tau (N = 2)", curves=tuple(curves))


def figure4(*, tau: float = 0.25, ns: Sequence[int] = (2, 4, 8, 16), points: int = 20,
            line_points: int = 400, c_one_offset: float = 1e-6) -> Figure:
  """Figure 4: Eq. 7, `|dL/dC|` over C with division by tau, one curve per N."""
  x = _c_points(points, c_one_offset, start=0.025)
  line_x = np.linspace(0.0, 1.0, line_points)
  auto = _by_n(mappings.temperature(tau), x, ns)
  curves = tuple(Curve(f"N={n}", line_x, np.asarray(closed_forms.eq7(line_x, tau, n)), x,
                       np.asarray(closed_forms.eq7(x, tau, n)), auto[k])
                 for k, n in enumerate(ns))
  return Figure(name="figure4_eq7", xlabel="C", curves=curves,
                title=f"Figure 4: Eq. 7, |dL/dC| with tau = {tau:g}")


def figure5(*, ns: Sequence[int] = (2, 4, 8, 16), points: int = 20, line_points: int = 400,
            c_one_offset: float = 1e-6) -> Figure:
  """Figure 5: Eq. 13, `|dL/dC|` over C with the temperature-free map (Eq. 11), a curve per N."""
  x = _c_points(points, c_one_offset, start=0.025)
  line_x = np.linspace(0.0, 1.0, line_points)
  auto = _by_n(mappings.temperature_free(), x, ns)
  curves = tuple(Curve(f"N={n}", line_x, np.asarray(closed_forms.eq13(line_x, n)), x,
                       np.asarray(closed_forms.eq13(x, n)), auto[k]) for k, n in enumerate(ns))
  return Figure(name="figure5_eq13", xlabel="C", curves=curves,
                title="Figure 5: Eq. 13, |dL/dC| temperature-free")


def eq10_figure(*, ts: Sequence[float] = (-1.0, 0.0, 1.0, 2.0, round(math.log(1 / 0.07), 4)),
                points: int = 20, line_points: int = 400, c_one_offset: float = 1e-6) -> Figure:
  """Eq. 10: `|dL/dt|` of CLIP's learnable exp(t) over C (N = 2): zero at C = 0 for every t.

  The default's last t is CLIP's initial value log(1 / 0.07).
  """
  x = _c_points(points, c_one_offset, start=0.0)
  line_x = np.linspace(0.0, 1.0, line_points)
  t_grid = np.asarray(ts, np.float64)
  auto = np.asarray(gradients.temperature_gradient_scale(x[None, :], t_grid[:, None]))
  curves = tuple(Curve(f"t={t:g} (tau={np.exp(-t):.3g})", line_x,
                       np.asarray(closed_forms.eq10(line_x, t)), x,
                       np.asarray(closed_forms.eq10(x, t)), auto[k]) for k, t in enumerate(t_grid))
  return Figure(name="eq10_learnable_t", xlabel="C", ylabel="|dL/dt|", curves=curves,
                title="Eq. 10: |dL/dt| of CLIP's learnable exp(t) (N = 2), zero at C = 0")


def sigmoid_figure(*, n: int = 16, taus: Sequence[float] = (0.1, 0.5, 1.0), points: int = 20,
                   line_points: int = 400, c_one_offset: float = 1e-6) -> Figure:
  """`|dL/dC|` of the sigmoid loss at [C, -C, ...]: division by tau (b = 0), the free map with
  b = 0 and with the best b at C = 1 (-log(N - 1) / 2), and the doubled log-odds."""
  x = _c_points(points, c_one_offset, start=0.025)
  line_x = np.linspace(0.0, 1.0, line_points)
  free = mappings.temperature_free()
  best_b = -0.5 * np.log(n - 1.0)
  cases = [(f"tau={tau:g}, b=0", mappings.temperature(tau), 0.0,
            lambda c, tau=tau: sigmoid.sigmoid_gradient_scale_tau(c, tau, n)) for tau in taus]
  cases += [("free, b=0", free, 0.0, lambda c: sigmoid.sigmoid_gradient_scale_free(c, n)),
            (f"free, b={best_b:.2f}", free, best_b,
             lambda c: sigmoid.sigmoid_gradient_scale_free(c, n, b=best_b)),
            ("free x2 (4 artanh c), b=0", lambda c: 2.0 * free(c), 0.0,
             lambda c: sigmoid.sigmoid_gradient_scale_free(c, n, k=2.0))]
  curves = tuple(Curve(label, line_x, np.asarray(closed(line_x)), x, np.asarray(closed(x)),
                       np.asarray(sigmoid.sigmoid_gradient_scale(mapping, x, n, bias=b)))
                 for label, mapping, b, closed in cases)
  return Figure(name="sigmoid_scale", xlabel="C", curves=curves,
                title=f"Sigmoid loss: |dL/dC| at [C, -C, ...] (N = {n})")


def sigmoid_t_figure(*, n: int = 16, ts: Sequence[float] = (0.0, round(math.log(10.0), 4)),
                     biases: Sequence[float] = (0.0, -10.0), points: int = 20,
                     line_points: int = 400, c_one_offset: float = 1e-6) -> Figure:
  """`|dL/dt|` of the sigmoid loss with SigLIP's exp(t) cos + b: zero at C = 0 (Eq. 10's analogue).

  The defaults include SigLIP's initial t = log 10 and b = -10.
  """
  x = _c_points(points, c_one_offset, start=0.0)
  line_x = np.linspace(0.0, 1.0, line_points)
  curves = []
  for t in ts:
    for b in biases:
      dt, _ = sigmoid.sigmoid_parameter_gradients(x, t, n, bias=b)
      curves.append(Curve(f"t={t:g}, b={b:g}", line_x,
                          np.asarray(sigmoid.sigmoid_gradient_t(line_x, t, n, b=b)), x,
                          np.asarray(sigmoid.sigmoid_gradient_t(x, t, n, b=b)), np.abs(dt)))
  return Figure(name="sigmoid_learnable_t", xlabel="C", ylabel="|dL/dt|", curves=tuple(curves),
                title=f"Sigmoid loss: |dL/dt| of exp(t) cos + b (N = {n}), zero at C = 0")


def plot(figure: Figure, ax=None):
  """Draws `figure` on `ax` (a new 5.5 x 4 inch figure when None): closed forms as lines,
  autodiff values as open circles. Returns the axes. Needs matplotlib (the `experiments` extra).
  """
  try:
    import matplotlib.pyplot as plt  # noqa: PLC0415
  except ImportError as error:
    raise ImportError("plot needs matplotlib: pip install 'tfcl_jax[experiments]' (or "
                      "matplotlib).") from error
  if ax is None:
    _, ax = plt.subplots(figsize=(5.5, 4.0))
  for k, curve in enumerate(figure.curves):
    color = f"C{k}"
    ax.plot(curve.line_x, curve.line_y, color=color, label=curve.label)
    ax.plot(curve.x, curve.autodiff, "o", color=color, markersize=3.5, markerfacecolor="none")
  ax.plot([], [], "ko", markersize=3.5, markerfacecolor="none", label="autodiff (the loss)")
  ax.set_xscale(figure.xscale)
  ax.set_xlabel(figure.xlabel)
  ax.set_ylabel(figure.ylabel)
  ax.set_title(figure.title, fontsize=9)
  ax.set_ylim(bottom=0.0)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  return ax
