"""Every change made to a round's protocol after that round's first committed result, dated from
the repository's history (`git log -p -- docs/regret.md experiments/regret`), with whether it
moved a number: said where it could not, computed from the committed CSVs where it could.

Round 1's first result: `b010da5`, 2026-11-25; round 2's: `6c55786`, 2026-11-27 (its protocol
section, committed in `08d4f51` before that result, has not been edited since).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from experiments.regret.fragility import decided
from experiments.regret.rows import CANDIDATES, ROUND_1_CANDIDATES
from experiments.regret.runs import RESULTS, RowRuns
from experiments.regret.study import Study, assemble, cells, pick, summary, within_noise


@dataclasses.dataclass(frozen=True)
class Change:
  """One change: its date and commits, the round whose protocol it touched, what it changed,
  and whether it moved a number (a sentence, or `moved(result, results)` computing it)."""
  date: str
  commits: str
  round: int
  what: str
  moved: str | Callable[[Study, str], str]

  def line(self, result: Study, results: str = RESULTS) -> str:
    """The change as one markdown bullet.

    Examples:
      >>> from experiments.regret.changes import Change
      >>> Change("2026-11-27", "41fc51f", 1, "a word", "No number moved.").line(None)
      '- **2026-11-27** (`41fc51f`, round 1): a word. No number moved.'
    """
    moved = self.moved if isinstance(self.moved, str) else self.moved(result, results)
    return f"- **{self.date}** (`{self.commits}`, round {self.round}): {self.what}. {moved}"


#: The pick each deciding set's rule was announced with (round 1's on 2026-11-26, `6940048`;
#: round 2's on 2026-11-28, `4ae4a3d`), before every cell had run.
ANNOUNCED = {"round_1": "learnable_free=100", "advised": "dynamic=0.1:0.2"}


def _titles(result: Study) -> dict[str, str]:
  return {s.rows.key: s.rows.short for s in result.sets}


def _decisions(result: Study) -> dict[str, tuple[str, float, list[dict]]]:
  """`{set key: (pick, its worst case, summary)}` of each set a round decides over, once every
  finalist has every row there."""
  out = {}
  for over in result.sets:
    chosen = decided(result, over) if over.rows.decides else None
    if chosen:
      winner = pick(over.summary, chosen)
      worst = next(s["worst"] for s in over.summary if s["candidate"] == winner)
      out[over.rows.key] = (winner, worst, over.summary)
  return out


def _compare(before: dict, after: dict, titles: dict[str, str]) -> str:
  """Each deciding set's pick before and after, and the largest move of a worst case."""
  parts, largest = [], 0.0
  for key, (winner, worst, by) in before.items():
    if key not in after:
      continue
    new_winner, new_worst, new_by = after[key]
    verb = "stays" if new_winner == winner else "becomes"
    parts.append(f"over {titles[key]} the pick {verb} `{new_winner}` ({worst:.2f} → "
                 f"{new_worst:.2f} at worst)")
    worst_by = {s["candidate"]: s["worst"] for s in by}
    largest = max([largest] + [abs(s["worst"] - worst_by[s["candidate"]]) for s in new_by
                               if s["rows"] and s["candidate"] in worst_by])
  return "; ".join(parts) + ("; no candidate's worst case over either set moves by more than "
                            f"{largest:.2f}")


def tau_0_2_as_reference(result: Study, results: str = RESULTS) -> str:
  """What counting the candidate `tau=0.2`'s runs as a fixed τ of a row's grid would move: the
  rows where it is ahead of the reference, and each deciding set's pick with them."""
  ahead = {c["row"]: c for c in result.full
           if c["candidate"] == "tau=0.2" and c["regret"] < 0 and c["seeds"] == c["of_seeds"]}
  if not ahead:
    return "`tau=0.2` is behind the reference on every row: no number moved."

  def moved(runs: RowRuns) -> RowRuns:
    cell = ahead.get(runs.row.key)
    if cell is None or "tau=0.2" not in runs.by_table.get(cell["table"], {}):
      return runs
    return dataclasses.replace(runs, reference="tau=0.2", reference_table=cell["table"])

  as_of = {1: [moved(RowRuns.read(row, results, as_of=1)) for row in result.rows
               if row.round <= 1]}
  other = assemble(result.rows, [moved(r) for r in result.runs], as_of)
  rows = ", ".join(f"{key} by {-c['regret']:.2f}{'' if within_noise(c) else ', beyond noise'}"
                   for key, c in ahead.items())
  own = [r for r in result.runs if "tau=0.2" in r.grid]
  best = [r.row.key for r in own if r.reference == "tau=0.2"]
  return (f"Where `tau=0.2` is a τ of the row's own grid ({len(own)} rows) it is "
          f"{'the best on ' + ', '.join(best) if best else 'never the best'}. As a candidate "
          f"it is ahead of the reference on {len(ahead)} rows ({rows}); with its runs "
          f"counted there, {_compare(_decisions(result), _decisions(other), _titles(result))}.")


def grids_extended(result: Study, results: str = RESULTS) -> str:
  """What round 2's extension of the retrieval grids moved on round 1's rows: the references
  that moved, and round 1's summary and pick against those of its own tables."""
  first = [RowRuns.read(row, results, as_of=1) for row in result.rows if row.round == 1]
  now = {r.row.key: r for r in result.runs}
  moved = [r for r in first if r.reference != now[r.row.key].reference]
  then_cells = cells(first, ROUND_1_CANDIDATES)
  before = {(c["row"], c["candidate"]): c["regret"] for c in then_cells}
  shifts = []
  for r in moved:
    changed = [abs(c["regret"] - before[(c["row"], c["candidate"])]) for c in result.full
               if c["row"] == r.row.key and (c["row"], c["candidate"]) in before]
    shifts.append(f"{r.row.key} from `{r.reference}` to `{now[r.row.key].reference}`"
                  + (f" (its cells moved by up to {max(changed):.2f})" if changed else ""))
  over = next(s for s in result.sets if s.rows.key == "round_1")
  then = summary(then_cells, over.rows.rows, CANDIDATES)
  worst = {s["candidate"]: s["worst"] for s in then if s["rows"]}
  mean = {s["candidate"]: s["mean"] for s in then if s["rows"]}
  common = [s for s in over.summary if s["candidate"] in worst]
  text = f"It moved the reference of {', '.join(shifts) or 'no row'}."
  now_pick = _decisions(result).get("round_1")
  chosen = decided(result, dataclasses.replace(over, summary=then))
  if now_pick is None or chosen is None or not common:
    return text
  return (text + f" Over round 1's rows the pick was `{pick(then, chosen)}` on round 1's "
          f"tables and is `{now_pick[0]}` now; worst cases moved by at most "
          f"{max(abs(s['worst'] - worst[s['candidate']]) for s in common):.2f} and means by at "
          f"most {max(abs(s['mean'] - mean[s['candidate']]) for s in common):.2f}.")


def accuracy_free_screening(result: Study, results: str = RESULTS) -> str:
  """`accuracy_free`'s screening rows run and its verdict."""
  last = result.screenings[-1]
  mine = next((s for s in last.summary if s["candidate"] == "accuracy_free"), None)
  if mine is None or "accuracy_free" not in last.verdict:
    return "`accuracy_free` has no screening verdict."
  return (f"`accuracy_free` ran {mine['rows']} of the {len(last.rows)} screening rows; its "
          f"verdict: {last.verdict['accuracy_free']}. No cell of a candidate that went on "
          "moved; its own summaries are over the rows it ran (lower bounds).")


def decisions_now(result: Study, results: str = RESULTS) -> str:
  """Each round's pick with every cell run."""
  titles, parts = _titles(result), []
  if not _decisions(result):
    return "No round has every cell of its finalists run yet."
  for key, (winner, _, _) in _decisions(result).items():
    said = ANNOUNCED.get(key)
    parts.append(f"`{winner}` over {titles[key]}, "
                 + ("the one announced" if winner == said else f"not `{said}`, announced"))
  return "With every cell run the picks are " + "; ".join(parts) + "."


CHANGES: Sequence[Change] = (
    Change("2026-11-26", "3cf9444", 1,
           "The decision named before every cell has run when no missing cell can change it "
           "(a row only raises a worst case), a reading the protocol did not state; round 1's "
           "pick was announced so on 2026-11-26 (`6940048`) and round 2's on 2026-11-28 "
           "(`4ae4a3d`)", decisions_now),
    Change("2026-11-26", "af70957", 1,
           "The page's sentence \"nothing above the line changes after the first result\" (and "
           "\"pre-registration\" in its title) replaced by \"were fixed before any of its runs\"; "
           "the edits below were made in the same commit", "No number moved by itself."),
    Change("2026-11-26", "af70957", 1,
           "The reference rule gained its sentence \"`tau=0.2`, a candidate absent from most "
           "grids, is never a row's reference, even where it scores higher\"; the code had read "
           "references from the grid tables alone since the first result (`b010da5`)",
           tau_0_2_as_reference),
    Change("2026-11-26", "af70957", 1,
           "\"before any new map is run there\" dropped from the feature towers' CLIP grid; that "
           "grid (`30c09b2`, 2026-11-25 19:58) was committed before the new mappings' runs on "
           "the row (`a98668e`, 20:36)", "No number moved."),
    Change("2026-11-26", "af70957", 1,
           "Reworded: `free_n`'s cosine range `C ∈ (0.4, 0.7)` attributed to Example 3.2 and "
           "Figures 2-3 (it read \"observes in training, Figure 3\"), \"(within seed spread, "
           "measured)\" dropped, \"the table says which rows pair against committed runs\" "
           "became \"names every cell that pairs across sweeps\", \"fixed now\" dropped from "
           "the screening rule", "`s(N)` and the rules are unchanged: no number moved."),
    Change("2026-11-27", "e945572, 41fc51f, cc210e3", 1,
           "Wording (\"map\" to \"mapping\") and the committed CSVs' column named `spec`, as "
           "the tables renamed it (`304dcc1`)", "No number moved."),
    Change("2026-11-27", "08d4f51, 12cc697", 1,
           "Round 2's protocol extends the retrieval rows' grids beyond an edge, round 1's four "
           "uncorrected rows included; the extension ran in `529f521` and `12cc697`",
           grids_extended),
    Change("2026-11-27", "08d4f51", 2,
           "Round 2's rows and its advised set (retrieval with the logQ correction) were "
           "fixed after every round-1 result and after the committed `+logq` runs of "
           "`retrieval_ml100k.csv` and `retrieval_ml100k_features.csv` (2026-11-25), which "
           "showed the correction's gain before the set was chosen: a disclosure, not an edit",
           "No number moved; the decision over the advised rows rests on that choice of rows."),
    Change("2026-11-28", "e68a55b", 2,
           "A screening verdict named before every screening row has run when no missing row "
           "can change it, a reading the protocol did not state", accuracy_free_screening),
)


def lines(result: Study, results: str = RESULTS) -> list[str]:
  """Every change, one bullet each, in date order."""
  return [change.line(result, results) for change in CHANGES]


def markdown(result: Study, results: str = RESULTS) -> str:
  """Every change, one bullet each, in date order."""
  return "\n".join(lines(result, results)) + "\n"
