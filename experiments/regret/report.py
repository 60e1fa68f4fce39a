r"""The regret study's outputs: `results/regret.md` (summary, screening, every row, per-row
detail), `regret.csv` (one line per cell and stage) and `regret.png` (candidates × rows coloured
by regret), all from `experiments.regret.study` of the committed CSVs.

Run: python -m experiments.regret            (writes results/regret.md, .csv, .png)
     python -m experiments.regret --check    (exit 1 when regret.md or regret.csv differ)
`python -m experiments.regenerate` runs it after every other table.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
from collections.abc import Mapping

import numpy as np

from experiments.framework import tables
from experiments.regret.study import (
  ALPHA,
  CANDIDATES,
  RESULTS,
  ROWS,
  fixed_tau,
  study,
  within_noise,
)

NAME = "regret"
COMMAND = "python -m experiments.regret"

CSV_COLUMNS = ("row", "candidate", "reference", "seeds", "of_seeds", "regret", "sem",
               "p_value", "seeds_won", "stage", "pairs", "table", "reference_table")


def _fmt(value: float, digits: int = 2) -> str:
  return "-" if not math.isfinite(value) else f"{value:+.{digits}f}"


def _p(value: float) -> str:
  return "-" if not math.isfinite(value) else f"{value:.2g}"


def csv_rows(result: Mapping) -> list[dict]:
  """Every full cell (stage `full`) and every screening cell (stage `screening`)."""
  return ([dict(c, stage="full") for c in result["full"]]
          + [dict(c, stage="screening") for c in result["screen"]])


def summary_table(result: Mapping) -> list[str]:
  """The summary over every row, one line per candidate (the README shows the same lines)."""
  lines = ["| candidate | rows run | worst-case regret (row) | mean regret | rows within noise |",
           "|---|---|---|---|---|"]
  for s in result["full_summary"]:
    lines.append(f"| `{s['candidate']}` | {s['rows']}/{s['of_rows']} | "
                 f"{_fmt(s['worst'])} ({s['worst_row'] or '-'}) | {_fmt(s['mean'])} | "
                 f"{s['within_noise']}/{s['rows']} |")
  return lines


def markdown(result: Mapping) -> str:
  all_runs = result["all_runs"]
  lines = [
      "# Regret of each candidate default against the best fixed τ", "",
      f"Command: `{COMMAND}` (from the committed per-seed CSVs; the protocol, rows, seeds and",
      "rules are pre-registered in `docs/regret.md`).", "",
      "Regret = best fixed τ − candidate, paired by seed, in units of one metric point (0.01 of",
      "F1, accuracy, ROC-AUC or top-100; 0.005 of NDCG@10): positive = the candidate is worse.",
      f"Within noise: regret ≤ 0 or paired t-test p > {ALPHA}.", "",
      "## Summary over every row", "",
      *summary_table(result),
  ]
  lines += ["", f"Recommended default by the decision rule: {result['decision']}.", "",
            "## Screening", "",
            "Screening rows: " + ", ".join(f"{r.key} (seeds 0-{r.screening_seeds - 1})"
                                           for r in ROWS if r.screening) + ".", "",
            "| candidate | screening rows run | worst-case regret (row) | mean regret "
            "| rows within noise | goes on to every row |", "|---|---|---|---|---|---|"]
  for s in result["screen_summary"]:
    going = result["verdict"].get(s["candidate"], "every row (not screened)")
    lines.append(f"| `{s['candidate']}` | {s['rows']}/{s['of_rows']} | {_fmt(s['worst'])} "
                 f"({s['worst_row'] or '-'}) | {_fmt(s['mean'])} | "
                 f"{s['within_noise']}/{s['rows']} | {going} |")
  lines += ["", "## Every row", "",
            "Mean regret (s.e.) over the row's seeds; `*` beyond seed noise (p ≤ 0.05, behind "
            "the reference); `-` not yet run at the row's seed count.", "",
            "| row | best fixed τ | " + " | ".join(f"`{c}`" for c in CANDIDATES) + " |",
            "|---|---|" + "---|" * len(CANDIDATES)]
  by_cell = {(c["row"], c["candidate"]): c for c in result["full"]}
  for runs in all_runs:
    ref = (f"{runs.reference} ({100 * runs.grid[runs.reference]:.2f})"
           if runs.reference else "grid not yet run")
    cellstr = []
    for candidate in CANDIDATES:
      c = by_cell.get((runs.row.key, candidate))
      cellstr.append("-" if c is None else f"{_fmt(c['regret'])} ({c['sem']:.2f})"
                     + ("" if within_noise(c) else "*"))
    lines.append(f"| {runs.row.title} | {ref} | " + " | ".join(cellstr) + " |")
  lines += ["", "![regret per row and candidate](regret.png)", "",
            "## Per row: seeds, p, seeds won, where the runs come from", ""]
  for runs in all_runs:
    row = runs.row
    lines += [f"### {row.title}", ""]
    if runs.reference is None:
      grid = ", ".join(f"`{t}.csv`" for t in row.tables[:row.grid_tables])
      lines += [f"No reference yet: its fixed-τ grid ({grid}) is not all committed.", ""]
      continue
    grid = ", ".join(f"{spec} {100 * mean:.2f}" for spec, mean in
                     sorted(runs.grid.items(), key=lambda kv: fixed_tau(kv[0])))
    lines += [f"Fixed-τ grid (mean over {row.seeds} seeds, metric × 100): {grid}. Reference: "
              f"`{row.prefix}{runs.reference}` from `{runs.reference_table}.csv`."]
    for table, diff in runs.reruns().items():
      lines.append(f"Its rerun in `{table}.csv` reproduces it exactly on every seed." if diff == 0
                   else f"Its rerun in `{table}.csv` differs from it by at most {diff:.3g} units "
                   "per seed.")
    lines += ["", "| candidate | stage | seeds | regret (s.e.) | paired p | seeds won | runs |",
              "|---|---|---|---|---|---|---|"]
    shown = {(c["row"], c["candidate"]): ("full", c) for c in result["full"]}
    for c in result["screen"]:
      shown.setdefault((c["row"], c["candidate"]), ("screening", c))
    for candidate in CANDIDATES:
      if (row.key, candidate) not in shown:
        lines.append(f"| `{row.prefix}{candidate}` | not yet run | | | | | |")
        continue
      stage, c = shown[(row.key, candidate)]
      source = (f"`{c['table']}.csv`" if c["pairs"] == "same sweep" else
                f"`{c['table']}.csv` against `{c['reference_table']}.csv` (across sweeps)")
      lines.append(f"| `{row.prefix}{candidate}` | {stage} | {c['seeds']}/{c['of_seeds']} | "
                   f"{_fmt(c['regret'])} ({c['sem']:.2f}) | {_p(c['p_value'])} | "
                   f"{c['seeds_won']}/{c['seeds']} | {source} |")
    lines.append("")
  return "\n".join(lines)


def draw(result: Mapping, file) -> None:
  """Candidates × rows, each cell coloured by its mean regret (red: behind the best τ); grey:
  not yet run; a dot: within seed noise."""
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.colors as mcolors  # noqa: PLC0415
  import matplotlib.pyplot as plt  # noqa: PLC0415

  by_cell = {(c["row"], c["candidate"]): c for c in result["full"]}
  grid = np.full((len(ROWS), len(CANDIDATES)), np.nan)
  for i, row in enumerate(ROWS):
    for j, candidate in enumerate(CANDIDATES):
      if (row.key, candidate) in by_cell:
        grid[i, j] = by_cell[(row.key, candidate)]["regret"]
  finite = grid[np.isfinite(grid)]
  high = max(1.0, float(finite.max())) if finite.size else 1.0
  low = min(-1.0, float(finite.min())) if finite.size else -1.0
  fig, ax = plt.subplots(figsize=(11, 8))
  cmap = plt.get_cmap("RdBu_r").with_extremes(bad="#dddddd")
  image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto",
                    norm=mcolors.TwoSlopeNorm(vmin=low, vcenter=0.0, vmax=high))
  for i, row in enumerate(ROWS):
    for j, candidate in enumerate(CANDIDATES):
      c = by_cell.get((row.key, candidate))
      text = "not run" if c is None else f"{c['regret']:+.1f}" + ("" if within_noise(c) else "*")
      ax.text(j, i, text, ha="center", va="center", fontsize=7,
              color="black" if c is None or abs(c["regret"]) < 0.6 * max(high, -low)
              else "white")
  ax.set_xticks(range(len(CANDIDATES)), CANDIDATES, rotation=35, ha="right", fontsize=8)
  ax.set_yticks(range(len(ROWS)), [r.title for r in ROWS], fontsize=7)
  fig.colorbar(image, ax=ax, label="regret: best fixed τ − candidate (metric points)")
  ax.set_title("Regret against each row's best fixed τ (* beyond seed noise)")
  fig.tight_layout()
  fig.savefig(file, format="png", dpi=110, metadata={"Software": None})
  plt.close(fig)


def csv_text(result: Mapping) -> str:
  buffer = io.StringIO()
  rows = csv_rows(result)
  buffer.write(",".join(CSV_COLUMNS) + "\n")
  for row in rows:
    buffer.write(",".join(_csv_value(row[c]) for c in CSV_COLUMNS) + "\n")
  return buffer.getvalue()


def _csv_value(value) -> str:
  if isinstance(value, float):
    return repr(value) if math.isfinite(value) else "nan"
  return str(value)


def write(results: str = RESULTS) -> None:
  result = study(results)
  with open(os.path.join(results, NAME + ".md"), "w") as f:
    f.write(markdown(result))
  with open(os.path.join(results, NAME + ".csv"), "w") as f:
    f.write(csv_text(result))
  tables.atomic_figure(lambda file: draw(result, file), os.path.join(results, NAME + ".png"))


def differs(results: str = RESULTS) -> list[str]:
  """The outputs (`regret.md`, `regret.csv`) that differ from what the CSVs give."""
  result = study(results)
  out = []
  for suffix, text in ((".md", markdown(result)), (".csv", csv_text(result))):
    path = os.path.join(results, NAME + suffix)
    if not os.path.exists(path) or open(path).read() != text:
      out.append(NAME + suffix)
  return out


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="compare, do not write")
  args = parser.parse_args(argv)
  if args.check:
    stale = differs()
    for name in stale:
      print(f"{name} differs from what the CSVs give (python -m experiments.regret)")
    sys.exit(1 if stale else 0)
  write()
  print(f"wrote {os.path.join(RESULTS, NAME)}.md, .csv, .png")


if __name__ == "__main__":
  main()
