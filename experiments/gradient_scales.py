r"""Figures 2-5 and Eq. 10 of Kim & Kim (arXiv 2501.17683): gradient scales at [C, -C, ..., -C],
and the same for the sigmoid (SigLIP) loss.

Each figure draws the closed form (`tfcl_jax.analysis.eq4/eq7/eq10/eq13`, `analysis.sigmoid`)
as a line and the autodiff value through the library's loss (`analysis.gradient_scale`,
`analysis.sigmoid.sigmoid_gradient_scale`) as points on top, and
`gradient_scales.csv` lists both at every point. Command: see `configs/gradient_scales_paper.py`.
"""

from __future__ import annotations

import csv
import os
import sys

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import tqdm

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402

from experiments import cli  # noqa: E402
from tfcl_jax import analysis, mappings  # noqa: E402
from tfcl_jax.analysis import sigmoid  # noqa: E402

_DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "configs", "gradient_scales_paper.py")
CSV_COLUMNS = ("figure", "curve", "x", "closed_form", "autodiff", "abs_diff")


def _c_grid(config, points: int, *, start: float = 0.0) -> np.ndarray:
  """C in [start, 1) for autodiff markers; the last marker is 1 - c_one_offset."""
  grid = np.linspace(start, 1.0, points)
  grid[-1] = 1.0 - config.c_one_offset
  return grid


def _by_tau(C: np.ndarray, taus: np.ndarray, n: int) -> np.ndarray:
  """Autodiff |dL/dC| with cos/tau, `[len(taus), len(C)]`, one compiled program."""
  fn = jax.jit(jax.vmap(lambda tau, c: analysis.gradient_scale(mappings.temperature(tau), c, n),
                        in_axes=(0, None)))
  return np.asarray(fn(jnp.asarray(taus), jnp.asarray(C)))


def _by_n(mapping, C: np.ndarray, ns) -> list[np.ndarray]:
  """Autodiff |dL/dC| for each N (static: a Python loop) in one compiled program."""
  fn = jax.jit(lambda c: [analysis.gradient_scale(mapping, c, n) for n in ns])
  return [np.asarray(scale) for scale in fn(jnp.asarray(C))]


def figure2(config):
  taus = np.asarray(config.figure2_taus)
  x = _c_grid(config, config.autodiff_points, start=0.025)
  line_x = np.linspace(0.0, 1.0, config.line_points)
  auto = _by_tau(x, taus, 2)
  return dict(
      name="figure2_eq4", xlabel="C", title="Figure 2: Eq. 4, |dL/dC| with division by tau (N = 2)",
      curves=[(f"tau={tau:g}", line_x, np.asarray(analysis.eq4(line_x, tau)), x,
               np.asarray(analysis.eq4(x, tau)), auto[k]) for k, tau in enumerate(taus)])


def figure3(config):
  low, high = config.figure3_tau_range
  x = np.geomspace(low, high, config.autodiff_points)
  line_x = np.geomspace(low, high, config.line_points)
  cs = np.minimum(np.asarray(config.figure3_cs), 1.0 - config.c_one_offset)
  auto = _by_tau(cs, x, 2)  # [tau, C]
  curves = []
  for k, (label, c) in enumerate(zip(config.figure3_cs, cs, strict=True)):
    name = f"C={label:g}" if c == label else f"C->1 (1-{config.c_one_offset:g})"
    curves.append((name, line_x, np.asarray(analysis.eq4(c, line_x)), x,
                   np.asarray(analysis.eq4(c, x)), auto[:, k]))
  return dict(name="figure3_eq4_tau", xlabel="tau", xscale="log",
              title="Figure 3: Eq. 4 over tau (N = 2)", curves=curves)


def figure4(config):
  tau = config.figure4_tau
  x = _c_grid(config, config.autodiff_points, start=0.025)
  line_x = np.linspace(0.0, 1.0, config.line_points)
  auto = _by_n(mappings.temperature(tau), x, config.ns)
  curves = [(f"N={n}", line_x, np.asarray(analysis.eq7(line_x, tau, n)), x,
             np.asarray(analysis.eq7(x, tau, n)), auto[k]) for k, n in enumerate(config.ns)]
  return dict(name="figure4_eq7", xlabel="C", curves=curves,
              title=f"Figure 4: Eq. 7, |dL/dC| with tau = {tau:g}")


def figure5(config):
  x = _c_grid(config, config.autodiff_points, start=0.025)
  line_x = np.linspace(0.0, 1.0, config.line_points)
  auto = _by_n(mappings.temperature_free(), x, config.ns)
  curves = [(f"N={n}", line_x, np.asarray(analysis.eq13(line_x, n)), x,
             np.asarray(analysis.eq13(x, n)), auto[k]) for k, n in enumerate(config.ns)]
  return dict(name="figure5_eq13", xlabel="C", curves=curves,
              title="Figure 5: Eq. 13, |dL/dC| temperature-free")


def eq10_figure(config):
  ts = np.asarray(config.eq10_ts)
  x = _c_grid(config, config.autodiff_points, start=0.0)
  line_x = np.linspace(0.0, 1.0, config.line_points)
  auto = np.asarray(analysis.temperature_gradient_scale(x[None, :], ts[:, None]))
  curves = [(f"t={t:g} (tau={np.exp(-t):.3g})", line_x, np.asarray(analysis.eq10(line_x, t)), x,
             np.asarray(analysis.eq10(x, t)), auto[k]) for k, t in enumerate(ts)]
  return dict(name="eq10_learnable_t", xlabel="C", curves=curves,
              title="Eq. 10: |dL/dt| of CLIP's learnable exp(t) (N = 2), zero at C = 0")


def sigmoid_figure(config):
  """|dL/dC| of the sigmoid loss: division by tau, the free map (b = 0, the best b at C = 1,
  and the doubled log-odds), N = config.sigmoid_n."""
  n = config.sigmoid_n
  x = _c_grid(config, config.autodiff_points, start=0.025)
  line_x = np.linspace(0.0, 1.0, config.line_points)
  free = mappings.temperature_free()
  best_b = -0.5 * np.log(n - 1.0)
  cases = [(f"tau={tau:g}, b=0", mappings.temperature(tau), 0.0,
            lambda c, tau=tau: sigmoid.sigmoid_gradient_scale_tau(c, tau, n))
           for tau in config.sigmoid_taus]
  cases += [("free, b=0", free, 0.0, lambda c: sigmoid.sigmoid_gradient_scale_free(c, n)),
            (f"free, b={best_b:.2f}", free, best_b,
             lambda c: sigmoid.sigmoid_gradient_scale_free(c, n, b=best_b)),
            ("free x2 (4 artanh c), b=0", lambda c: 2.0 * free(c), 0.0,
             lambda c: sigmoid.sigmoid_gradient_scale_free(c, n, k=2.0))]
  curves = [(label, line_x, np.asarray(closed(line_x)), x, np.asarray(closed(x)),
             np.asarray(sigmoid.sigmoid_gradient_scale(mapping, x, n, bias=b)))
            for label, mapping, b, closed in cases]
  return dict(name="sigmoid_scale", xlabel="C", curves=curves,
              title=f"Sigmoid loss: |dL/dC| at [C, -C, ...] (N = {n})")


def sigmoid_t_figure(config):
  """|dL/dt| of the sigmoid loss with SigLIP's exp(t) cos + b: zero at C = 0 (Eq. 10's analogue)."""
  n = config.sigmoid_n
  x = _c_grid(config, config.autodiff_points, start=0.0)
  line_x = np.linspace(0.0, 1.0, config.line_points)
  curves = []
  for t in config.sigmoid_ts:
    for b in config.sigmoid_biases:
      dt, _ = sigmoid.sigmoid_parameter_gradients(x, t, n, bias=b)
      curves.append((f"t={t:g}, b={b:g}", line_x,
                     np.asarray(sigmoid.sigmoid_gradient_t(line_x, t, n, b=b)), x,
                     np.asarray(sigmoid.sigmoid_gradient_t(x, t, n, b=b)), np.abs(dt)))
  return dict(name="sigmoid_learnable_t", xlabel="C", ylabel="|dL/dt|", curves=curves,
              title=f"Sigmoid loss: |dL/dt| of exp(t) cos + b (N = {n}), zero at C = 0")


FIGURES = (figure2, figure3, figure4, figure5, eq10_figure, sigmoid_figure, sigmoid_t_figure)


def _plot(figure, path: str) -> None:
  fig, ax = plt.subplots(figsize=(5.5, 4.0))
  for k, (label, line_x, line_y, x, _, auto) in enumerate(figure["curves"]):
    color = f"C{k}"
    ax.plot(line_x, line_y, color=color, label=label)
    ax.plot(x, auto, "o", color=color, markersize=3.5, markerfacecolor="none")
  ax.plot([], [], "ko", markersize=3.5, markerfacecolor="none", label="autodiff (the loss)")
  ax.set_xscale(figure.get("xscale", "linear"))
  ax.set_xlabel(figure["xlabel"])
  default_label = "gradient scale" if figure["name"] != "eq10_learnable_t" else "|dL/dt|"
  ax.set_ylabel(figure.get("ylabel", default_label))
  ax.set_title(figure["title"], fontsize=9)
  ax.set_ylim(bottom=0.0)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def run(config, workdir: str) -> dict:
  """Computes every figure, writes PNGs, `gradient_scales.csv`, `results.csv`, `results.md`."""
  os.makedirs(workdir, exist_ok=True)
  rows, summary, pngs = [], [], []
  with jax.enable_x64(config.x64):
    for make in tqdm.tqdm(FIGURES, desc="figures", file=sys.stderr):
      figure = make(config)
      for label, _, _, x, closed, auto in figure["curves"]:
        diff = np.abs(closed - auto)
        if not np.all(np.isfinite(auto)):
          raise FloatingPointError(f"non-finite autodiff value in {figure['name']} {label}.")
        rows += [dict(figure=figure["name"], curve=label, x=xi, closed_form=ci, autodiff=ai,
                      abs_diff=di) for xi, ci, ai, di in zip(x, closed, auto, diff, strict=True)]
        summary.append(dict(figure=figure["name"], curve=label, points=len(x),
                            max_abs_diff=float(diff.max()),
                            max_rel_diff=float(np.max(diff / np.maximum(np.abs(closed), 1e-300))),
                            scale_at_largest_x=float(closed[-1])))
      pngs.append(os.path.join(workdir, figure["name"] + ".png"))
      _plot(figure, pngs[-1])
  _write_csv(os.path.join(workdir, "gradient_scales.csv"), rows, CSV_COLUMNS)
  _write_csv(os.path.join(workdir, "results.csv"), summary, tuple(summary[0]))
  _write_markdown(os.path.join(workdir, "results.md"), summary, config)
  return dict(max_abs_diff=max(r["max_abs_diff"] for r in summary), pngs=pngs, rows=len(rows))


def _write_csv(path, rows, columns) -> None:
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=columns)
    writer.writeheader()
    writer.writerows({k: f"{v:.17g}" if isinstance(v, float) else v for k, v in r.items()}
                     for r in rows)


def _write_markdown(path, summary, config) -> None:
  lines = ["# Gradient scales at [C, -C, ..., -C]: closed form vs autodiff through the losses", "",
           f"float64: {config.x64}. `scale_at_largest_x` is the closed form at the last marker "
           f"(C = 1 - {config.c_one_offset:g} on C axes, tau = {config.figure3_tau_range[1]:g} "
           "in Figure 3).", "",
           "| figure | curve | points | max abs diff | max rel diff | scale at largest x |",
           "|---|---|---|---|---|---|"]
  lines += [f"| {r['figure']} | {r['curve']} | {r['points']} | {r['max_abs_diff']:.2e} | "
            f"{r['max_rel_diff']:.2e} | {r['scale_at_largest_x']:.4g} |" for r in summary]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def _run_and_report(config, workdir: str) -> None:
  result = run(config, workdir)
  print(f"Wrote {len(result['pngs'])} figures and {result['rows']} CSV rows to "
        f"{os.path.abspath(workdir)}:")
  for name in result["pngs"] + ["gradient_scales.csv", "results.csv", "results.md"]:
    print("  " + os.path.join(os.path.abspath(workdir), os.path.basename(name)))
  print(f"max |closed form - autodiff| = {result['max_abs_diff']:.3e}")


if __name__ == "__main__":
  cli.run_main(_run_and_report, default_config=_DEFAULT_CONFIG, workdir_aliases=("out",),
               usage="pass --out DIR (or --workdir DIR)")
