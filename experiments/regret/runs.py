r"""A row's runs from its committed tables: the grid of fixed τ's and its best τ (the row's
reference), and each candidate's regret against it, paired by seed.

The reference is the fixed τ with the highest mean over the row's seeds among the τ's of its grid
tables and of the extension tables committed so far, not the τ's the study adds as candidates
(`tau=0.2` where the grid lacks it). A candidate's runs come from the table that holds the most of
its seeds; they pair with the reference's runs in the same table when that table holds the
reference too (the same sweep), else with the reference's own table (**across sweeps**:
per-seed results reproduce on one machine, not bit for bit across machines).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
from collections.abc import Sequence

import numpy as np

from experiments.framework import tables
from experiments.regret.rows import Row

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
#: The sequence a grid is extended along (`docs/regret.md`, round 2): 1, 2, 5 per decade.
_MANTISSAS = (1.0, 2.0, 5.0)


def read_table(name: str, results: str = RESULTS) -> list[dict] | None:
  """The lines of `results/NAME.csv` (None when it is not committed)."""
  path = os.path.join(results, name + ".csv")
  return (tables.typed(tables.read_csv(path, columns=("spec", "seed")))
          if os.path.exists(path) else None)


def candidate_of(loss: str, row: Row) -> str | None:
  """The mapping spec of a run whose loss is `row.prefix + spec + row.suffix`, or None for a run
  of another loss form (`clip:` in a one-tower row, `sigmoid/...`, `+logq` in a row without it)."""
  if not (loss.startswith(row.prefix) and loss.endswith(row.suffix)):
    return None
  spec = loss[len(row.prefix):len(loss) - len(row.suffix)]
  if not spec or ":" in spec.split("=", 1)[0] or "/" in spec or "+" in spec:
    return None
  return spec


def runs_of(lines: Sequence[dict], row: Row) -> dict[str, dict[int, float]]:
  """`{candidate spec: {seed: metric}}` of one table's runs of the row's loss form; a run's
  several lines (MSC's normal classes) are averaged."""
  values = collections.defaultdict(lambda: collections.defaultdict(list))
  for line in lines:
    spec = candidate_of(str(line["spec"]), row)
    if spec is None:
      continue
    value = float(line[row.metric])
    if not math.isfinite(value):
      raise ValueError(f"{row.metric} of {line['spec']!r}, seed {line['seed']} is {value}: a "
                       "run without a result cannot be paired.")
    values[spec][int(line["seed"])].append(value)
  return {spec: {seed: float(np.mean(v)) for seed, v in seeds.items()}
          for spec, seeds in values.items()}


def fixed_tau(spec: str) -> float | None:
  """τ of a fixed-τ spec `tau=X`, else None."""
  if spec.startswith("tau="):
    try:
      return float(spec[len("tau="):])
    except ValueError:
      return None
  return None


def next_tau(tau: float, *, up: bool) -> float:
  """The value of the sequence …, 0.01, 0.02, 0.05, 0.1, 0.2, … next above (`up`) or below τ."""
  decade = math.floor(math.log10(tau))
  steps = [m * 10.0 ** d for d in (decade - 1, decade, decade + 1) for m in _MANTISSAS]
  steps = [float(f"{s:.12g}") for s in steps]
  return min(s for s in steps if s > tau) if up else max(s for s in steps if s < tau)


@dataclasses.dataclass
class RowRuns:
  """A row's runs per table (`{table: {spec: {seed: value}}}`, committed tables only) as of a
  round, and its reference: the best fixed τ of the grid."""
  row: Row
  by_table: dict[str, dict[str, dict[int, float]]]
  reference: str | None
  reference_table: str | None
  grid: dict[str, float]  # fixed τ spec -> mean over the row's seeds

  @classmethod
  def read(cls, row: Row, results: str = RESULTS, *, as_of: int = 2) -> RowRuns:
    """The row's runs from the tables it reads as of round `as_of` (`Row.tables`)."""
    by_table = {}
    for name in row.tables(as_of):
      lines = read_table(name, results)
      if lines is not None:
        by_table[name] = runs_of(lines, row)
    grid, home = {}, {}
    grid_tables = [name for name in row.tables(as_of) if name in row.grid + row.extension]
    for name in grid_tables:
      for spec, seeds in by_table.get(name, {}).items():
        if fixed_tau(spec) is not None and spec not in grid and len(seeds) >= row.seeds:
          grid[spec] = float(np.mean([seeds[s] for s in sorted(seeds)[:row.seeds]]))
          home[spec] = name
    complete = all(name in by_table for name in row.grid)
    reference = max(grid, key=grid.get) if grid and complete else None
    return cls(row, by_table, reference, home.get(reference), grid)

  def edge(self) -> str:
    """Where the reference sits in the grid: `"top"` (the largest τ), `"bottom"` (the
    smallest), `"inside"` (a run τ on each side), `"single"` (a grid of one τ) or `"none"`
    (no reference yet)."""
    if self.reference is None:
      return "none"
    taus = [fixed_tau(spec) for spec in self.grid]
    best = fixed_tau(self.reference)
    if len(taus) == 1:
      return "single"
    return "top" if best == max(taus) else "bottom" if best == min(taus) else "inside"

  def pair(self, candidate: str, *, seeds: int | None = None) -> dict | None:
    """The candidate's regret against the reference, paired by seed (the first `seeds` seeds,
    default the row's count), or None when the candidate or the reference has not run."""
    if self.reference is None:
      return None
    holding = [name for name, runs in self.by_table.items() if candidate in runs]
    if not holding:
      return None
    # The table with the most seeds of the candidate; among those, one with the reference.
    most = max(len(self.by_table[name][candidate]) for name in holding)
    holding = [name for name in holding if len(self.by_table[name][candidate]) == most]
    same = [name for name in holding if self.reference in self.by_table[name]]
    table = (same or holding)[0]
    reference_table = table if same else self.reference_table
    ours = self.by_table[table][candidate]
    theirs = self.by_table[reference_table][self.reference]
    wanted = range(self.row.seeds if seeds is None else seeds)
    shared = [s for s in wanted if s in ours and s in theirs]
    if not shared:
      return None
    regret = np.array([theirs[s] - ours[s] for s in shared]) / self.row.unit
    many = len(shared) > 1
    sem = float(regret.std(ddof=1) / np.sqrt(len(shared))) if many else math.nan
    return {
        "row": self.row.key, "candidate": candidate, "reference": self.reference,
        "seeds": len(shared), "of_seeds": len(wanted), "regret": float(regret.mean()),
        "sem": sem, "p_value": _paired_p(regret), "seeds_won": int(np.sum(regret <= 0)),
        "table": table, "reference_table": reference_table,
        "pairs": "same sweep" if table == reference_table else "across sweeps",
    }

  def reruns(self) -> dict[str, float]:
    """`{table: max |difference|}` of the reference's runs in each later table against its
    own table's, over their shared seeds (in metric units): how exactly a rerun reproduced."""
    if self.reference is None:
      return {}
    base = self.by_table[self.reference_table][self.reference]
    out = {}
    for name, runs in self.by_table.items():
      if name != self.reference_table and self.reference in runs:
        shared = sorted(set(base) & set(runs[self.reference]))
        if shared:
          out[name] = max(abs(base[s] - runs[self.reference][s]) for s in shared) / self.row.unit
    return out


def _paired_p(regret: np.ndarray) -> float:
  """Two-sided one-sample t-test of the per-seed regrets against 0 (= the paired t-test of
  the two metrics, `scipy.stats.ttest_rel`); 1 when every seed ties, NaN below 2 seeds."""
  from scipy import stats  # noqa: PLC0415

  if len(regret) < 2:
    return math.nan
  if np.all(regret == regret[0]):
    return 1.0 if regret[0] == 0 else 0.0
  return float(stats.ttest_1samp(regret, 0.0).pvalue)
