"""Round 2's predictions, written before any of its runs (`docs/regret.md`, "Predictions"), as
tests on the cells: for each new candidate and row family (or row), what its regret would be.

Regret in the study's units; "within noise" is `study.within_noise`; "within X" is a regret of
at most X (ahead counts); "A-B behind" a regret between A and B; "more than X behind" a regret
above X.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from experiments.regret.rows import ROUND_2_CANDIDATES, Row
from experiments.regret.study import Study, within_noise


@dataclasses.dataclass(frozen=True)
class Prediction:
  """What was predicted (`text`, as the page words it) and its test on a cell.

  Examples:
    >>> from experiments.regret.predictions import behind_by, more_than
    >>> behind_by(1, 3).holds({"regret": 2.7, "p_value": 0.01}), behind_by(1, 3).text
    (True, '1-3 behind')
    >>> more_than(3).holds({"regret": 2.8, "p_value": 1e-6})
    False
  """
  text: str
  holds: Callable[[dict], bool]


NOISE = Prediction("within noise", within_noise)


def within(bound: float) -> Prediction:
  return Prediction(f"within {bound:g}", lambda cell: cell["regret"] <= bound)


def behind_by(low: float, high: float) -> Prediction:
  return Prediction(f"{low:g}-{high:g} behind", lambda cell: low <= cell["regret"] <= high)


def more_than(bound: float) -> Prediction:
  return Prediction(f"more than {bound:g} behind", lambda cell: cell["regret"] > bound)


_CALIBRATED, _PERPLEXITY, _ACCURACY = ROUND_2_CANDIDATES
#: (row family or row key, candidate) -> prediction; a row key comes before its family.
PREDICTIONS = {
    ("SimCLR-type", _CALIBRATED): NOISE,
    ("SimCLR-type", _PERPLEXITY): behind_by(1, 3),
    ("SimCLR-type", _ACCURACY): NOISE,
    ("MSC", _CALIBRATED): within(0.1),
    ("MSC", _PERPLEXITY): within(0.1),
    ("MSC", _ACCURACY): within(0.1),
    ("DCRec", _CALIBRATED): NOISE,
    ("DCRec", _PERPLEXITY): behind_by(1, 3),
    ("DCRec", _ACCURACY): behind_by(1, 3),
    ("GRACE", _CALIBRATED): more_than(3),
    ("grace_citeseer", _PERPLEXITY): NOISE,
    ("grace_cora", _PERPLEXITY): behind_by(1, 3),
    ("GRACE", _ACCURACY): Prediction("more than 3 behind on one dataset at least",
                                     lambda cell: cell["regret"] > 3),
    ("tutorial", _CALIBRATED): behind_by(1, 3),
    ("tutorial", _PERPLEXITY): more_than(3),
    ("tutorial", _ACCURACY): NOISE,
    ("feature towers", _CALIBRATED): within(3),
    ("feature towers", _PERPLEXITY): more_than(3),
    ("feature towers", _ACCURACY): more_than(3),
    ("logQ", _CALIBRATED): within(3),
    ("retrieval_tutorial_logq", _PERPLEXITY): more_than(3),
    ("retrieval_tutorial_clip_logq", _PERPLEXITY): more_than(3),
    ("logQ", _ACCURACY): within(3),
}
#: The worst case over every row predicted for each new candidate, and for the goal.
WORST_ABOVE = 3.0


def prediction(row: Row, candidate: str) -> Prediction | None:
  """The prediction for the candidate on the row (None: none was made)."""
  return PREDICTIONS.get((row.key, candidate)) or PREDICTIONS.get((row.family, candidate))


def table(result: Study, candidates: Sequence[str] = ROUND_2_CANDIDATES) -> list[str]:
  """Per row, each candidate's prediction, its regret and whether the prediction held."""
  by_cell = {(c["row"], c["candidate"]): c for c in result.full}
  lines = ["| row | " + " | ".join(f"`{c}`: predicted, measured" for c in candidates) + " |",
           "|---|" + "---|" * len(candidates)]
  held = {c: [0, 0] for c in candidates}
  for row in result.rows:
    text = []
    for candidate in candidates:
      said, cell = prediction(row, candidate), by_cell.get((row.key, candidate))
      if said is None or cell is None:
        text.append((said.text if said else "none") + ", " + ("not run" if cell is None
                                                               else f"{cell['regret']:+.2f}"))
        continue
      ok = said.holds(cell)
      held[candidate][0] += ok
      held[candidate][1] += 1
      text.append(f"{said.text}, {cell['regret']:+.2f}{'' if within_noise(cell) else '*'}: "
                  + ("held" if ok else "missed"))
    lines.append(f"| {row.key} | " + " | ".join(text) + " |")
  lines += ["", "Held: " + "; ".join(f"`{c}` {k} of {n} cells" for c, (k, n) in held.items())
            + "."]
  return lines
