r"""Round 3 of `docs/regret.md`: τ chosen per seed from a row's fixed-τ grid by a score of the
runs, and its regret against the row's best fixed τ, from the round-3 per-seed CSVs.

A **selector** reads one column of each run of the grid (a label-free score at 10%, 25% or
100% of training, `experiments.framework.held_out`, or a labelled validation metric) and picks
the τ with the best value (the largest, the smallest, or the nearest to 1 for α-ReQ); a tie
counts as the mean regret of the tied τ's. Per seed, its **regret** is the row's best fixed τ
(the highest mean metric over the row's seeds, in the same round-3 sweep) minus the picked τ's
metric, in the row's units. Two rules that read nothing, the grid's smallest and its largest
τ, stand beside the selectors: a selector that measures τ rather than quality lands on them.

The stages (fixed in `docs/regret.md`, "Round 3"): the screening rows first (every row but
GRACE's); a selector more than `STOP` units behind on any of them stops; then GRACE at seeds
0-4, with the same rule; GRACE's seeds 5-19 run only if a selector is still going on.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from experiments.framework import held_out
from experiments.regret.rows import ROWS, Row
from experiments.regret.runs import RESULTS, _paired_p, candidate_of, fixed_tau, read_table

#: A selector more than this many units behind on a row of a stage stops there.
STOP = 3.0
#: The paired t-test level of "within noise" (as rounds 1 and 2).
ALPHA = 0.05
#: GRACE's seeds of the second stage.
GRACE_SCREENING_SEEDS = 5
#: A selector whose picks sit on one edge of the grids for at least this share of its
#: row-seeds is reported as measuring τ, whatever its regret.
EDGE_SHARE = 0.8
#: Each score and how its best τ is read: the largest, the smallest, or the nearest to 1.
SCORES = (("rankme", "max"), ("alpha_req", "nearest_one"), ("lidar", "max"),
          ("alignment", "min"), ("uniformity", "min"), ("view_top1", "max"))
#: When the scores are read: the end of training, and 10% and 25% of it.
READS = (1.0, 0.1, 0.25)


@dataclasses.dataclass(frozen=True)
class Selector:
  """How a τ is chosen: the run column read (`""` for the edge rules) and the rule (`max`,
  `min`, `nearest_one`, or the edge rules `smallest`, `largest`); `labelled`: it reads labels;
  `reference`: an edge rule, reported beside the selectors, never screened."""
  name: str
  column: str
  rule: str
  labelled: bool = False

  @property
  def reference(self) -> bool:
    return self.rule in ("smallest", "largest")


def _score_selector(score: str, rule: str, fraction: float) -> Selector:
  name = score + ("" if fraction == 1.0 else f"@{100 * fraction:g}%")
  return Selector(name, held_out.column(score, fraction), rule)


SELECTORS = (
    *(_score_selector(score, rule, fraction) for fraction in READS for score, rule in SCORES),
    Selector("validation", "val_f1_micro", "max", labelled=True),
    Selector("smallest τ", "", "smallest"), Selector("largest τ", "", "largest"),
)


@dataclasses.dataclass(frozen=True)
class SelectionRow:
  """A row of round 3: the round-1/2 row (metric, loss form, seeds, units), the round-3 table
  that re-runs its grid with the scores, its fixed-τ grid (mapping specs) and whether the row
  is label-free (no labels a user could hold out) and part of the screening stage."""
  row: Row
  table: str
  grid: tuple[str, ...]
  label_free: bool
  screening: bool = True

  @property
  def key(self) -> str:
    return self.row.key


def _grid(*taus: str) -> tuple[str, ...]:
  return tuple(f"tau={tau}" for tau in taus)


_SIMCLR = _grid("0.05", "0.1", "0.25", "0.5", "1")
_SUPCON = _grid("0.05", "0.1", "0.5", "1")
_GRACE = _grid("0.1", "0.25", "0.5", "1")
_TUTORIAL = _grid("0.05", "0.1", "0.2", "0.5", "1", "2", "5", "10")
_FEATURES = _grid("0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1")
_LOGQ = _grid("0.02", "0.05", "0.1", "0.2", "0.5", "1", "2", "5")
#: Row key -> (round-3 table, grid, label-free): every row of rounds 1-2 with a grid of 3 or
#: more τ's (DCRec's has one), the grids of `experiments/results/regret.md`.
PLAN = {
    "simclr_digits_e20": ("regret3_simclr_digits_grid", _SIMCLR, True),
    "simclr_digits_e100": ("regret3_simclr_digits_grid_e100", _SIMCLR, True),
    "simclr_mnist1d_knn": ("regret3_simclr_mnist1d", _SIMCLR, True),
    "simclr_mnist1d_linear": ("regret3_simclr_mnist1d", _SIMCLR, True),
    "msc_digits": ("regret3_msc_digits", _grid("0.1", "0.2", "0.25", "0.5", "1"), True),
    "supcon_digits": ("regret3_supcon_digits", _SUPCON, False),
    "supcon_mnist1d": ("regret3_supcon_mnist1d", _SUPCON, False),
    "ntxent_digits": ("regret3_supcon_digits_ntxent", _SUPCON, False),
    "ntxent_mnist1d": ("regret3_supcon_mnist1d_ntxent", _SUPCON, False),
    "retrieval_tutorial": ("regret3_retrieval_ml100k", _TUTORIAL, False),
    "retrieval_tutorial_clip": ("regret3_retrieval_ml100k", _TUTORIAL, False),
    "retrieval_features": ("regret3_retrieval_ml100k_features", _FEATURES, False),
    "retrieval_features_clip": ("regret3_retrieval_ml100k_features", _FEATURES, False),
    "retrieval_tutorial_logq": ("regret3_retrieval_ml100k_logq", _LOGQ, False),
    "retrieval_tutorial_clip_logq": ("regret3_retrieval_ml100k_clip_logq", _LOGQ, False),
    "retrieval_features_logq": ("regret3_retrieval_ml100k_features_logq", _LOGQ, False),
    "retrieval_features_clip_logq": ("regret3_retrieval_ml100k_features_clip_logq", _LOGQ,
                                     False),
    "grace_citeseer": ("regret3_grace_citeseer", _GRACE, True),
    "grace_cora": ("regret3_grace_cora", _GRACE, True),
}
_BY_KEY = {row.key: row for row in ROWS}
SELECTION_ROWS = tuple(SelectionRow(_BY_KEY[key], table, grid, label_free,
                                    screening=_BY_KEY[key].family != "GRACE")
                       for key, (table, grid, label_free) in PLAN.items())


def _number(value) -> float:
  try:
    return float(value)
  except (TypeError, ValueError):
    return math.nan


@dataclasses.dataclass
class GridRuns:
  """A round-3 row's runs: `{column: {τ spec: {seed: mean over the run's lines}}}` for the
  metric and every column a selector reads, and the reference (best mean metric over the row's
  first `seeds` seeds) once every τ of the grid has them."""
  row: SelectionRow
  values: dict[str, dict[str, dict[int, float]]]

  @classmethod
  def read(cls, row: SelectionRow, results: str = RESULTS) -> GridRuns | None:
    """The row's runs from `results/<table>.csv`, None when that table is not committed."""
    lines = read_table(row.table, results)
    if lines is None:
      return None
    columns = {row.row.metric, *(s.column for s in SELECTORS if s.column)}
    gathered = collections.defaultdict(lambda: collections.defaultdict(
        lambda: collections.defaultdict(list)))
    for line in lines:
      spec = candidate_of(str(line["spec"]), row.row)
      if spec not in row.grid:
        continue
      for column in columns & set(line):
        gathered[column][spec][int(line["seed"])].append(_number(line[column]))
    return cls(row, {column: {spec: {seed: float(np.mean(v)) for seed, v in seeds.items()}
                              for spec, seeds in by_spec.items()}
                     for column, by_spec in gathered.items()})

  def reference(self, seeds: int) -> str | None:
    """The grid's τ with the highest mean metric over seeds `0 .. seeds - 1`; None before
    every τ has them."""
    metric = self.values.get(self.row.row.metric, {})
    if any(not all(s in metric.get(spec, {}) for s in range(seeds)) for spec in self.row.grid):
      return None
    return max(self.row.grid, key=lambda spec: np.mean([metric[spec][s] for s in range(seeds)]))

  def picks(self, selector: Selector, seed: int) -> list[str] | None:
    """The τ's the selector picks on `seed` (several on a tie); None where a τ of the grid has
    no finite value of its column on that seed."""
    if selector.rule == "smallest":
      return [min(self.row.grid, key=fixed_tau)]
    if selector.rule == "largest":
      return [max(self.row.grid, key=fixed_tau)]
    column = self.values.get(selector.column, {})
    scores = {spec: column.get(spec, {}).get(seed, math.nan) for spec in self.row.grid}
    if not all(math.isfinite(v) for v in scores.values()):
      return None
    key = {"max": lambda v: -v, "min": lambda v: v, "nearest_one": lambda v: abs(v - 1.0)}
    rank = {spec: key[selector.rule](value) for spec, value in scores.items()}
    best = min(rank.values())
    return [spec for spec in self.row.grid if rank[spec] == best]

  def cell(self, selector: Selector, seeds: int) -> dict | None:
    """The selector's regret on seeds `0 .. seeds - 1`, paired by seed; None when the grid or
    the selector's column is missing on one of them."""
    reference = self.reference(seeds)
    if reference is None:
      return None
    metric = self.values[self.row.row.metric]
    regret, edges, chosen = [], [0, 0], collections.Counter()
    smallest, largest = min(self.row.grid, key=fixed_tau), max(self.row.grid, key=fixed_tau)
    for seed in range(seeds):
      picked = self.picks(selector, seed)
      if picked is None:
        return None
      regret.append(np.mean([metric[reference][seed] - metric[spec][seed] for spec in picked])
                    / self.row.row.unit)
      edges[0] += np.mean([spec == smallest for spec in picked])
      edges[1] += np.mean([spec == largest for spec in picked])
      chosen.update({spec: 1 / len(picked) for spec in picked})
    regret = np.asarray(regret)
    return {"row": self.row.key, "selector": selector.name, "reference": reference,
            "seeds": seeds, "regret": float(regret.mean()),
            "sem": float(regret.std(ddof=1) / np.sqrt(seeds)) if seeds > 1 else math.nan,
            "p_value": _paired_p(regret), "seeds_won": int(np.sum(regret <= 0)),
            "at_smallest": float(edges[0] / seeds), "at_largest": float(edges[1] / seeds),
            "picks": dict(chosen)}


def within_noise(cell: dict) -> bool:
  """At least as good as the best fixed τ, or the paired p above `ALPHA`."""
  return cell["regret"] <= 0 or not cell["p_value"] <= ALPHA


@dataclasses.dataclass(frozen=True)
class Selection:
  """Every cell of every stage (`full`: the row's seeds; `grace_5`: GRACE's seeds 0-4), each
  selector's verdict and the summaries over all rows and over the label-free rows."""
  rows: tuple[SelectionRow, ...]
  grids: dict[str, GridRuns]
  full: list[dict]
  grace_5: list[dict]
  verdict: dict[str, str]
  summaries: dict[str, list[dict]]


def verdict(selector: Selector, rows: Sequence[SelectionRow], full: Sequence[dict],
            grace_5: Sequence[dict]) -> str:
  """The stop rule of round 3 for one selector: `stops at screening (row +x)`, `stops at GRACE,
  seeds 0-4 (row +x)`, `pending (...)` while a cell it would read is missing, or `goes on`."""
  if selector.reference:
    return "reference (not screened)"
  if selector.labelled:
    return "labelled baseline (not screened)"
  grace_stage = f"GRACE, seeds 0-{GRACE_SCREENING_SEEDS - 1}"
  for stage, cells, wanted in (("screening", full, [r for r in rows if r.screening]),
                               (grace_stage, grace_5, [r for r in rows if not r.screening])):
    mine = {c["row"]: c for c in cells if c["selector"] == selector.name}
    behind = [c for c in mine.values() if c["regret"] > STOP]
    if behind:
      worst = max(behind, key=lambda c: c["regret"])
      return f"stops at {stage} ({worst['row']} {worst['regret']:+.2f})"
    missing = [r.key for r in wanted if r.key not in mine and _applies(selector, r)]
    if missing:
      more = f" and {len(missing) - 3} more rows" if len(missing) > 3 else ""
      return f"pending ({stage}: {', '.join(missing[:3])}{more})"
  return "goes on"


def _applies(selector: Selector, row: SelectionRow) -> bool:
  """The labelled baseline needs a validation split (GRACE's); LiDAR needs augmented views (no
  two-tower row has them)."""
  if selector.labelled:
    return not row.screening
  return not (selector.column.startswith(held_out.column("lidar", 1.0))
              and row.row.family in ("tutorial", "feature towers", "logQ"))


def summary(cells: Sequence[dict], rows: Sequence[SelectionRow]) -> list[dict]:
  """Per selector over `rows`: rows run (of those it applies to), worst regret (its row), mean
  regret, rows within noise, its picks at the grid's edges (share of row-seeds) and whether it
  measures τ (`measures_tau`: the edge its picks sit on for `EDGE_SHARE` of them, or "")."""
  out = []
  for selector in SELECTORS:
    applies = [r.key for r in rows if _applies(selector, r)]
    mine = [c for c in cells if c["selector"] == selector.name and c["row"] in applies]
    worst = max(mine, key=lambda c: c["regret"]) if mine else None
    seeds = sum(c["seeds"] for c in mine)
    share = {edge: sum(c[edge] * c["seeds"] for c in mine) / seeds if seeds else math.nan
             for edge in ("at_smallest", "at_largest")}
    out.append({
        "selector": selector.name, "rows": len(mine), "of_rows": len(applies),
        "worst": worst["regret"] if worst else math.nan, "worst_row": worst["row"] if worst else "",
        "mean": float(np.mean([c["regret"] for c in mine])) if mine else math.nan,
        "within_noise": sum(within_noise(c) for c in mine), **share,
        "measures_tau": next((edge for edge, key in (("smallest", "at_smallest"),
                                                    ("largest", "at_largest"))
                              if not selector.reference and share[key] >= EDGE_SHARE), "")})
  return out


def selection(results: str = RESULTS, rows: Sequence[SelectionRow] = SELECTION_ROWS
              ) -> Selection:
  """Round 3's selection from the committed round-3 CSVs under `results`."""
  grids = {r.key: g for r in rows if (g := GridRuns.read(r, results)) is not None}
  full, grace_5 = [], []
  for row in rows:
    if row.key not in grids:
      continue
    for selector in SELECTORS:
      if not _applies(selector, row):
        continue
      cell = grids[row.key].cell(selector, row.row.seeds)
      if cell is not None:
        full.append(cell)
      if not row.screening:
        cell = grids[row.key].cell(selector, GRACE_SCREENING_SEEDS)
        if cell is not None:
          grace_5.append(cell)
  verdicts = {s.name: verdict(s, rows, full, grace_5) for s in SELECTORS}
  summaries = {"all": summary(full, rows),
               "label_free": summary(full, [r for r in rows if r.label_free])}
  return Selection(tuple(rows), grids, full, grace_5, verdicts, summaries)
