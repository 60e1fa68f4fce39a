"""How firmly each round's decision stands: its margin to the tie threshold, and the decision
rule applied again with each row of its set left out in turn.

The rule (`study.pick`) runs on the same finalists as the decision (the candidates of the
rounds up to it less those their screening stopped; the screenings are not rerun), over the
set's rows less one.
"""

from __future__ import annotations

import dataclasses

from experiments.regret.rows import CANDIDATES
from experiments.regret.study import TIE, SetSummary, Study, finalists, pick, summary


@dataclasses.dataclass(frozen=True)
class Margin:
  """A decision's winner and worst case, the finalist with the next smallest worst case and
  its worst case; `gap` = their difference, `above_tie` = gap - TIE (negative: the winner
  won a tie, by rows within noise or mean).

  Examples:
    >>> from experiments.regret.fragility import Margin
    >>> close = Margin("dynamic=0.1:0.2", 4.07, "retrieval_tutorial_logq", "tau=0.2", 4.86)
    >>> round(close.gap, 2), round(close.above_tie, 2)
    (0.79, 0.29)
  """
  winner: str
  worst: float
  worst_row: str
  runner_up: str
  runner_up_worst: float

  @property
  def gap(self) -> float:
    return self.runner_up_worst - self.worst

  @property
  def above_tie(self) -> float:
    return self.gap - TIE


@dataclasses.dataclass(frozen=True)
class LeftOut:
  """The decision rule over a set less `row`: its pick and the pick's worst case there."""
  row: str
  winner: str
  worst: float
  worst_row: str


def deciding_sets(result: Study) -> list[SetSummary]:
  """The sets of rows a round's decision rule runs over, in round order."""
  return sorted((s for s in result.sets if s.rows.decides), key=lambda s: s.rows.decides)


def decided(result: Study, over: SetSummary) -> list[str] | None:
  """The finalists of the set's decision once every one has every row, else None (a screening
  pending, or a cell not yet run)."""
  chosen = finalists(over.rows.decides, result.screenings)
  if not chosen or any(s["rows"] < s["of_rows"] for s in over.summary if s["candidate"] in chosen):
    return None
  return chosen


def margin(result: Study, over: SetSummary) -> Margin | None:
  """The decision's margin over the set (None until every finalist has every row)."""
  chosen = decided(result, over)
  if chosen is None:
    return None
  by = {s["candidate"]: s for s in over.summary}
  winner = pick(over.summary, chosen)
  other = min((by[c] for c in chosen if c != winner), key=lambda s: s["worst"])
  return Margin(winner, by[winner]["worst"], by[winner]["worst_row"], other["candidate"],
                other["worst"])


def leave_one_out(result: Study, over: SetSummary) -> list[LeftOut]:
  """The decision rule over the set less each of its rows in turn (empty until every finalist
  has every row)."""
  chosen = decided(result, over)
  if chosen is None:
    return []
  out = []
  for row in over.rows.rows:
    kept = tuple(r for r in over.rows.rows if r != row)
    by_candidate = summary(result.full, kept, CANDIDATES)
    winner = pick(by_candidate, chosen)
    mine = next(s for s in by_candidate if s["candidate"] == winner)
    out.append(LeftOut(row, winner, mine["worst"], mine["worst_row"]))
  return out


def markdown(result: Study) -> str:
  """Each decision's margin to the tie threshold and the rule with each row left out."""
  sets = deciding_sets(result)
  lines = []
  for over in sets:
    m = margin(result, over)
    if m is None:
      lines.append(f"- Round {over.rows.decides}: not every finalist has every row yet.")
      continue
    gap = round(m.runner_up_worst, 2) - round(m.worst, 2)
    loo = leave_one_out(result, over)
    flips = [x for x in loo if x.winner != m.winner]
    lines.append(
        f"- Round {over.rows.decides}, over {over.rows.short}: `{m.winner}` "
        f"{m.worst:.2f} at worst against `{m.runner_up}` {m.runner_up_worst:.2f}, "
        f"{gap:.2f} apart: "
        + (f"{gap - TIE:.2f} above the tie threshold of {TIE:g}" if gap >= TIE else
           f"a tie (under {TIE:g}), won by rows within noise or mean")
        + f". Left out one row at a time, the rule picks another candidate in {len(flips)} of "
        f"{len(loo)} cases"
        + (": " + "; ".join(f"without {x.row}, `{x.winner}` ({x.worst:.2f} at worst)"
                            for x in flips) if flips else "") + ".")
  rows = list(dict.fromkeys(r for over in sets for r in over.rows.rows))
  table = {(over.rows.key, x.row): x for over in sets
           for x in leave_one_out(result, over)}
  lines += ["", "| row left out | " + " | ".join(f"round {s.rows.decides}: pick (worst case)"
                                                 for s in sets) + " |",
            "|---|" + "---|" * len(sets)]
  for row in rows:
    cells = [table.get((s.rows.key, row)) for s in sets]
    lines.append(f"| {row} | " + " | ".join("not in its set" if x is None else
                                           f"`{x.winner}` ({x.worst:.2f})" for x in cells) + " |")
  return "\n".join(lines) + "\n"
