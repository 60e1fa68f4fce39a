"""Round 3's outputs: its section of `results/regret.md` (the stages, the summaries, every
cell, each row's grid and picks) and `regret_selection.csv` (one line per cell and stage), from
`experiments.regret.selection` of the committed round-3 CSVs; written by
`python -m experiments.regret` once a round-3 table is committed.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence

from experiments.regret.runs import RESULTS, fixed_tau
from experiments.regret.selection import (
  ALPHA,
  EDGE_SHARE,
  GRACE_SCREENING_SEEDS,
  SELECTION_ROWS,
  SELECTORS,
  STOP,
  Selection,
  SelectionRow,
  selection,
  within_noise,
)

CSV_NAME = "regret_selection.csv"
CSV_COLUMNS = ("row", "selector", "stage", "reference", "seeds", "regret", "sem", "p_value",
               "seeds_won", "at_smallest", "at_largest")
_GOALS = (1.0, 3.0)


def committed(results: str = RESULTS, rows: Sequence[SelectionRow] = SELECTION_ROWS) -> bool:
  """Whether any round-3 table is committed under `results` (before then nothing is written)."""
  return any(os.path.exists(os.path.join(results, r.table + ".csv")) for r in rows)


def _fmt(value: float) -> str:
  return "-" if not math.isfinite(value) else f"{value:+.2f}"


def _share(value: float) -> str:
  return "-" if not math.isfinite(value) else f"{100 * value:.0f}%"


def _summary(by_selector: Sequence[dict]) -> list[str]:
  lines = ["| selector | rows run | worst regret (row) | mean regret | rows within noise | "
           "picks at the smallest τ | at the largest τ | measures τ |",
           "|---|---|---|---|---|---|---|---|"]
  for s in by_selector:
    measures = f"yes ({s['measures_tau']} τ)" if s["measures_tau"] else ""
    lines.append(f"| `{s['selector']}` | {s['rows']}/{s['of_rows']} | {_fmt(s['worst'])} "
                 f"({s['worst_row'] or '-'}) | {_fmt(s['mean'])} | {s['within_noise']}/{s['rows']} "
                 f"| {_share(s['at_smallest'])} | {_share(s['at_largest'])} | {measures} |")
  return lines


def _goal_lines(by_selector: Sequence[dict]) -> list[str]:
  """Which label-free selectors reach each goal on every row they apply to (the labelled
  baseline and the edge rules are not candidates)."""
  candidates = {s.name for s in SELECTORS if not s.labelled and not s.reference}
  out = []
  for bound in _GOALS:
    reached = [f"`{s['selector']}`" for s in by_selector if s["selector"] in candidates
               and s["rows"] == s["of_rows"] and s["rows"] and s["worst"] <= bound]
    out.append(f"A label-free selector with a worst regret ≤ {bound:g} on every row: "
               f"{', '.join(reached) or 'none'}.")
  return out


def _stages(result: Selection) -> list[str]:
  going = [s.name for s in SELECTORS if result.verdict[s.name] == "goes on"]
  pending = [s.name for s in SELECTORS if result.verdict[s.name].startswith("pending")]
  edge = f"{100 * EDGE_SHARE:g}%"
  grace = ("pending: a selector's screening is not complete" if pending and not going else
           "to run: " + ", ".join(f"`{n}`" for n in going) + " went on" if going else
           "not run: every selector stopped")
  lines = ["### Stages", "",
           f"A selector more than {STOP:g} units behind the best fixed τ on a screening row stops "
           f"there; then GRACE at seeds 0-{GRACE_SCREENING_SEEDS - 1}, with the same rule. "
           f"GRACE's seeds {GRACE_SCREENING_SEEDS}-19: {grace}. A selector whose picks sit on "
           f"one edge of the grids for {edge} of its row-seeds measures τ.", "",
           "| selector | verdict |", "|---|---|"]
  lines += [f"| `{s.name}` | {result.verdict[s.name]} |" for s in SELECTORS]
  return lines + [""]


def _matrix(result: Selection) -> list[str]:
  names = [s.name for s in SELECTORS]
  lines = ["### Every row", "",
           "Mean regret over the row's seeds (s.e.); `*` beyond seed noise (p ≤ "
           f"{ALPHA}, behind); `-` not run or not applicable.", "",
           "| row | best fixed τ | " + " | ".join(f"`{n}`" for n in names) + " |",
           "|---|---|" + "---|" * len(names)]
  by = {(c["row"], c["selector"]): c for c in result.full}
  for row in result.rows:
    grid = result.grids.get(row.key)
    reference = grid.reference(row.row.seeds) if grid else None
    cells = []
    for name in names:
      c = by.get((row.key, name))
      cells.append("-" if c is None else f"{_fmt(c['regret'])} ({c['sem']:.2f})"
                   + ("" if within_noise(c) else "*"))
    lines.append(f"| {row.row.title} | {reference or 'not yet run'} | " + " | ".join(cells) + " |")
  return lines + [""]


def _per_row(result: Selection) -> list[str]:
  lines = ["### Per row: grid, picks, GRACE's first seeds", ""]
  for row in result.rows:
    grid = result.grids.get(row.key)
    if grid is None:
      lines += [f"#### {row.row.title}", "", f"`{row.table}.csv` not yet committed.", ""]
      continue
    metric = grid.values.get(row.row.metric, {})
    means = ", ".join(f"{spec} {100 * sum(metric[spec].values()) / len(metric[spec]):.2f}"
                      for spec in sorted(metric, key=fixed_tau))
    lines += [f"#### {row.row.title}", "",
              f"`{row.table}.csv`, `{row.row.loss('<τ>')}`: mean {row.row.metric} × 100 over the "
              f"runs there: {means or 'none'}.", "",
              "| selector | stage | seeds | regret (s.e.) | paired p | seeds won | picks |",
              "|---|---|---|---|---|---|---|"]
    cells = [("full", c) for c in result.full if c["row"] == row.key]
    cells += [(f"seeds 0-{GRACE_SCREENING_SEEDS - 1}", c) for c in result.grace_5
              if c["row"] == row.key]
    for stage, c in cells:
      picks = ", ".join(f"{spec} {count:g}" for spec, count in
                        sorted(c["picks"].items(), key=lambda kv: fixed_tau(kv[0])))
      p = "-" if not math.isfinite(c["p_value"]) else f"{c['p_value']:.2g}"
      lines.append(f"| `{c['selector']}` | {stage} | {c['seeds']} | {_fmt(c['regret'])} "
                   f"({c['sem']:.2f}) | {p} | {c['seeds_won']}/{c['seeds']} | {picks} |")
    lines.append("")
  return lines


def markdown(result: Selection) -> str:
  """Round 3's section of `regret.md`."""
  lines = [
      "## Round 3: τ chosen without labels, against the best fixed τ", "",
      "From the committed round-3 per-seed CSVs (`regret3_*.csv`; the selectors, rows, stages "
      "and rules are pre-registered in `docs/regret.md`, \"Round 3\"); every cell is in "
      f"`{CSV_NAME}`.", "",
      "Per seed, each selector picks a τ of the row's grid from its runs' scores (a tie counts as "
      "the mean of the tied τ's); regret = the best fixed τ's metric − the picked τ's, in units "
      "of one metric point; within noise: regret ≤ 0 or paired t-test p > "
      f"{ALPHA}. `smallest τ` and `largest τ` read nothing: a selector whose picks sit on them "
      "measures τ.", "",
  ]
  lines += _stages(result)
  for key, title in (("all", "every row"), ("label_free", "the label-free rows")):
    lines += [f"### Over {title}", "", *_summary(result.summaries[key]), "",
              *_goal_lines(result.summaries[key]), ""]
  return "\n".join(lines + _matrix(result) + _per_row(result))


def in_short(result: Selection) -> str:
  """Round 3 in a few sentences for the README and `docs/regret.md`'s outcome: how many
  screening rows ran, how many label-free selectors stopped where, and the closest of them over
  every row and over the label-free rows; "" before any round-3 table is committed."""
  if not result.grids:
    return ""
  screening = [r for r in result.rows if r.screening]
  run = sum(r.key in result.grids for r in screening)
  candidates = [s for s in SELECTORS if not s.labelled and not s.reference]
  stopped = [s for s in candidates if result.verdict[s.name].startswith("stops")]
  going = [s for s in candidates if result.verdict[s.name] == "goes on"]

  def closest(key: str) -> str:
    mine = [c for c in result.summaries[key] if c["selector"] in {s.name for s in candidates}
            and c["rows"]]
    best = min(mine, key=lambda c: c["worst"])
    return (f"`{best['selector']}` (worst {_fmt(best['worst'])} on {best['worst_row']}, "
            f"within noise on {best['within_noise']} of the {best['rows']} rows run)")

  grace = ("GRACE's stages do not run: no selector went on" if len(stopped) == len(candidates)
           else "GRACE's stages: " + (", ".join(f"`{s.name}`" for s in going) + " went on"
                                      if going else "after the screening"))
  reached = [line for line in _goal_lines(result.summaries["all"])]
  return (f"Round 3 (a τ picked from a trained grid by a score read without labels; "
          f"{run} of its {len(screening)} screening rows run): {len(stopped)} of the "
          f"{len(candidates)} label-free selectors stopped at screening, each more than {STOP:g} "
          f"points behind the best fixed τ on some row; {grace}. The closest over the rows run: "
          f"{closest('all')}; over the label-free rows alone: {closest('label_free')}. "
          + " ".join(reached) + "\n")


def csv_text(result: Selection) -> str:
  buffer = io.StringIO()
  buffer.write(",".join(CSV_COLUMNS) + "\n")
  stages = [("full", c) for c in result.full] + [
      (f"grace seeds 0-{GRACE_SCREENING_SEEDS - 1}", c) for c in result.grace_5]
  for stage, c in stages:
    values = {**c, "stage": stage}
    buffer.write(",".join(repr(v) if isinstance(v, float) else str(v)
                          for v in (values[k] for k in CSV_COLUMNS)) + "\n")
  return buffer.getvalue()


def outputs(results: str = RESULTS, rows: Sequence[SelectionRow] = SELECTION_ROWS
            ) -> tuple[str, str | None]:
  """`(section of regret.md, text of CSV_NAME)`; `("", None)` before any round-3 table is
  committed."""
  if not committed(results, rows):
    return "", None
  result = selection(results, rows)
  return "\n" + markdown(result), csv_text(result)
