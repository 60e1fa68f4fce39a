"""The blocks of README.md and docs/ that quote the regret study, by the name their markers
give (`experiments.framework.blocks`): `experiments.regenerate` writes each from the committed
CSVs and `--check` fails when one differs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from experiments.framework import blocks
from experiments.regret import (
  changes,
  fragility,
  outcome,
  quotes,
  scales,
  selection,
  selection_report,
)
from experiments.regret.rows import CANDIDATES, ROWS, Row
from experiments.regret.runs import RESULTS
from experiments.regret.study import SetSummary, Study, study


@dataclasses.dataclass(frozen=True)
class Source:
  """What a block is written from: the study, its scales' traces and the results folder."""
  result: Study
  found: Sequence[scales.ScaleTrace]
  results: str

  def deciding(self, number: int) -> SetSummary:
    return next(s for s in self.result.sets if s.rows.decides == number)


#: Every block's name, and what writes it.
WRITERS: dict[str, Callable[[Source], str]] = {
    "regret: headline": lambda s: quotes.headline(s.result),
    "regret: picks": lambda s: quotes.picks(s.result),
    "regret: in short": lambda s: quotes.in_short(s.result),
    "regret: evidence": lambda s: quotes.evidence(s.result),
    "regret: evidence in detail": lambda s: quotes.evidence(s.result, detail=True),
    "regret: summary": lambda s: quotes.summary_lines(s.result),
    "regret: what to pick": lambda s: quotes.settings(s.result),
    "regret: logq gain": lambda s: quotes.logq_gain(s.result),
    "regret: fixed taus": lambda s: quotes.fixed_taus(s.result),
    **{f"regret: profile {c}": (lambda s, c=c: quotes.profile(s.result, c)) for c in CANDIDATES},
    **{f"regret: round {n} decision": (lambda s, n=n: outcome.decision(s.result, s.deciding(n)))
       for n in (1, 2)},
    **{f"regret: round {n} screening": (lambda s, n=n: outcome.screening(s.result, n))
       for n in (1, 2)},
    "regret: round 2 tables": lambda s: outcome.round_2_tables(s.result),
    "regret: summaries": lambda s: outcome.summaries(s.result),
    "regret: every row": lambda s: outcome.every_row(s.result),
    "regret: scales": lambda s: outcome.scale_table(s.found),
    "regret: reruns": lambda s: outcome.reruns(s.result),
    "regret: predictions": lambda s: outcome.predicted(s.result),
    "regret: fragility": lambda s: fragility.markdown(s.result),
    "regret: changes": lambda s: changes.markdown(s.result, s.results),
    "regret: round 3 in short": lambda s: selection_report.in_short(
        selection.selection(s.results)),
}


def texts(names: Sequence[str], results: str = RESULTS, rows: Sequence[Row] = ROWS
          ) -> dict[str, str]:
  """The text of each named block, from the committed CSVs under `results`.

  Raises:
    ValueError: a name no writer has, listing the names there are.
  """
  unknown = sorted(set(names) - set(WRITERS))
  if unknown:
    raise ValueError(f"no regret block is named {', '.join(map(repr, unknown))}; the blocks: "
                     + ", ".join(WRITERS) + ".")
  if not names:
    return {}
  source = Source(study(results, rows), scales.traces(rows, results), results)
  return {name: blocks.wrap(WRITERS[name](source)) for name in names}
