"""What `docs/regret.md` fixes before its runs: the candidates of each round, the rows with the
tables that hold their runs, and the sets of rows the summaries and decisions run over.

A row's tables, in the order the study reads them: its **grid** (committed fixed-τ runs; every
one committed before the row has a reference), round 2's **extension** of the grid beyond an
edge (references only, joining the grid as they are committed), then the tables that add
candidates: round 1's (`regret_*`) and round 2's (`regret2_*`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

#: The candidates of round 1: the defaults a user might leave untouched and two derived mappings.
ROUND_1_CANDIDATES = ("free", "tau=0.1", "tau=0.2", "tau=0.5", "tau=1", "learnable=0.07:100",
                      "dynamic=0.1:0.2", "learnable_free=100", "free_n")
#: The candidates of round 2: three scales solved from the batch.
ROUND_2_CANDIDATES = ("calibrated_free", "perplexity_free", "accuracy_free")


@dataclasses.dataclass(frozen=True)
class Round:
  """One round of the study: the candidates it adds (InfoNCE mapping specs,
  `tfcl_jax.losses.from_spec`; a row's `prefix` and `suffix` put them in its loss form) and
  those it screens before they go on to every row (its new mappings)."""
  number: int
  candidates: tuple[str, ...]
  new_mappings: tuple[str, ...]


ROUNDS = (
    Round(1, ROUND_1_CANDIDATES, ("learnable_free=100", "free_n")),
    Round(2, ROUND_2_CANDIDATES, ROUND_2_CANDIDATES),
)
#: Every candidate of every round, in order.
CANDIDATES = tuple(c for r in ROUNDS for c in r.candidates)


def candidates_of(number: int) -> tuple[str, ...]:
  """The candidates of rounds 1 .. `number`."""
  return tuple(c for r in ROUNDS if r.number <= number for c in r.candidates)


@dataclasses.dataclass(frozen=True)
class Row:
  """One benchmark. Its tables hold one CSV line per run with columns `spec`, `seed` and
  `metric` (averaged over a run's other lines, e.g. MSC's classes); a run belongs to the row
  when its spec is `prefix + candidate + suffix` (`clip:`, `+logq`); `unit` is one metric point.

  `round`: the round that added the row; `stands_for`: the round-1 row a logQ row replaces among
  the advised rows; `family`: the row family of the predictions and of the scales' figure.
  """
  key: str
  title: str
  family: str
  metric: str
  seeds: int
  grid: tuple[str, ...]
  runs: tuple[str, ...] = ()
  extension: tuple[str, ...] = ()
  runs_round_2: tuple[str, ...] = ()
  prefix: str = ""
  suffix: str = ""
  unit: float = 0.01
  screening_seeds: int = 0  # > 0: a screening row, over seeds 0 .. screening_seeds - 1
  round: int = 1
  stands_for: str = ""

  @property
  def screening(self) -> bool:
    return self.screening_seeds > 0

  def tables(self, as_of: int = len(ROUNDS)) -> tuple[str, ...]:
    """The tables the study reads as of round `as_of`, grid tables first."""
    if as_of < 2:
      return self.grid + self.runs
    return self.grid + self.extension + self.runs + self.runs_round_2

  def loss(self, candidate: str) -> str:
    """The candidate's spec in this row's loss form."""
    return self.prefix + candidate + self.suffix


def _row(key, title, family, metric, seeds, grid, runs=(), *, round_2=(), **options) -> Row:
  """A round-1 row whose round-2 candidates come in `round_2`."""
  return Row(key, title, family, metric, seeds, grid, runs, runs_round_2=round_2, **options)


_TUTORIAL_GRID = ("regret2_retrieval_ml100k_grid",)
_FEATURES_GRID = ("regret2_retrieval_ml100k_features_grid",)

ROWS = (
    _row("grace_citeseer", "GRACE, CiteSeer (F1-micro)", "GRACE", "f1_micro", 20,
         ("grace_citeseer",), ("regret_grace_citeseer",),
         round_2=("regret2_grace_citeseer", "regret2_grace_citeseer_accuracy"),
         screening_seeds=5),
    _row("grace_cora", "GRACE, Cora (F1-micro)", "GRACE", "f1_micro", 20, ("grace_cora",),
         ("regret_grace_cora",), round_2=("regret2_grace_cora",)),
    _row("simclr_mnist1d_knn", "SimCLR, MNIST-1D (kNN)", "SimCLR-type", "knn_top1", 5,
         ("simclr_mnist1d",), ("regret_simclr_mnist1d",), round_2=("regret2_simclr_mnist1d",)),
    _row("simclr_mnist1d_linear", "SimCLR, MNIST-1D (linear)", "SimCLR-type", "linear_top1", 5,
         ("simclr_mnist1d",), ("regret_simclr_mnist1d",), round_2=("regret2_simclr_mnist1d",)),
    _row("simclr_digits_e20", "SimCLR, digits, 20 epochs (kNN)", "SimCLR-type", "knn_top1", 5,
         ("simclr_digits_grid",), ("regret_simclr_digits_grid",),
         round_2=("regret2_simclr_digits_grid",), screening_seeds=5),
    _row("simclr_digits_e100", "SimCLR, digits, 100 epochs (kNN)", "SimCLR-type", "knn_top1", 5,
         ("simclr_digits_grid_e100",), ("regret_simclr_digits_grid_e100",),
         round_2=("regret2_simclr_digits_grid_e100",)),
    _row("dcrec_ml100k", "DCRec, ML-100K, 1 epoch (NDCG@10)", "DCRec", "ndcg@10", 5,
         ("dcrec_ml100k_tau0.1",), ("regret_dcrec_ml100k",), round_2=("regret2_dcrec_ml100k",),
         unit=0.005),
    _row("msc_digits", "MSC, digits (ROC-AUC)", "MSC", "roc_auc", 3, ("regret_msc_digits",),
         round_2=("regret2_msc_digits",)),
    _row("supcon_mnist1d", "SupCon L_out, MNIST-1D (kNN)", "SimCLR-type", "knn_top1", 5,
         ("supcon_mnist1d",), ("regret_supcon_mnist1d",), round_2=("regret2_supcon_mnist1d",)),
    _row("supcon_digits", "SupCon L_out, digits (kNN)", "SimCLR-type", "knn_top1", 5,
         ("supcon_digits",), ("regret_supcon_digits",), round_2=("regret2_supcon_digits",),
         screening_seeds=5),
    _row("ntxent_mnist1d", "supervised NT-Xent, MNIST-1D (kNN)", "SimCLR-type", "knn_top1", 5,
         ("supcon_mnist1d_ntxent",), ("regret_supcon_mnist1d_ntxent",),
         round_2=("regret2_supcon_mnist1d_ntxent",)),
    _row("ntxent_digits", "supervised NT-Xent, digits (kNN)", "SimCLR-type", "knn_top1", 5,
         ("supcon_digits_ntxent",), ("regret_supcon_digits_ntxent",),
         round_2=("regret2_supcon_digits_ntxent",)),
    _row("retrieval_tutorial", "two-tower, TFRS tutorial, user → movie (top-100)", "tutorial",
         "top@100", 10, ("retrieval_ml100k",), ("regret_retrieval_ml100k",),
         round_2=("regret2_retrieval_ml100k",), extension=_TUTORIAL_GRID, screening_seeds=10),
    _row("retrieval_tutorial_clip", "two-tower, TFRS tutorial, CLIP's loss (top-100)", "tutorial",
         "top@100", 10, ("retrieval_ml100k",), ("regret_retrieval_ml100k_clip",),
         round_2=("regret2_retrieval_ml100k_clip",), extension=_TUTORIAL_GRID, prefix="clip:",
         screening_seeds=10),
    _row("retrieval_features", "two-tower, feature towers, user → movie (top-100)",
         "feature towers", "top@100", 10, ("retrieval_ml100k_features",),
         ("regret_retrieval_ml100k_features",), round_2=("regret2_retrieval_ml100k_features",),
         extension=_FEATURES_GRID, screening_seeds=10),
    # The feature towers' CLIP row: its committed table has one CLIP τ; the grid added to it
    # comes first (round 1 ran it like a candidate).
    _row("retrieval_features_clip", "two-tower, feature towers, CLIP's loss (top-100)",
         "feature towers", "top@100", 10,
         ("retrieval_ml100k_features", "regret_retrieval_ml100k_features_clip_grid"),
         ("regret_retrieval_ml100k_features_clip",),
         round_2=("regret2_retrieval_ml100k_features_clip",), extension=_FEATURES_GRID,
         prefix="clip:", screening_seeds=10),
)


def _logq_row(key: str, stands_for: Row, table: str) -> Row:
  """Round 2's logQ row of an uncorrected two-tower row: one sweep holds its τ grid and round
  1's candidates (`<candidate>+logq`); `<table>_grid` extends the grid beyond an edge and
  `<table>_new` holds round 2's candidates."""
  return Row(key, stands_for.title.replace(" (top-100)", ", logQ (top-100)"), "logQ",
             stands_for.metric, stands_for.seeds, (table,), extension=(table + "_grid",),
             runs_round_2=(table + "_new",),
             prefix=stands_for.prefix, suffix="+logq", screening_seeds=10, round=2,
             stands_for=stands_for.key)


_BY_KEY = {row.key: row for row in ROWS}
ROWS += (
    _logq_row("retrieval_tutorial_logq", _BY_KEY["retrieval_tutorial"],
              "regret2_retrieval_ml100k_logq"),
    _logq_row("retrieval_tutorial_clip_logq", _BY_KEY["retrieval_tutorial_clip"],
              "regret2_retrieval_ml100k_clip_logq"),
    _logq_row("retrieval_features_logq", _BY_KEY["retrieval_features"],
              "regret2_retrieval_ml100k_features_logq"),
    _logq_row("retrieval_features_clip_logq", _BY_KEY["retrieval_features_clip"],
              "regret2_retrieval_ml100k_features_clip_logq"),
)


@dataclasses.dataclass(frozen=True)
class RowSet:
  """Rows a summary runs over; `decides`: the round whose decision rule picks a default over
  them (its candidates, those screened out left aside), 0 for none."""
  key: str
  title: str
  rows: tuple[str, ...]
  decides: int = 0

  @property
  def short(self) -> str:
    """The set's name in a sentence: `round 1's 16 rows`, `the 16 advised rows`.

    Examples:
      >>> from experiments.regret.rows import RowSet
      >>> RowSet("advised", "the 2 advised rows (...)", ("a", "b"), decides=2).short
      'the 2 advised rows'
    """
    n = len(self.rows)
    return {"all": f"all {n} rows", "round_1": f"round 1's {n} rows",
            "advised": f"the {n} advised rows"}.get(self.key, self.title)


def advised(rows: Sequence[Row], replaced: Callable[[Row], bool] = lambda row: True
            ) -> tuple[str, ...]:
  """Round 1's rows with each uncorrected two-tower row that `replaced` selects replaced by its
  logQ row, in its place."""
  logq = {row.stands_for: row.key for row in rows if row.stands_for}
  return tuple(logq[row.key] if row.key in logq and replaced(row) else row.key
               for row in rows if row.round == 1)


def row_sets(rows: Sequence[Row]) -> tuple[RowSet, ...]:
  """The summary's sets of rows (`docs/regret.md`, "The summary"): every row, round 1's, the
  advised rows (where round 2's rule decides) and the variant that advises the tutorial only."""
  first = tuple(row.key for row in rows if row.round == 1)
  every = advised(rows)
  tutorial = advised(rows, lambda row: row.family == "tutorial")
  return (
      RowSet("all", f"all {len(rows)} rows", tuple(row.key for row in rows)),
      RowSet("round_1", f"round 1's {len(first)} rows", first, decides=1),
      RowSet("advised", f"the {len(every)} advised rows (round 1's, each uncorrected two-tower "
             "row replaced by its logQ row)", every, decides=2),
      RowSet("advised_tutorial", f"the {len(tutorial)} rows advised in the tutorial only "
             "(round 1's, the two tutorial rows replaced by their logQ rows)", tutorial),
  )
