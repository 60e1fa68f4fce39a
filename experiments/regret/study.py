r"""The regret study of `docs/regret.md`: each candidate default of both rounds against every
benchmark's best fixed τ, from the committed per-seed CSVs.

A candidate's **regret** on a row (`experiments.regret.rows`) is the row's best fixed τ minus
the candidate, paired by seed (`experiments.regret.runs`), in units of one metric point (0.01 of
an accuracy, F1, ROC-AUC or top-100 fraction; 0.005 of NDCG@10).

Per row and candidate: mean regret, its standard error, the two-sided paired t-test p and the
seeds where the candidate is at least as good. Per candidate and set of rows (`rows.row_sets`):
the **worst-case regret** (the largest mean regret over the rows it has run), the mean regret and
the **rows within noise** (regret ≤ 0 or p > 0.05), and whether it reaches the goal (a worst case
≤ 1, and ≤ 3). Each round's screening rule runs on its own screening rows (round 1's on the
tables of round 1 alone, so its verdicts stay those it made); the decision rule runs over the
set each round names. Rows or candidates not yet run are named, not guessed.

The outputs (`regret.md`, `.csv`, the figures) are written by `experiments.regret.report`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from experiments.regret.rows import (
  CANDIDATES,
  ROUNDS,
  ROWS,
  Round,
  Row,
  RowSet,
  candidates_of,
  row_sets,
)
from experiments.regret.runs import RESULTS, RowRuns

#: The seeds' paired t-test level for "within noise".
ALPHA = 0.05
#: A worst-case regret difference under this many units is a tie (the decision rule).
TIE = 0.5
#: The worst cases the summary reports reaching: the goal (1 unit), and 3.
GOALS = (1.0, 3.0)


def within_noise(cell: Mapping) -> bool:
  """The candidate is ahead of (or level with) the reference, or the paired p > ALPHA."""
  return cell["regret"] <= 0 or not cell["p_value"] <= ALPHA


def cells(all_runs: Sequence[RowRuns], candidates: Sequence[str], *,
          screening: bool = False) -> list[dict]:
  """Every (row, candidate) cell that has run: over the row's full seeds, or with `screening`
  over the screening rows' screening seeds."""
  out = []
  for runs in all_runs:
    if screening and not runs.row.screening:
      continue
    for candidate in candidates:
      cell = runs.pair(candidate, seeds=runs.row.screening_seeds if screening else None)
      if cell is not None and (screening or cell["seeds"] == runs.row.seeds):
        out.append(cell)
  return out


def summary(cell_list: Sequence[dict], rows: Sequence[str], candidates: Sequence[str]
            ) -> list[dict]:
  """Per candidate, over the cells of `rows`: rows run, worst-case regret (and its row), mean
  regret, rows within noise."""
  out = []
  for candidate in candidates:
    mine = [c for c in cell_list if c["candidate"] == candidate and c["row"] in rows]
    if not mine:
      out.append({"candidate": candidate, "rows": 0, "of_rows": len(rows), "worst": math.nan,
                  "worst_row": "", "mean": math.nan, "within_noise": 0})
      continue
    worst = max(mine, key=lambda c: c["regret"])
    out.append({"candidate": candidate, "rows": len(mine), "of_rows": len(rows),
                "worst": worst["regret"], "worst_row": worst["row"],
                "mean": float(np.mean([c["regret"] for c in mine])),
                "within_noise": sum(within_noise(c) for c in mine)})
  return out


def goes_on(screen: Sequence[dict], new_mappings: Sequence[str], screening_rows: int
            ) -> dict[str, str]:
  """The screening rule of `docs/regret.md` for each new mapping: it goes on to every row if its
  worst-case regret over the screening rows is no larger than free's, or if it is within noise
  on more screening rows than free.

  Decided once both have every screening row, or before where no missing row can change it: a
  row can only raise a worst case and add a row within noise, so the rule holds whatever is
  missing if the mapping is already within noise on more rows than free can reach (or has every
  row and a worst case no larger than free's so far), and fails whatever is missing if it cannot
  reach free's count and free has every row with a smaller worst case. Such a verdict says
  "settled" and how many rows each had.
  """
  by = {s["candidate"]: s for s in screen}
  free = by["free"]
  verdict = {}
  for candidate in new_mappings:
    mine = by[candidate]
    missing, free_missing = screening_rows - mine["rows"], screening_rows - free["rows"]
    counts = f"{mine['rows']}/{screening_rows} screening rows, free {free['rows']}/{screening_rows}"
    if not missing and not free_missing:
      verdict[candidate] = ("goes on" if mine["worst"] <= free["worst"]
                            or mine["within_noise"] > free["within_noise"] else "stops")
    elif (mine["within_noise"] > free["within_noise"] + free_missing
          or (not missing and mine["worst"] <= free["worst"])):
      verdict[candidate] = f"goes on (settled with {counts})"
    elif (mine["within_noise"] + missing <= free["within_noise"] and not free_missing
          and mine["rows"] and mine["worst"] > free["worst"]):
      verdict[candidate] = f"stops (settled with {counts})"
    else:
      verdict[candidate] = f"pending ({counts})"
  return verdict


def settled(full: Sequence[dict], finalists: Sequence[str]) -> str | None:
  """The candidate the decision rule picks whatever the missing cells hold, or None.

  A row can only raise a candidate's worst-case regret, so a candidate's worst case over the
  rows it has run is a lower bound of its worst case over every row. A candidate that has every
  row wins outright if each other finalist's bound is at least TIE above its worst case: then
  no missing cell can make a tie or reverse the order.
  """
  by = {s["candidate"]: s for s in full}
  for candidate in finalists:
    mine = by[candidate]
    if mine["rows"] < mine["of_rows"]:
      continue
    if all(by[other]["rows"] > 0 and by[other]["worst"] - mine["worst"] >= TIE
           for other in finalists if other != candidate):
      return candidate
  return None


def pick(full: Sequence[dict], finalists: Sequence[str]) -> str:
  """The decision rule over finalists that have every row: the smallest worst-case regret; a
  difference under TIE is a tie, broken by more rows within noise, then the smaller mean."""
  by = {s["candidate"]: s for s in full}
  ranked = sorted((by[c] for c in finalists), key=lambda s: s["worst"])
  tied = [s for s in ranked if s["worst"] - ranked[0]["worst"] < TIE]
  tied.sort(key=lambda s: (-s["within_noise"], s["mean"]))
  return tied[0]["candidate"]


def decision(full: Sequence[dict], finalists: Sequence[str]) -> str:
  """The decision rule of `docs/regret.md` over the candidates that have every row (`pick`);
  before then, the winner if no missing cell can change it (`settled`), else what is still
  missing."""
  by = {s["candidate"]: s for s in full}
  missing = [c for c in finalists if by[c]["rows"] < by[c]["of_rows"]]
  if missing:
    still = ", ".join(f"`{c}` has {by[c]['rows']}/{by[c]['of_rows']} rows" for c in missing)
    winner = settled(full, finalists)
    if winner is not None:
      return (f"`{winner}`, settled before every cell has run: each other candidate's worst "
              f"case over the rows it has run is already at least {TIE} above its "
              f"{by[winner]['worst']:+.2f} ({still})")
    return "pending: " + still
  return f"`{pick(full, finalists)}`"


def goal(full: Sequence[dict], bound: float) -> str:
  """Which candidates reach a worst-case regret ≤ `bound` over every row of a summary; those
  that have not run every row and are not yet past `bound` are still open."""
  reached = [s["candidate"] for s in full if s["rows"] == s["of_rows"] and s["worst"] <= bound]
  still = [s for s in full if s["rows"] < s["of_rows"] and not s["worst"] > bound]
  text = ", ".join(f"`{c}`" for c in reached) or "none"
  if still:
    text += "; still open: " + ", ".join(
        f"`{s['candidate']}` ({s['rows']}/{s['of_rows']} rows"
        + (f", {s['worst']:+.2f} so far)" if s["rows"] else ")") for s in still)
  return text


@dataclasses.dataclass(frozen=True)
class Screening:
  """One round's screening: its rows at their screening seeds, every candidate of the rounds
  up to it summarised there, and the verdict of the rule for its new mappings."""
  round: Round
  rows: tuple[str, ...]
  cells: list[dict]
  summary: list[dict]
  verdict: dict[str, str]


def screen(step: Round, all_runs: Sequence[RowRuns]) -> Screening:
  """Round `step`'s screening over the screening rows of the rounds up to it."""
  runs = [r for r in all_runs if r.row.screening and r.row.round <= step.number]
  keys = tuple(r.row.key for r in runs)
  screen_cells = cells(runs, candidates_of(step.number), screening=True)
  screen_summary = summary(screen_cells, keys, candidates_of(step.number))
  return Screening(step, keys, screen_cells, screen_summary,
                   goes_on(screen_summary, step.new_mappings, len(keys)))


@dataclasses.dataclass(frozen=True)
class SetSummary:
  """A summary over a set of rows, with its decision line where a round's rule decides there."""
  rows: RowSet
  summary: list[dict]
  decision: str = ""


def finalists(decides: int, screenings: Sequence[Screening]) -> list[str] | None:
  """The candidates round `decides`'s decision rule chooses among: those of the rounds up to
  it less those their screening stopped; None while a screening is pending."""
  verdicts = {c: v for s in screenings if s.round.number <= decides
              for c, v in s.verdict.items()}
  if any(v.startswith("pending") for v in verdicts.values()):
    return None
  return [c for c in candidates_of(decides) if verdicts.get(c, "goes on").startswith("goes on")]


def decide(over: RowSet, by_candidate: Sequence[dict], screenings: Sequence[Screening]) -> str:
  """Round `over.decides`'s decision rule over the set (`finalists`, `decision`); pending
  while a screening is."""
  chosen = finalists(over.decides, screenings)
  if chosen is None:
    pending = [c for s in screenings if s.round.number <= over.decides
               for c, v in s.verdict.items() if v.startswith("pending")]
    return "pending: screening of " + ", ".join(f"`{c}`" for c in pending)
  return decision(by_candidate, chosen)


@dataclasses.dataclass(frozen=True)
class Study:
  """Everything the outputs show: the rows' runs, every full cell, each round's screening and
  the summaries over each set of rows."""
  rows: tuple[Row, ...]
  runs: list[RowRuns]
  full: list[dict]
  screenings: list[Screening]
  sets: list[SetSummary]


def study(results: str = RESULTS, rows: Sequence[Row] = ROWS) -> Study:
  """The study from the committed CSVs under `results`."""
  # Round 1 screened on the tables of round 1: later grids and reruns leave its verdicts alone.
  as_of = {step.number: [RowRuns.read(row, results, as_of=step.number) for row in rows
                         if row.round <= step.number] for step in ROUNDS[:-1]}
  return assemble(rows, [RowRuns.read(row, results) for row in rows], as_of)


def assemble(rows: Sequence[Row], all_runs: Sequence[RowRuns],
             as_of: Mapping[int, Sequence[RowRuns]]) -> Study:
  """The study of the rows' runs: each round screened on its runs `as_of` its own round (every
  run for the last), every full cell, and each set's summary and decision."""
  screenings = [screen(step, as_of.get(step.number, all_runs)) for step in ROUNDS]
  full = cells(all_runs, CANDIDATES)
  sets = []
  for over in row_sets(rows):
    by_candidate = summary(full, over.rows, CANDIDATES)
    decided = decide(over, by_candidate, screenings) if over.decides else ""
    sets.append(SetSummary(over, by_candidate, decided))
  return Study(tuple(rows), list(all_runs), full, screenings, sets)
