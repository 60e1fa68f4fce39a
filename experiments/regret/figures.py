"""The regret study's figures: `regret.png` (candidates × rows coloured by regret) and
`regret_scales.png` (what each candidate's scale did over training, one panel per row family)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from experiments.regret.rows import CANDIDATES
from experiments.regret.scales import ScaleTrace
from experiments.regret.study import Study, within_noise

_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D")


def _pyplot():
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  return plt


def draw_regret(result: Study, file) -> None:
  """Rows × candidates, each cell coloured by its mean regret (red: behind the best τ); grey:
  not yet run; `*`: beyond seed noise."""
  import matplotlib.colors as mcolors  # noqa: PLC0415

  plt = _pyplot()
  rows = result.rows
  by_cell = {(c["row"], c["candidate"]): c for c in result.full}
  grid = np.full((len(rows), len(CANDIDATES)), np.nan)
  for i, row in enumerate(rows):
    for j, candidate in enumerate(CANDIDATES):
      if (row.key, candidate) in by_cell:
        grid[i, j] = by_cell[(row.key, candidate)]["regret"]
  finite = grid[np.isfinite(grid)]
  high = max(1.0, float(finite.max())) if finite.size else 1.0
  low = min(-1.0, float(finite.min())) if finite.size else -1.0
  fig, ax = plt.subplots(figsize=(13, 10))
  cmap = plt.get_cmap("RdBu_r").with_extremes(bad="#dddddd")
  image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto",
                    norm=mcolors.TwoSlopeNorm(vmin=low, vcenter=0.0, vmax=high))
  for i, row in enumerate(rows):
    for j, candidate in enumerate(CANDIDATES):
      c = by_cell.get((row.key, candidate))
      text = "not run" if c is None else f"{c['regret']:+.1f}" + ("" if within_noise(c) else "*")
      ax.text(j, i, text, ha="center", va="center", fontsize=7,
              color="black" if c is None or abs(c["regret"]) < 0.6 * max(high, -low)
              else "white")
  ax.set_xticks(range(len(CANDIDATES)), CANDIDATES, rotation=35, ha="right", fontsize=8)
  ax.set_yticks(range(len(rows)), [r.title for r in rows], fontsize=7)
  fig.colorbar(image, ax=ax, label="regret: best fixed τ − candidate (metric points)")
  ax.set_title("Regret against each row's best fixed τ (* beyond seed noise)")
  fig.tight_layout()
  fig.savefig(file, format="png", dpi=110, metadata={"Software": None})
  plt.close(fig)


def families(rows) -> list[str]:
  """The row families in the rows' order."""
  return list(dict.fromkeys(row.family for row in rows))


def draw_scales(rows, found: Sequence[ScaleTrace], file) -> None:
  """One panel per row family with a recorded scale: each candidate's scale (mean over seeds)
  against the fraction of training, a colour per candidate, a line style and marker per row."""
  plt = _pyplot()
  colours = [*plt.get_cmap("tab10").colors, "black", "#9467bd80"]
  drawn = [family for family in families(rows) if any(t.row.family == family for t in found)]
  columns = min(4, max(1, len(drawn)))
  lines = -(-max(1, len(drawn)) // columns)
  fig, axes = plt.subplots(lines, columns, figsize=(4.8 * columns, 6.0 * lines), squeeze=False)
  for ax, family in zip(axes.flat, drawn, strict=False):
    mine = [t for t in found if t.row.family == family]
    keys = list(dict.fromkeys(t.row.key for t in mine))
    for t in mine:
      k = keys.index(t.row.key)
      ax.plot(t.progress, t.scale, color=colours[CANDIDATES.index(t.candidate)],
              ls=_STYLES[k % len(_STYLES)], marker=_MARKERS[k // len(_STYLES) % len(_MARKERS)],
              ms=3, label=f"{t.candidate} · {t.row.key}")
    ax.set_yscale("log")
    ax.set_xlim(-0.05, 1.05)
    ax.set_xlabel("fraction of training")
    ax.set_ylabel("scale: min(exp(t), cap), or solved from the batch", fontsize=8)
    ax.set_title(family, fontsize=10)
    # Below the panel: a legend inside would hide the lines of a busy family.
    ax.legend(fontsize=5.5, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
  for ax in axes.flat[len(drawn):]:
    ax.set_axis_off()
  if not drawn:
    axes[0][0].text(0.5, 0.5, "no scale recorded yet", ha="center", va="center")
  fig.suptitle("What each candidate's scale did over training (mean over seeds)")
  fig.tight_layout()
  fig.savefig(file, format="png", dpi=110, metadata={"Software": None})
  plt.close(fig)
