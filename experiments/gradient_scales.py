r"""Figures 2-5 and Eq. 10 of Kim & Kim (arXiv 2501.17683): gradient scales at [C, -C, ..., -C].

Each figure draws the closed form (`tfcl_jax.analysis.eq4/eq7/eq10/eq13`) as a line and the
autodiff value through `losses.info_nce` (`analysis.gradient_scale`) as points on top, and
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

from tfcl_jax import analysis, mappings  # noqa: E402

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
  curves = [(f"N={n}", line_x, np.asarray(analysis.eq7(line_x, tau, n)), x,
             np.asarray(analysis.eq7(x, tau, n)), _by_tau(x, np.array([tau]), n)[0])
            for n in config.ns]
  return dict(name="figure4_eq7", xlabel="C", curves=curves,
              title=f"Figure 4: Eq. 7, |dL/dC| with tau = {tau:g}")


def figure5(config):
  x = _c_grid(config, config.autodiff_points, start=0.025)
  line_x = np.linspace(0.0, 1.0, config.line_points)
  free = mappings.temperature_free()
  curves = [(f"N={n}", line_x, np.asarray(analysis.eq13(line_x, n)), x,
             np.asarray(analysis.eq13(x, n)), np.asarray(analysis.gradient_scale(free, x, n)))
            for n in config.ns]
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


FIGURES = (figure2, figure3, figure4, figure5, eq10_figure)


def _plot(figure, path: str) -> None:
  fig, ax = plt.subplots(figsize=(5.5, 4.0))
  for k, (label, line_x, line_y, x, _, auto) in enumerate(figure["curves"]):
    color = f"C{k}"
    ax.plot(line_x, line_y, color=color, label=label)
    ax.plot(x, auto, "o", color=color, markersize=3.5, markerfacecolor="none")
  ax.plot([], [], "ko", markersize=3.5, markerfacecolor="none", label="autodiff (info_nce)")
  ax.set_xscale(figure.get("xscale", "linear"))
  ax.set_xlabel(figure["xlabel"])
  ax.set_ylabel("gradient scale" if figure["name"] != "eq10_learnable_t" else "|dL/dt|")
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
  lines = ["# Gradient scales at [C, -C, ..., -C]: closed form vs autodiff through info_nce", "",
           f"float64: {config.x64}. `scale_at_largest_x` is the closed form at the last marker "
           f"(C = 1 - {config.c_one_offset:g} on C axes, tau = {config.figure3_tau_range[1]:g} "
           "in Figure 3).", "",
           "Autodiff reads the positive's pull as `p_positive - 1`; where the scale is far below "
           "machine epsilon times its peak (tau = 0.02 in Figure 3, tau = 0.1 near C = 1) that "
           "difference rounds, so the relative difference is large there while the absolute one "
           "stays at the ulp level (see the max abs diff column).", "",
           "| figure | curve | points | max abs diff | max rel diff | scale at largest x |",
           "|---|---|---|---|---|---|"]
  lines += [f"| {r['figure']} | {r['curve']} | {r['points']} | {r['max_abs_diff']:.2e} | "
            f"{r['max_rel_diff']:.2e} | {r['scale_at_largest_x']:.4g} |" for r in summary]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def main() -> None:
  from absl import app, flags
  from ml_collections import config_flags

  config = config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG, "Figure configuration.")
  workdir = flags.DEFINE_string("workdir", None, "Output directory (PNGs, CSV, results.md).")
  flags.DEFINE_alias("out", "workdir")
  flags.mark_flags_as_required(["workdir"])

  def _main(argv):
    del argv
    result = run(config.value, workdir.value)
    print(f"Wrote {len(result['pngs'])} figures and {result['rows']} CSV rows to "
          f"{os.path.abspath(workdir.value)}:")
    for name in result["pngs"] + ["gradient_scales.csv", "results.csv", "results.md"]:
      print("  " + os.path.join(os.path.abspath(workdir.value), os.path.basename(name)))
    print(f"max |closed form - autodiff| = {result['max_abs_diff']:.3e}")

  app.run(_main)


if __name__ == "__main__":
  main()
