r"""The regret study of `docs/regret.md`: each candidate default against every benchmark's best
fixed τ, from the committed per-seed CSVs.

A candidate's **regret** on a row (a benchmark of the README's evidence table) is the row's best
fixed τ minus the candidate, paired by seed, in units of one metric point (0.01 of an accuracy,
F1, ROC-AUC or top-100 fraction; 0.005 of NDCG@10). The best fixed τ (the row's reference)
is the fixed τ with the highest mean in the row's committed grid: the τ's of the row's
committed table (and, for the feature towers' CLIP row, of the grid added to it), not the τ's
the study adds as candidates (`tau=0.2` where the grid lacks it). The tables that add runs to
a row are `regret_*.csv`.

A candidate's runs come from the table that holds the most of its seeds; they pair with the
reference's runs in the same table when that table holds the reference too (the same sweep),
else with the reference's own table (**across sweeps**: per-seed results reproduce on one
machine, not bit for bit across machines; the table says where each row pairs).

Per row and candidate: mean regret, its standard error, the two-sided paired t-test p and the
seeds where the candidate is at least as good. Per candidate: the **worst-case regret** (the
largest mean regret over the rows), the mean regret and the **rows within noise** (regret ≤ 0
or p > 0.05); the screening stage's rule and the decision rule of `docs/regret.md` applied to
what is committed. Rows or candidates not yet run are named, not guessed.

The outputs (`regret.md`, `.csv`, `.png`) are written by `experiments.regret.report`.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
from collections.abc import Mapping, Sequence

import numpy as np

from experiments.framework import tables

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")

#: The candidates of the pre-registration, as InfoNCE mapping specs (`tfcl_jax.losses.from_spec`);
#: a CLIP row prefixes them with `clip:`.
CANDIDATES = ("free", "tau=0.1", "tau=0.2", "tau=0.5", "tau=1", "learnable=0.07:100",
              "dynamic=0.1:0.2", "learnable_free=100", "free_n")
#: The mappings derived for the study: they go on from screening by the rule below.
NEW_MAPPINGS = ("learnable_free=100", "free_n")
#: The seeds' paired t-test level for "within noise".
ALPHA = 0.05
#: A worst-case regret difference under this many units is a tie (the decision rule).
TIE = 0.5


@dataclasses.dataclass(frozen=True)
class Row:
  """One benchmark: `tables` (committed first, then the tables adding to it) hold one CSV row per
  run with columns `spec`, `seed` and `metric` (averaged over a run's other rows, e.g. MSC's
  classes); `prefix` selects the loss family (`clip:`); `unit` is one metric point."""
  key: str
  title: str
  metric: str
  seeds: int
  tables: tuple[str, ...]
  prefix: str = ""
  unit: float = 0.01
  screening_seeds: int = 0  # > 0: a screening row, over seeds 0 .. screening_seeds - 1
  grid_tables: int = 1  # the first tables whose fixed τ's form the grid the reference comes from

  @property
  def screening(self) -> bool:
    return self.screening_seeds > 0


ROWS = (
    Row("grace_citeseer", "GRACE, CiteSeer (F1-micro)", "f1_micro", 20,
        ("grace_citeseer", "regret_grace_citeseer"), screening_seeds=5),
    Row("grace_cora", "GRACE, Cora (F1-micro)", "f1_micro", 20,
        ("grace_cora", "regret_grace_cora")),
    Row("simclr_mnist1d_knn", "SimCLR, MNIST-1D (kNN)", "knn_top1", 5,
        ("simclr_mnist1d", "regret_simclr_mnist1d")),
    Row("simclr_mnist1d_linear", "SimCLR, MNIST-1D (linear)", "linear_top1", 5,
        ("simclr_mnist1d", "regret_simclr_mnist1d")),
    Row("simclr_digits_e20", "SimCLR, digits, 20 epochs (kNN)", "knn_top1", 5,
        ("simclr_digits_grid", "regret_simclr_digits_grid"), screening_seeds=5),
    Row("simclr_digits_e100", "SimCLR, digits, 100 epochs (kNN)", "knn_top1", 5,
        ("simclr_digits_grid_e100", "regret_simclr_digits_grid_e100")),
    Row("dcrec_ml100k", "DCRec, ML-100K, 1 epoch (NDCG@10)", "ndcg@10", 5,
        ("dcrec_ml100k_tau0.1", "regret_dcrec_ml100k"), unit=0.005),
    Row("msc_digits", "MSC, digits (ROC-AUC)", "roc_auc", 3, ("regret_msc_digits",)),
    Row("supcon_mnist1d", "SupCon L_out, MNIST-1D (kNN)", "knn_top1", 5,
        ("supcon_mnist1d", "regret_supcon_mnist1d")),
    Row("supcon_digits", "SupCon L_out, digits (kNN)", "knn_top1", 5,
        ("supcon_digits", "regret_supcon_digits"), screening_seeds=5),
    Row("ntxent_mnist1d", "supervised NT-Xent, MNIST-1D (kNN)", "knn_top1", 5,
        ("supcon_mnist1d_ntxent", "regret_supcon_mnist1d_ntxent")),
    Row("ntxent_digits", "supervised NT-Xent, digits (kNN)", "knn_top1", 5,
        ("supcon_digits_ntxent", "regret_supcon_digits_ntxent")),
    Row("retrieval_tutorial", "two-tower, TFRS tutorial, user → movie (top-100)", "top@100", 10,
        ("retrieval_ml100k", "regret_retrieval_ml100k"), screening_seeds=10),
    Row("retrieval_tutorial_clip", "two-tower, TFRS tutorial, CLIP's loss (top-100)", "top@100",
        10, ("retrieval_ml100k", "regret_retrieval_ml100k_clip"), prefix="clip:",
        screening_seeds=10),
    Row("retrieval_features", "two-tower, feature towers, user → movie (top-100)", "top@100", 10,
        ("retrieval_ml100k_features", "regret_retrieval_ml100k_features"), screening_seeds=10),
    Row("retrieval_features_clip", "two-tower, feature towers, CLIP's loss (top-100)", "top@100",
        10, ("retrieval_ml100k_features", "regret_retrieval_ml100k_features_clip_grid",
             "regret_retrieval_ml100k_features_clip"), prefix="clip:", screening_seeds=10,
        grid_tables=2),
)


# --- reading the runs ---------------------------------------------------------------------


def read_table(name: str, results: str = RESULTS) -> list[dict] | None:
  """The rows of `results/NAME.csv` (None when it is not committed)."""
  path = os.path.join(results, name + ".csv")
  return (tables.typed(tables.read_csv(path, columns=("spec", "seed")))
          if os.path.exists(path) else None)


def runs_of(rows: Sequence[dict], metric: str, prefix: str) -> dict[str, dict[int, float]]:
  """`{candidate spec: {seed: metric}}` of one table's rows whose loss is `prefix + spec`; a
  run's several rows (MSC's normal classes) are averaged."""
  values = collections.defaultdict(lambda: collections.defaultdict(list))
  for row in rows:
    loss = str(row["spec"])
    if not loss.startswith(prefix):
      continue
    spec = loss[len(prefix):]
    if ":" in spec.split("=", 1)[0] or "/" in spec or "+" in spec:
      continue  # another family (`clip:` in a one-tower row, `sigmoid/...`, `+logq`)
    value = float(row[metric])
    if not math.isfinite(value):
      raise ValueError(f"{metric} of {loss!r}, seed {row['seed']} is {value}: a run without "
                       "a result cannot be paired.")
    values[spec][int(row["seed"])].append(value)
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


@dataclasses.dataclass
class RowRuns:
  """A row's runs per table (`{table: {spec: {seed: value}}}`, committed tables only) and its
  reference: the best fixed τ of the grid."""
  row: Row
  by_table: dict[str, dict[str, dict[int, float]]]
  reference: str | None
  reference_table: str | None
  grid: dict[str, float]  # fixed τ spec -> mean over the row's seeds

  @classmethod
  def read(cls, row: Row, results: str = RESULTS) -> RowRuns:
    by_table = {}
    for name in row.tables:
      rows = read_table(name, results)
      if rows is not None:
        by_table[name] = runs_of(rows, row.metric, row.prefix)
    grid, home = {}, {}
    for name in row.tables[:row.grid_tables]:
      for spec, seeds in by_table.get(name, {}).items():
        if fixed_tau(spec) is not None and spec not in grid and len(seeds) >= row.seeds:
          grid[spec] = float(np.mean([seeds[s] for s in sorted(seeds)[:row.seeds]]))
          home[spec] = name
    complete = all(name in by_table for name in row.tables[:row.grid_tables])
    reference = max(grid, key=grid.get) if grid and complete else None
    return cls(row, by_table, reference, home.get(reference), grid)

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


def within_noise(cell: Mapping) -> bool:
  """The candidate is ahead of (or level with) the reference, or the paired p > ALPHA."""
  return cell["regret"] <= 0 or not cell["p_value"] <= ALPHA


# --- the study ----------------------------------------------------------------------------


def cells(all_runs: Sequence[RowRuns], *, screening: bool = False) -> list[dict]:
  """Every (row, candidate) cell that has run: over the row's full seeds, or with `screening`
  over the screening rows' screening seeds."""
  out = []
  for runs in all_runs:
    if screening and not runs.row.screening:
      continue
    for candidate in CANDIDATES:
      cell = runs.pair(candidate, seeds=runs.row.screening_seeds if screening else None)
      if cell is not None and (screening or cell["seeds"] == runs.row.seeds):
        out.append(cell)
  return out


def summary(cell_list: Sequence[dict], rows: Sequence[str]) -> list[dict]:
  """Per candidate: rows covered, worst-case regret (and its row), mean regret, rows within
  noise."""
  out = []
  for candidate in CANDIDATES:
    mine = [c for c in cell_list if c["candidate"] == candidate]
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


def goes_on(screen: Sequence[dict], screening_rows: int) -> dict[str, str]:
  """The screening rule of `docs/regret.md` for each new mapping: it goes on to every row if its
  worst-case regret over the screening rows is no larger than free's, or if it is within noise
  on more screening rows than free. Decided only once both have every screening row."""
  by = {s["candidate"]: s for s in screen}
  free = by["free"]
  verdict = {}
  for candidate in NEW_MAPPINGS:
    mine = by[candidate]
    if mine["rows"] < screening_rows or free["rows"] < screening_rows:
      verdict[candidate] = f"pending ({mine['rows']}/{screening_rows} screening rows)"
    elif mine["worst"] <= free["worst"] or mine["within_noise"] > free["within_noise"]:
      verdict[candidate] = "goes on"
    else:
      verdict[candidate] = "stops"
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


def decision(full: Sequence[dict], finalists: Sequence[str]) -> str:
  """The decision rule of `docs/regret.md` over the candidates that have every row; before
  then, the winner if no missing cell can change it (`settled`), else what is still missing."""
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
  ranked = sorted((by[c] for c in finalists), key=lambda s: s["worst"])
  best = ranked[0]
  tied = [s for s in ranked if s["worst"] - best["worst"] < TIE]
  tied.sort(key=lambda s: (-s["within_noise"], s["mean"]))
  return f"`{tied[0]['candidate']}`"


def study(results: str = RESULTS) -> dict:
  """Everything the outputs show, from the committed CSVs under `results`."""
  all_runs = [RowRuns.read(row, results) for row in ROWS]
  full = cells(all_runs)
  screen = cells(all_runs, screening=True)
  screening_rows = [r.key for r in ROWS if r.screening]
  screen_summary = summary(screen, screening_rows)
  verdict = goes_on(screen_summary, len(screening_rows))
  full_summary = summary(full, [r.key for r in ROWS])
  finalists = [c for c in CANDIDATES if c not in NEW_MAPPINGS or verdict[c] == "goes on"]
  pending = [c for c in NEW_MAPPINGS if verdict[c].startswith("pending")]
  return dict(all_runs=all_runs, full=full, screen=screen, screen_summary=screen_summary,
              verdict=verdict, full_summary=full_summary,
              decision=("pending: screening of " + ", ".join(f"`{c}`" for c in pending)
                        if pending else decision(full_summary, finalists)))
