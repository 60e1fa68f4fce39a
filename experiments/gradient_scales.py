r"""Figures 2-5 and Eq. 10 of Kim & Kim (arXiv 2501.17683): gradient scales at [C, -C, ..., -C],
and the same for the scaled free mappings (free_n, learnable_free) and the sigmoid (SigLIP) loss.

Each figure (`tfcl_jax.analysis.figures`, shared with the notebooks) draws the closed form
(`tfcl_jax.analysis.eq4/eq7/eq10/eq13`, `analysis.scaled_free_gradient_scale`,
`analysis.learnable_free_t_gradient_scale`, `analysis.sigmoid`) as a line and the autodiff value
through the library's loss (`analysis.gradient_scale`, `analysis.sigmoid.sigmoid_gradient_scale`)
as points on top, and `gradient_scales.csv` lists both at every point.

Run: python -m experiments.gradient_scales --workdir=DIR
  [--config=experiments/configs/gradient_scales_paper.py --config.figure4_tau=0.5]
"""

from __future__ import annotations

import csv
import math
import os

import jax
import matplotlib
import numpy as np

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402

from experiments.framework import experiment, plan, sweep, tables  # noqa: E402
from tfcl_jax.analysis import figures  # noqa: E402

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                              "gradient_scales_paper.py")
CSV_COLUMNS = ("figure", "curve", "x", "closed_form", "autodiff", "abs_diff")


def make_figures(config) -> list[figures.Figure]:
  """Every figure with the config's settings (`configs/gradient_scales_paper.py`)."""
  grid = dict(points=config.autodiff_points, line_points=config.line_points,
              c_one_offset=config.c_one_offset)
  return [
      figures.figure2(taus=config.figure2_taus, **grid),
      figures.figure3(cs=config.figure3_cs, tau_range=config.figure3_tau_range, **grid),
      figures.figure4(tau=config.figure4_tau, ns=config.ns, **grid),
      figures.figure5(ns=config.ns, **grid),
      figures.eq10_figure(ts=config.eq10_ts, **grid),
      figures.scaled_free_figure(ns=config.scaled_free_ns, tau=config.scaled_free_tau, **grid),
      figures.learnable_free_t_figure(ns=config.scaled_free_ns, clip_t=config.clip_t, **grid),
      figures.sigmoid_figure(n=config.sigmoid_n, taus=config.sigmoid_taus, **grid),
      figures.sigmoid_t_figure(n=config.sigmoid_n, ts=config.sigmoid_ts,
                               biases=config.sigmoid_biases, **grid),
  ]


def _save(figure: figures.Figure, path: str) -> None:
  fig, ax = plt.subplots(figsize=(5.5, 4.0))
  figures.plot(figure, ax)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def check_config(config) -> None:
  """The grids' sizes, the temperatures, the scaled free mappings' N and the range of Figure 3.

  Raises:
    ConfigError: naming the first bad field.
  """
  plan.check_fields(config, positive=("line_points", "autodiff_points", "sigmoid_n"),
                    positive_numbers=("figure4_tau", "c_one_offset", "scaled_free_tau"))
  if not isinstance(config.clip_t, (int, float)) or not math.isfinite(config.clip_t):
    raise plan.ConfigError(f"config.clip_t must be a finite number, got {config.clip_t!r}.")
  try:
    ns = tuple(config.scaled_free_ns)
  except TypeError:  # not a sequence
    ns = ()
  if not ns or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 2 for n in ns):
    raise plan.ConfigError(f"config.scaled_free_ns must be candidate counts, ints >= 2, got "
                           f"{config.scaled_free_ns!r}.")
  try:
    low_high = tuple(config.figure3_tau_range)
  except TypeError:  # not a sequence
    low_high = ()
  if len(low_high) != 2 or not all(isinstance(t, (int, float)) for t in low_high) or not (
      0 < low_high[0] < low_high[1]):
    raise plan.ConfigError(f"config.figure3_tau_range must be two temperatures 0 < low < high, "
                           f"got {config.figure3_tau_range!r}.")


@sweep.study
def train_and_evaluate(config, workdir: str) -> dict:
  """Computes every figure (`check_config` passed), writes PNGs, `gradient_scales.csv`,
  `results.csv`, `results.md`. Nothing trains: the figures are gradients at fixed points."""
  rows, summary = [], []
  with jax.enable_x64(config.x64):
    made = make_figures(config)
  for figure in made:
    for curve in figure.curves:
      diff = np.abs(curve.closed - curve.autodiff)
      if not np.all(np.isfinite(curve.autodiff)):
        raise FloatingPointError(f"non-finite autodiff value in {figure.name} {curve.label}.")
      rows += [dict(figure=figure.name, curve=curve.label, x=xi, closed_form=ci, autodiff=ai,
                    abs_diff=di)
               for xi, ci, ai, di in zip(curve.x, curve.closed, curve.autodiff, diff, strict=True)]
      summary.append(dict(
          figure=figure.name, curve=curve.label, points=len(curve.x),
          max_abs_diff=float(diff.max()),
          max_rel_diff=float(np.max(diff / np.maximum(np.abs(curve.closed), 1e-300))),
          scale_at_largest_x=float(curve.closed[-1])))
  with open(os.path.join(workdir, "gradient_scales.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    writer.writerows({k: f"{v:.17g}" if isinstance(v, float) else v for k, v in r.items()}
                     for r in rows)
  tables.write_results(
      workdir, summary, markdown=_markdown(summary, config),
      figures=[lambda path, f=f: _save(f, os.path.join(path, f.name + ".png")) for f in made])
  pngs = [os.path.join(workdir, f.name + ".png") for f in made]
  return dict(max_abs_diff=max(r["max_abs_diff"] for r in summary), pngs=pngs, rows=len(rows))


def _markdown(summary, config) -> str:
  lines = ["# Gradient scales at [C, -C, ..., -C]: closed form vs autodiff through the losses", "",
           f"float64: {config.x64}. `scale_at_largest_x` is the closed form at the last marker "
           f"(C = 1 - {config.c_one_offset:g} on C axes, tau = {config.figure3_tau_range[1]:g} "
           "in Figure 3).", "",
           "| figure | curve | points | max abs diff | max rel diff | scale at largest x |",
           "|---|---|---|---|---|---|"]
  lines += [f"| {r['figure']} | {r['curve']} | {r['points']} | {r['max_abs_diff']:.2e} | "
            f"{r['max_rel_diff']:.2e} | {r['scale_at_largest_x']:.4g} |" for r in summary]
  return "\n".join(lines) + "\n"


EXPERIMENT = experiment.Experiment(
    name="gradient_scales", kind="study", train_and_evaluate=train_and_evaluate,
    check_config=check_config, configs=("experiments/configs/gradient_scales_paper.py",),
    default_config=DEFAULT_CONFIG)

if __name__ == "__main__":
  EXPERIMENT.main()
