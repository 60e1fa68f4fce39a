r"""The regret study's outputs: `results/regret.md` (summaries, how firmly the decisions stand,
the changes to the protocols, grids, screenings, every row, per row detail), `regret.csv` (one
line per cell and stage), `regret.png` (rows × candidates coloured by regret) and
`regret_scales.png` (each candidate's scale over training), all from `experiments.regret.study`
of the committed CSVs.

Run: python -m experiments.regret            (writes results/regret.md, .csv and the figures)
     python -m experiments.regret --check    (exit 1 when regret.md or regret.csv differ)
`python -m experiments.regenerate` runs it after every other table.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
from collections.abc import Mapping, Sequence

from experiments.framework import blocks, tables
from experiments.regret import changes, figures, fragility, scales, selection_report
from experiments.regret.rows import CANDIDATES, ROWS, Row
from experiments.regret.runs import RESULTS, RowRuns, fixed_tau, next_tau
from experiments.regret.study import ALPHA, GOALS, Study, goal, study, within_noise

NAME = "regret"
SCALES = "regret_scales"
COMMAND = "python -m experiments.regret"

CSV_COLUMNS = ("row", "candidate", "reference", "seeds", "of_seeds", "regret", "sem",
               "p_value", "seeds_won", "stage", "pairs", "table", "reference_table")


def _fmt(value: float, digits: int = 2) -> str:
  return "-" if not math.isfinite(value) else f"{value:+.{digits}f}"


def _p(value: float) -> str:
  return "-" if not math.isfinite(value) else f"{value:.2g}"


def csv_rows(result: Study) -> list[dict]:
  """Every full cell (stage `full`) and every screening cell (`screening round N`)."""
  return ([dict(c, stage="full") for c in result.full]
          + [dict(c, stage=f"screening round {s.round.number}")
             for s in result.screenings for c in s.cells])


def summary_table(by_candidate: Sequence[dict], candidates: Sequence[str] = CANDIDATES,
                  verdict: Mapping[str, str] | None = None) -> list[str]:
  """One line per candidate of `candidates`: rows run, worst case (its row), mean, rows within
  noise; with `verdict`, whether it goes on to every row (a screening)."""
  head = "| candidate | rows run | worst-case regret (row) | mean regret | rows within noise |"
  lines = [head + (" goes on to every row |" if verdict is not None else ""),
           "|---|---|---|---|---|" + ("---|" if verdict is not None else "")]
  for s in by_candidate:
    if s["candidate"] not in candidates:
      continue
    line = (f"| `{s['candidate']}` | {s['rows']}/{s['of_rows']} | "
            f"{_fmt(s['worst'])} ({s['worst_row'] or '-'}) | {_fmt(s['mean'])} | "
            f"{s['within_noise']}/{s['rows']} |")
    if verdict is not None:
      line += f" {verdict.get(s['candidate'], 'every row (not screened)')} |"
    lines.append(line)
  return lines


def _summaries(result: Study) -> list[str]:
  lines = ["## Summaries", "",
           "Per candidate over each set of rows (`docs/regret.md`, \"The summary\"); a worst case "
           "over fewer rows than the set's is a lower bound.", ""]
  for over in result.sets:
    lines += [f"### Over {over.rows.title}", "", *summary_table(over.summary), ""]
    if over.decision:
      rule = "Round 1's rule over its rows" if over.rows.decides == 1 else "The decision rule"
      lines += [f"{rule}, recommended default: {over.decision}.", ""]
    lines += [f"Worst case ≤ {bound:g}: {goal(over.summary, bound)}." for bound in GOALS] + [""]
  return lines


def where(runs: RowRuns) -> str:
  """Where the row's best τ sits in its grid, and what the protocol runs next."""
  edge = runs.edge()
  if edge == "none":
    return "grid not yet run (" + ", ".join(f"`{t}.csv`" for t in runs.row.grid) + ")"
  if edge in ("single", "inside"):
    return "a grid of one τ" if edge == "single" else "inside the grid"
  text = f"at the {edge} edge"
  if not runs.row.extension:
    return text + " (not extended: the protocol extends the retrieval rows' grids)"
  following = next_tau(fixed_tau(runs.reference), up=edge == "top")
  return (text + f": the protocol runs τ = {following:g} next ("
          + ", ".join(f"`{t}.csv`" for t in runs.row.extension) + ")")


def _grid(runs: RowRuns) -> str:
  return ", ".join(f"{spec} {100 * mean:.2f}" for spec, mean in
                   sorted(runs.grid.items(), key=lambda kv: fixed_tau(kv[0])))


def _grids(result: Study) -> list[str]:
  lines = ["## Grids", "",
           "Each row's fixed-τ grid (mean over its seeds, metric × 100) and where its best τ sits. "
           "The retrieval rows' grids are extended beyond an edge until the best τ has a run τ on "
           "each side; the new τ's are references only.", "",
           "| row | fixed-τ grid | best fixed τ | where |", "|---|---|---|---|"]
  for runs in result.runs:
    lines.append(f"| {runs.row.key} | {_grid(runs) or '-'} | {runs.reference or '-'} | "
                 f"{where(runs)} |")
  return lines + [""]


def _screenings(result: Study) -> list[str]:
  lines = ["## Screening", ""]
  by_key = {row.key: row for row in result.rows}
  earlier = {}
  for s in result.screenings:
    rows = ", ".join(f"{k} (seeds 0-{by_key[k].screening_seeds - 1})" for k in s.rows)
    lines += [f"### Round {s.round.number}", "", f"Screening rows: {rows}.", "",
              *summary_table(s.summary, verdict={**earlier, **s.verdict}), ""]
    earlier.update({c: f"{v} (round {s.round.number})" for c, v in s.verdict.items()})
  return lines


def matrix_table(result: Study) -> list[str]:
  """Every row × candidate: mean regret (s.e.), `*` beyond seed noise, `-` not run."""
  lines = ["| row | best fixed τ | " + " | ".join(f"`{c}`" for c in CANDIDATES) + " |",
           "|---|---|" + "---|" * len(CANDIDATES)]
  by_cell = {(c["row"], c["candidate"]): c for c in result.full}
  for runs in result.runs:
    ref = (f"{runs.reference} ({100 * runs.grid[runs.reference]:.2f})"
           if runs.reference else "grid not yet run")
    text = []
    for candidate in CANDIDATES:
      c = by_cell.get((runs.row.key, candidate))
      text.append("-" if c is None else f"{_fmt(c['regret'])} ({c['sem']:.2f})"
                  + ("" if within_noise(c) else "*"))
    lines.append(f"| {runs.row.title} | {ref} | " + " | ".join(text) + " |")
  return lines


def _matrix(result: Study) -> list[str]:
  return (["## Every row", "",
           "Mean regret (s.e.) over the row's seeds; `*` beyond seed noise (p ≤ 0.05, behind "
           "the reference); `-` not run at the row's seed count (not yet, or stopped at "
           "screening).", "", *matrix_table(result)]
          + ["", "![regret per row and candidate](regret.png)", ""])


def _scales(rows: Sequence[Row], found: Sequence[scales.ScaleTrace]) -> list[str]:
  lines = ["## What each scale did", "",
           "Mean over seeds, per row family, from the runs' `scale@<epoch>` (retrieval), "
           "`final_t` (a learnt scale, from its spec's start to `min(exp(t), cap)`) or "
           "`final_scale` (a scale solved from the batch) columns, or, where the sweep's run logs "
           "were traced (`python -m experiments.regret.traces`), the solved scale at every 5% of "
           "training from `<table>_scales.csv`; rows that read the same runs are drawn once.", ""]
  for family in figures.families(rows):
    mine = [t for t in found if t.row.family == family]
    by_row = {t.row.key: [u for u in mine if u.row.key == t.row.key] for t in mine}
    drawn = "; ".join(f"{key} ({', '.join(f'`{t.candidate}`' for t in ts)})"
                      for key, ts in by_row.items())
    lines.append(f"- {family}: {drawn or 'no scale recorded, not drawn'}.")
  return lines + ["", f"![each candidate's scale over training]({SCALES}.png)", ""]


def _per_row(result: Study) -> list[str]:
  lines = ["## Per row: seeds, p, seeds won, where the runs come from", ""]
  shown = {(c["row"], c["candidate"]): ("full", c) for c in result.full}
  # A candidate its screening stopped runs no further row (nor a screening row once settled).
  stopped = {c for s in result.screenings for c, v in s.verdict.items() if v.startswith("stops")}
  for s in reversed(result.screenings):
    for c in s.cells:
      shown.setdefault((c["row"], c["candidate"]), (f"screening round {s.round.number}", c))
  for runs in result.runs:
    row = runs.row
    lines += [f"### {row.title}", ""]
    if runs.reference is None:
      grid = ", ".join(f"`{t}.csv`" for t in row.grid)
      lines += [f"No reference yet: its fixed-τ grid ({grid}) is not all committed.", ""]
      continue
    lines += [f"Fixed-τ grid (mean over {row.seeds} seeds, metric × 100): {_grid(runs)}. "
              f"Reference: `{row.loss(runs.reference)}` from `{runs.reference_table}.csv`, "
              f"{where(runs)}."]
    for table, diff in runs.reruns().items():
      lines.append(f"Its rerun in `{table}.csv` reproduces it exactly on every seed." if diff == 0
                   else f"Its rerun in `{table}.csv` differs from it by at most {diff:.3g} units "
                   "per seed.")
    lines += ["", "| candidate | stage | seeds | regret (s.e.) | paired p | seeds won | runs |",
              "|---|---|---|---|---|---|---|"]
    for candidate in CANDIDATES:
      if (row.key, candidate) not in shown:
        why = "stopped at screening" if candidate in stopped else "not yet run"
        lines.append(f"| `{row.loss(candidate)}` | {why} | | | | | |")
        continue
      stage, c = shown[(row.key, candidate)]
      source = (f"`{c['table']}.csv`" if c["pairs"] == "same sweep" else
                f"`{c['table']}.csv` against `{c['reference_table']}.csv` (across sweeps)")
      lines.append(f"| `{row.loss(candidate)}` | {stage} | {c['seeds']}/{c['of_seeds']} | "
                   f"{_fmt(c['regret'])} ({c['sem']:.2f}) | {_p(c['p_value'])} | "
                   f"{c['seeds_won']}/{c['seeds']} | {source} |")
    lines.append("")
  return lines


def _fragility(result: Study, results: str) -> list[str]:
  return ["## How firmly the decisions stand", "",
          "Each round's decision against the next finalist's worst case and the tie threshold, "
          "and the decision rule applied again with each row of its set left out in turn (the "
          "same finalists; the screenings are not rerun).", "",
          blocks.wrap(fragility.markdown(result)),
          "## Changes to the protocols after their first result", "",
          "Dated from the repository's history; whether each moved a number is computed here "
          "from the same CSVs where it could be.", "",
          blocks.wrap(changes.markdown(result, results))]


def markdown(result: Study, found: Sequence[scales.ScaleTrace], results: str = RESULTS) -> str:
  lines = [
      "# Regret of each candidate default against the best fixed τ", "",
      f"Command: `{COMMAND}` (from the committed per-seed CSVs; the protocol, rows, seeds and",
      "rules of both rounds are pre-registered in `docs/regret.md`).", "",
      "Regret = best fixed τ − candidate, paired by seed, in units of one metric point (0.01 of",
      "F1, accuracy, ROC-AUC or top-100; 0.005 of NDCG@10): positive = the candidate is worse.",
      f"Within noise: regret ≤ 0 or paired t-test p > {ALPHA}.", "",
  ]
  lines += (_summaries(result) + _fragility(result, results) + _grids(result)
            + _screenings(result) + _matrix(result)
            + _scales(result.rows, found) + _per_row(result))
  return "\n".join(lines)


def csv_text(result: Study) -> str:
  buffer = io.StringIO()
  buffer.write(",".join(CSV_COLUMNS) + "\n")
  for row in csv_rows(result):
    buffer.write(",".join(_csv_value(row[c]) for c in CSV_COLUMNS) + "\n")
  return buffer.getvalue()


def _csv_value(value) -> str:
  if isinstance(value, float):
    return repr(value) if math.isfinite(value) else "nan"
  return str(value)


def _outputs(results: str, rows: Sequence[Row]) -> tuple[Study, list[scales.ScaleTrace], dict]:
  """The study, its scale traces and the text files: `{file name: text}`, with round 3's
  section of `regret.md` and its CSV once one of its tables is committed."""
  result = study(results, rows)
  found = scales.traces(rows, results)
  section, selected = selection_report.outputs(results)
  texts = {NAME + ".md": markdown(result, found, results) + section,
           NAME + ".csv": csv_text(result)}
  if selected is not None:
    texts[selection_report.CSV_NAME] = selected
  return result, found, texts


def write(results: str = RESULTS, rows: Sequence[Row] = ROWS) -> None:
  """Writes `regret.md`, `regret.csv`, `regret.png` and `regret_scales.png` under `results`,
  and round 3's `regret_selection.csv` (and its section of `regret.md`) once one of its tables
  is committed."""
  result, found, texts = _outputs(results, rows)
  for name, text in texts.items():
    with open(os.path.join(results, name), "w") as f:
      f.write(text)
  tables.atomic_figure(lambda file: figures.draw_regret(result, file),
                       os.path.join(results, NAME + ".png"))
  tables.atomic_figure(lambda file: figures.draw_scales(rows, found, file),
                       os.path.join(results, SCALES + ".png"))


def differs(results: str = RESULTS, rows: Sequence[Row] = ROWS) -> list[str]:
  """The outputs (`regret.md`, `regret.csv`, and round 3's) that differ from what the CSVs
  give."""
  _, _, texts = _outputs(results, rows)
  out = []
  for name, text in texts.items():
    path = os.path.join(results, name)
    if not os.path.exists(path) or open(path).read() != text:
      out.append(name)
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
  print(f"wrote {os.path.join(RESULTS, NAME)}.md, .csv, .png and {SCALES}.png")


if __name__ == "__main__":
  main()
