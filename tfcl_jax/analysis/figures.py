r"""The gradient-scale figures of Sections 3-4 (Figures 2-5, Eq. 10), the same for the scaled free
mappings (`mappings.n_aware_free`, `mappings.learnable_free`), and their sigmoid analogues.

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
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import losses, mappings
from tfcl_jax.analysis import closed_forms, gradients, pattern, sigmoid


@dataclasses.dataclass(frozen=True)
class Curve:
  """One curve: the closed form `line_y` over `line_x`; `closed` and `autodiff` at `x`.

  `color` and `linestyle` are matplotlib's; a None color takes the curve's place in the cycle.
  """

  label: str
  line_x: np.ndarray
  line_y: np.ndarray
  x: np.ndarray
  closed: np.ndarray
  autodiff: np.ndarray
  color: str | None = None
  linestyle: str = "-"


_LegendLoc = Literal["best", "upper right", "upper left", "lower left", "lower right", "right",
                    "center left", "center right", "lower center", "upper center", "center"]


@dataclasses.dataclass(frozen=True)
class Figure:
  """A figure: its file `name`, `title`, axes, curves and where its legend goes (matplotlib's)."""

  name: str
  title: str
  xlabel: str
  curves: tuple[Curve, ...]
  ylabel: str = "gradient scale"
  xscale: str = "linear"
  legend_loc: _LegendLoc = "best"
  legend_columns: int = 1


def _c_axes(points: int, line_points: int, c_one_offset: float, *, start: float
            ) -> tuple[np.ndarray, np.ndarray]:
  """The autodiff points (`points` from `start`, the last at `C = 1 - c_one_offset`) and the
  closed form's `line_points` over `[0, 1]`."""
  grid = np.linspace(start, 1.0, points)
  grid[-1] = 1.0 - c_one_offset
  return grid, np.linspace(0.0, 1.0, line_points)


def _open_at_one(closed, line_x: np.ndarray) -> np.ndarray:
  """`closed` on `line_x`, whose last point is `C = 1`, where the closed form's open interval
  ends and the gradient scale is 0."""
  return np.append(np.asarray(closed(line_x[:-1])), 0.0)


def _by_tau(c: np.ndarray, taus: np.ndarray, n: int) -> np.ndarray:
  """Autodiff |dL/dC| with cos/tau, `[len(taus), len(c)]`, one compiled program."""
  fn = jax.jit(jax.vmap(
      lambda tau, c: gradients.gradient_scale(mappings.temperature(tau), c, n), in_axes=(0, None)))
  return np.asarray(fn(jnp.asarray(taus), jnp.asarray(c)))


def _by_n(mapping, c: np.ndarray, ns: Sequence[int]) -> list[np.ndarray]:
  """Autodiff |dL/dC| for each N (static: a Python loop) in one compiled program."""
  fn = jax.jit(lambda c: [gradients.gradient_scale(mapping, c, n) for n in ns])
  return [np.asarray(scale) for scale in fn(jnp.asarray(c))]


def _by_n_t(mapping: mappings.Mapping, c: np.ndarray, ns: Sequence[int]) -> list[np.ndarray]:
  """Autodiff |dL/dt| of `mapping.params["t"]`, at its bound value, for each N, one program."""

  def row0(bound, c, n):
    z1, z2 = pattern.pattern_embeddings(pattern.paper_pattern(c, n))
    return losses.info_nce(z1, z2, mapping=bound, reduction="none")[0]

  fn = jax.jit(lambda c: [
      jax.vmap(lambda ci, n=n: jax.grad(row0)(mapping, ci, n).params["t"])(c) for n in ns])
  return [np.abs(np.asarray(scale)) for scale in fn(jnp.asarray(c))]


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
  x, line_x = _c_axes(points, line_points, c_one_offset, start=0.025)
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
  x, line_x = _c_axes(points, line_points, c_one_offset, start=0.025)
  auto = _by_n(mappings.temperature(tau), x, ns)
  curves = tuple(Curve(f"N={n}", line_x, np.asarray(closed_forms.eq7(line_x, tau, n)), x,
                       np.asarray(closed_forms.eq7(x, tau, n)), auto[k])
                 for k, n in enumerate(ns))
  return Figure(name="figure4_eq7", xlabel="C", curves=curves,
                title=f"Figure 4: Eq. 7, |dL/dC| with tau = {tau:g}")


def figure5(*, ns: Sequence[int] = (2, 4, 8, 16), points: int = 20, line_points: int = 400,
            c_one_offset: float = 1e-6) -> Figure:
  """Figure 5: Eq. 13, `|dL/dC|` over C with the free mapping (Eq. 11), a curve per N."""
  x, line_x = _c_axes(points, line_points, c_one_offset, start=0.025)
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
  x, line_x = _c_axes(points, line_points, c_one_offset, start=0.0)
  t_grid = np.asarray(ts, np.float64)
  auto = np.asarray(gradients.temperature_gradient_scale(x[None, :], t_grid[:, None]))
  curves = tuple(Curve(f"t={t:g} (tau={np.exp(-t):.3g})", line_x,
                       np.asarray(closed_forms.eq10(line_x, t)), x,
                       np.asarray(closed_forms.eq10(x, t)), auto[k]) for k, t in enumerate(t_grid))
  return Figure(name="eq10_learnable_t", xlabel="C", ylabel="|dL/dt|", curves=curves,
                title="Eq. 10: |dL/dt| of CLIP's learnable exp(t) (N = 2), zero at C = 0")


def scaled_free_figure(*, ns: Sequence[int] = (2, 64, 512), tau: float = 0.1, points: int = 20,
                       line_points: int = 400, c_one_offset: float = 1e-6) -> Figure:
  r"""`|dL/dC|` of the N-aware free mapping beside free (Eq. 13) and `cos / tau` (Eq. 7), per N.

  For each N: free (`s = 1`, Eq. 13), `mappings.n_aware_free(num_candidates=N)` (Eq. 13 with
  the scale `s(N) = mappings.free_scale(N)`, `analysis.scaled_free_gradient_scale`; left out at
  N = 2, where it is free) and `mappings.temperature(tau)` (Eq. 7). One colour per N, one line
  style per mapping:

  .. math:: \left|\frac{\partial L_i}{\partial C}\right|
            = \frac{4 s}{1 - C^2} \frac{(N - 1) r^{2s}}{1 + (N - 1) r^{2s}},
            \qquad r = \frac{1 - C}{1 + C}

  The autodiff side differentiates `losses.info_nce` with each mapping itself
  (`gradients.gradient_scale`); its cost grows as `N^3` (the pattern's embeddings are
  `[N, N + 1]`).

  Examples:
    >>> import jax
    >>> from tfcl_jax.analysis import figures
    >>> with jax.enable_x64(True):
    ...   fig = figures.scaled_free_figure(ns=(2, 10), points=4, line_points=8)
    >>> [curve.label for curve in fig.curves]
    ['free, N=2', 'tau=0.1, N=2', 'free, N=10', 'free_n, N=10 (s=2)', 'tau=0.1, N=10']
    >>> max(float(abs(c.closed - c.autodiff).max()) for c in fig.curves) < 1e-12
    True

  Args:
    ns: candidate counts, Python ints >= 2.
    tau: the fixed temperature drawn beside them, > 0.
    points: autodiff points per curve.
    line_points: closed-form points per curve.
    c_one_offset: the last autodiff point is `C = 1 - c_one_offset`.

  Returns:
    A `Figure` named `scaled_free_scale`.

  References:
    Kim & Kim, arXiv 2501.17683, Eq. 7, 11, 12 and 13.
  """
  x, line_x = _c_axes(points, line_points, c_one_offset, start=0.025)
  free = _by_n(mappings.temperature_free(), x, ns)
  fixed = _by_n(mappings.temperature(tau), x, ns)
  curves = []
  for k, n in enumerate(ns):
    color = f"C{k}"
    curves.append(Curve(f"free, N={n}", line_x, np.asarray(closed_forms.eq13(line_x, n)), x,
                        np.asarray(closed_forms.eq13(x, n)), free[k], color, "-"))
    if n > 2:
      s = mappings.free_scale(n)
      line_y = _open_at_one(
          lambda c, n=n, s=s: closed_forms.scaled_free_gradient_scale(c, n, s), line_x)
      (auto,) = _by_n(mappings.n_aware_free(num_candidates=n), x, (n,))
      curves.append(Curve(f"free_n, N={n} (s={s:.3g})", line_x, line_y, x,
                          np.asarray(closed_forms.scaled_free_gradient_scale(x, n, s)), auto,
                          color, "--"))
    curves.append(Curve(f"tau={tau:g}, N={n}", line_x, np.asarray(closed_forms.eq7(line_x, tau, n)),
                        x, np.asarray(closed_forms.eq7(x, tau, n)), fixed[k], color, ":"))
  return Figure(name="scaled_free_scale", xlabel="C", curves=tuple(curves),
                legend_loc="upper right", legend_columns=2,
                title=f"|dL/dC| at [C, -C, ...]: free (-), free_n (--), tau = {tau:g} (:), "
                      "a colour per N")


def learnable_free_t_figure(*, ns: Sequence[int] = (2, 64, 512),
                            clip_t: float = round(math.log(1 / 0.07), 4), points: int = 20,
                            line_points: int = 400, c_one_offset: float = 1e-6) -> Figure:
  r"""`|dL/dt|` of `mappings.learnable_free` at its start `t = 0`, per N, beside Eq. 10 at `clip_t`.

  .. math:: \left|\frac{\partial L_i}{\partial t}\right|
            = 4 s \operatorname{artanh}(C) \frac{(N - 1) r^{2s}}{1 + (N - 1) r^{2s}},
            \qquad s = e^t, \; r = \frac{1 - C}{1 + C}

  (`analysis.learnable_free_t_gradient_scale`), zero at `C = 0` as CLIP's Eq. 10, which is drawn
  at N = 2 and CLIP's start `t = log(1 / 0.07)` (`analysis.eq10`). The autodiff side
  differentiates `losses.info_nce` in the mapping's own parameter `t`
  (`gradients.temperature_gradient_scale` for CLIP's).

  Examples:
    >>> import jax
    >>> from tfcl_jax.analysis import figures
    >>> with jax.enable_x64(True):
    ...   fig = figures.learnable_free_t_figure(ns=(2, 10), points=4, line_points=8)
    >>> [curve.label for curve in fig.curves]
    ['learnable_free t=0, N=2', 'learnable_free t=0, N=10', 'CLIP t=2.6593 (tau=0.07), N=2']
    >>> [float(curve.autodiff[0]) for curve in fig.curves]  # C = 0: no gradient on t
    [0.0, 0.0, 0.0]

  Args:
    ns: candidate counts for `learnable_free`, Python ints >= 2.
    clip_t: CLIP's log-scale for the Eq. 10 curve (its start `log(1 / 0.07)` by default).
    points: autodiff points per curve.
    line_points: closed-form points per curve.
    c_one_offset: the last autodiff point is `C = 1 - c_one_offset`.

  Returns:
    A `Figure` named `learnable_free_t`.

  References:
    Kim & Kim, arXiv 2501.17683, Eq. 8, 10, 11 and 12.
  """
  x, line_x = _c_axes(points, line_points, c_one_offset, start=0.0)
  learnable = _by_n_t(mappings.learnable_free(), x, ns)
  curves = []
  for k, n in enumerate(ns):
    line_y = _open_at_one(lambda c, n=n: closed_forms.learnable_free_t_gradient_scale(c, n, 0.0),
                          line_x)
    curves.append(Curve(f"learnable_free t=0, N={n}", line_x, line_y, x,
                        np.asarray(closed_forms.learnable_free_t_gradient_scale(x, n, 0.0)),
                        learnable[k], f"C{k}", "-"))
  curves.append(Curve(f"CLIP t={clip_t:g} (tau={np.exp(-clip_t):.3g}), N=2", line_x,
                      np.asarray(closed_forms.eq10(line_x, clip_t)), x,
                      np.asarray(closed_forms.eq10(x, clip_t)),
                      np.asarray(gradients.temperature_gradient_scale(x, clip_t)), "k", "--"))
  return Figure(name="learnable_free_t", xlabel="C", ylabel="|dL/dt|", curves=tuple(curves),
                title="|dL/dt| at [C, -C, ...]: learnable_free from t = 0 (free) and CLIP's exp(t) "
                      "(Eq. 10)")


def sigmoid_figure(*, n: int = 16, taus: Sequence[float] = (0.1, 0.5, 1.0), points: int = 20,
                   line_points: int = 400, c_one_offset: float = 1e-6) -> Figure:
  """`|dL/dC|` of the sigmoid loss at [C, -C, ...]: division by tau (b = 0), the free mapping with
  b = 0 and with the best b at C = 1 (-log(N - 1) / 2), and the doubled log-odds."""
  x, line_x = _c_axes(points, line_points, c_one_offset, start=0.025)
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
  x, line_x = _c_axes(points, line_points, c_one_offset, start=0.0)
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
    color = curve.color or f"C{k}"
    ax.plot(curve.line_x, curve.line_y, color=color, linestyle=curve.linestyle, label=curve.label)
    ax.plot(curve.x, curve.autodiff, "o", color=color, markersize=3.5, markerfacecolor="none")
  ax.plot([], [], "ko", markersize=3.5, markerfacecolor="none", label="autodiff (the loss)")
  ax.set_xscale(figure.xscale)
  ax.set_xlabel(figure.xlabel)
  ax.set_ylabel(figure.ylabel)
  ax.set_title(figure.title, fontsize=9)
  ax.set_ylim(bottom=0.0)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc=figure.legend_loc, ncols=figure.legend_columns)
  return ax
