"""The outcome sections of `docs/regret.md` written from the study: each round's screening and
decision, the summaries over each set, every cell, what each scale did, the reruns of the
references and the predictions against the cells (the decisions' fragility and the dated
changes to the protocols: `fragility.markdown`, `changes.markdown`). `experiments.regenerate`
writes each into its block (`pages.WRITERS`).
"""

from __future__ import annotations

from collections.abc import Sequence

from experiments.regret import predictions, quotes
from experiments.regret.report import matrix_table
from experiments.regret.rows import CANDIDATES, candidates_of
from experiments.regret.scales import ScaleTrace
from experiments.regret.study import GOALS, TIE, SetSummary, Study, finalists, goal


def _titles(result: Study) -> dict[str, str]:
  return {s.rows.key: s.rows.short for s in result.sets}


def decision(result: Study, over: SetSummary) -> str:
  """The decision over a deciding set: the winner and every finalist's worst case, the
  winner's rows within noise and mean against free's, and the goals."""
  chosen = finalists(over.rows.decides, result.screenings) or []
  by = {s["candidate"]: s for s in over.summary}
  won = quotes.winner(result, over)
  others = sorted((by[c] for c in chosen if c != won), key=lambda s: s["worst"])
  left = [c for c in candidates_of(over.rows.decides) if c not in chosen]
  mine, free = by[won], by["free"]
  cells = sum(by[c]["rows"] for c in chosen)
  name = _titles(result)[over.rows.key]
  text = (f"**Round {over.rows.decides}'s decision: `{won}`.** Over {name} ({cells} cells of "
          f"{len(chosen)} finalists, every one run) its worst case is the "
          f"smallest, {mine['worst']:.2f} ({mine['worst_row']}); the others': "
          + ", ".join(f"`{s['candidate']}` {s['worst']:.2f}" for s in others)
          + f" (a difference under {TIE:g} is a tie). It is level with or ahead of the best τ "
          f"on {mine['within_noise']} rows (free {free['within_noise']}), with a mean regret of "
          f"{mine['mean']:.2f} (free {free['mean']:.2f}). "
          + " ".join(f"Worst case ≤ {bound:g}: {goal(over.summary, bound)}." for bound in GOALS))
  if left:
    text += " Stopped at screening: " + ", ".join(f"`{c}`" for c in left) + "."
  return text + "\n"


def screening(result: Study, number: int) -> str:
  """Round `number`'s screening: per new mapping, its worst case and rows within noise over
  the screening rows against free's, and the verdict."""
  lines = []
  for s in (s for s in result.screenings if s.round.number == number):
    by = {c["candidate"]: c for c in s.summary}
    free = by["free"]
    lines.append(
        f"Over its {len(s.rows)} screening rows (free {free['worst']:.2f} at worst, level or "
        f"ahead on {free['within_noise']}): " + "; ".join(
            f"`{c}` {by[c]['worst']:.2f} at worst over {by[c]['rows']} rows, level or ahead on "
            f"{by[c]['within_noise']}: {s.verdict[c]}" for c in s.round.new_mappings) + ".")
  return "\n".join(lines) + "\n"


def summaries(result: Study) -> str:
  """Every candidate over each set of rows: worst case, mean, rows level or ahead."""
  sets = [s for s in result.sets if s.rows.key != "advised_tutorial"]
  lines = ["| candidate | " + " | ".join(f"{_titles(result).get(s.rows.key, s.rows.key)}: "
                                          "worst, mean, level or ahead" for s in sets) + " |",
           "|---|" + "---|" * len(sets)]
  for candidate in CANDIDATES:
    text = []
    for over in sets:
      s = next(x for x in over.summary if x["candidate"] == candidate)
      text.append(f"{s['worst']:.2f}, {s['mean']:.2f}, {s['within_noise']}/{s['rows']}"
                  + ("" if s["rows"] == s["of_rows"] else f" (of {s['of_rows']} rows)"))
    lines.append(f"| `{candidate}` | " + " | ".join(text) + " |")
  return "\n".join(lines) + "\n"


def round_2_tables(result: Study) -> str:
  """Each row's round-2 tables committed (its grid extension and new candidates)."""
  lines = ["| row | round-2 tables |", "|---|---|"]
  for runs in result.runs:
    mine = [t for t in runs.by_table if t.startswith("regret2_")]
    if mine:
      lines.append(f"| {runs.row.key} | " + ", ".join(f"`{t}`" for t in mine) + " |")
  return "\n".join(lines) + "\n"


def every_row(result: Study) -> str:
  return "\n".join(matrix_table(result)) + "\n"


def scale_table(found: Sequence[ScaleTrace]) -> str:
  """Each learnt or solved scale's start and end, mean over seeds, per row."""
  names = [c for c in CANDIDATES if any(t.candidate == c for t in found)]
  by = {(t.row.key, t.candidate): t for t in found}
  keys = list(dict.fromkeys(t.row.key for t in found))
  lines = ["| row | " + " | ".join(f"`{c}`" for c in names) + " |", "|---|" + "---|" * len(names)]
  for key in keys:
    text = []
    for c in names:
      t = by.get((key, c))
      text.append("" if t is None else (f"{t.scale[0]:.3g} → " if len(t.scale) > 1 else "→ ")
                  + f"{t.scale[-1]:.3g}")
    lines.append(f"| {key} | " + " | ".join(text) + " |")
  return "\n".join(lines) + "\n"


def reruns(result: Study) -> str:
  """How exactly each rerun of a row's reference reproduced the committed runs."""
  lines = []
  for runs in result.runs:
    for table, diff in runs.reruns().items():
      lines.append(f"- {runs.row.key}, `{table}.csv`: "
                   + ("identical on every seed" if diff == 0
                      else f"at most {diff:.3g} units per seed from `{runs.reference_table}.csv`"))
  return "\n".join(lines) + "\n"


def predicted(result: Study) -> str:
  """Round 2's predictions against the cells, and the predicted worst cases."""
  every = next(s for s in result.sets if s.rows.key == "all")
  worst = [s for s in every.summary if s["candidate"] in predictions.ROUND_2_CANDIDATES]
  lines = predictions.table(result) + [
      "", f"Predicted: each new candidate's worst case over every row above "
      f"{predictions.WORST_ABOVE:g}, and no candidate at ≤ {GOALS[0]:g}. Measured: "
      + ", ".join(f"`{s['candidate']}` {s['worst']:.2f}"
                  + ("" if s["rows"] == s["of_rows"] else f" over {s['rows']} rows")
                  for s in worst)
      + f"; worst case ≤ {GOALS[0]:g}: {goal(every.summary, GOALS[0])}."]
  return "\n".join(lines) + "\n"



