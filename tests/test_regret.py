"""The regret study (`experiments.regret.study`, `.report`) against hand-computed regrets and
the rules of `docs/regret.md`, on small made-up tables; and the committed study against its CSVs."""

import csv
import math
import os

import numpy as np
import pytest
from scipy import stats

from experiments.regret import report, study


def _write(path, rows):
  columns = list(rows[0])
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, columns)
    writer.writeheader()
    writer.writerows(rows)


def _runs(values, metric="acc", **extra):
  """CSV rows from `{loss: [value per seed]}`."""
  return [{"spec": loss, "seed": seed, metric: value, **extra}
          for loss, per_seed in values.items() for seed, value in enumerate(per_seed)]


ROW = study.Row("toy", "toy row", "acc", 4, ("toy", "regret_toy"), screening_seeds=4)


def test_reference_is_the_best_committed_tau_not_a_candidate_tau(tmp_path):
  _write(tmp_path / "toy.csv", _runs({
      "tau=0.1": [0.80, 0.82, 0.81, 0.83], "tau=0.5": [0.70, 0.71, 0.72, 0.69],
      "free": [0.78, 0.80, 0.80, 0.80]}))
  # tau=0.2 is higher, but it is a candidate the study adds, not the committed grid.
  _write(tmp_path / "regret_toy.csv", _runs({
      "tau=0.1": [0.80, 0.82, 0.81, 0.83], "tau=0.2": [0.90, 0.90, 0.90, 0.90],
      "free_n": [0.81, 0.81, 0.82, 0.84]}))
  runs = study.RowRuns.read(ROW, str(tmp_path))
  assert runs.reference == "tau=0.1" and runs.reference_table == "toy"
  assert runs.grid == pytest.approx({"tau=0.1": 0.815, "tau=0.5": 0.705})
  cell = runs.pair("tau=0.2")
  assert cell["regret"] == pytest.approx(-8.5) and cell["seeds_won"] == 4
  assert runs.reruns() == {"regret_toy": 0.0}


def test_regret_is_paired_by_seed_in_points_with_scipys_paired_test(tmp_path):
  reference = np.array([0.80, 0.82, 0.81, 0.83])
  free = np.array([0.78, 0.80, 0.82, 0.80])
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": list(reference), "free": list(free)}))
  cell = study.RowRuns.read(ROW, str(tmp_path)).pair("free")
  diffs = 100 * (reference - free)
  assert cell["regret"] == pytest.approx(diffs.mean())
  assert cell["sem"] == pytest.approx(diffs.std(ddof=1) / 2)
  assert cell["p_value"] == pytest.approx(stats.ttest_rel(reference, free).pvalue)
  assert cell["seeds_won"] == 1  # seed 2, where free is ahead
  assert cell["pairs"] == "same sweep" and cell["table"] == "toy"


def test_a_candidate_pairs_with_the_reference_rerun_in_its_own_sweep(tmp_path):
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": [0.80, 0.80, 0.80, 0.80]}))
  _write(tmp_path / "regret_toy.csv", _runs({
      "tau=0.1": [0.70, 0.70, 0.70, 0.70], "free_n": [0.71, 0.69, 0.72, 0.70]}))
  cell = study.RowRuns.read(ROW, str(tmp_path)).pair("free_n")
  assert cell["pairs"] == "same sweep" and cell["table"] == "regret_toy"
  assert cell["regret"] == pytest.approx(-0.5)


def test_without_the_reference_in_its_sweep_a_candidate_pairs_across_sweeps(tmp_path):
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": [0.80, 0.80, 0.80, 0.80]}))
  _write(tmp_path / "regret_toy.csv", _runs({"free_n": [0.70, 0.70, 0.70, 0.70]}))
  cell = study.RowRuns.read(ROW, str(tmp_path)).pair("free_n")
  assert cell["pairs"] == "across sweeps" and cell["reference_table"] == "toy"
  assert cell["regret"] == pytest.approx(10.0) and cell["p_value"] == 0.0


def test_unit_and_averaging_over_a_runs_rows(tmp_path):
  row = study.Row("msc", "msc", "roc_auc", 2, ("msc",), unit=0.005)
  rows = []
  for loss, by_seed in {"tau=0.1": [(0.90, 0.94), (0.91, 0.95)],
                        "free": [(0.90, 0.92), (0.93, 0.92)]}.items():
    for seed, classes in enumerate(by_seed):
      rows += [{"spec": loss, "seed": seed, "normal_class": k, "roc_auc": v}
               for k, v in enumerate(classes)]
  _write(tmp_path / "msc.csv", rows)
  cell = study.RowRuns.read(row, str(tmp_path)).pair("free")
  # seed 0: 0.92 - 0.91 = 0.01 = 2 units; seed 1: 0.93 - 0.925 = 1 unit.
  assert cell["regret"] == pytest.approx(1.5)


def test_other_families_stay_out_of_a_row(tmp_path):
  _write(tmp_path / "toy.csv", _runs({
      "tau=0.1": [0.8] * 4, "clip:tau=0.1": [0.9] * 4, "free+logq": [0.95] * 4,
      "sigmoid/learnable=0.1/learn_b=siglip": [0.99] * 4, "clip:free": [0.7] * 4}))
  one_tower = study.RowRuns.read(ROW, str(tmp_path))
  assert set(one_tower.by_table["toy"]) == {"tau=0.1"}
  clip = study.RowRuns.read(study.Row("c", "c", "acc", 4, ("toy",), prefix="clip:"),
                             str(tmp_path))
  assert set(clip.by_table["toy"]) == {"tau=0.1", "free"}
  assert clip.pair("free")["regret"] == pytest.approx(20.0)


def test_a_run_without_a_result_is_refused(tmp_path):
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": [0.8, float("nan"), 0.8, 0.8]}))
  with pytest.raises(ValueError, match="seed 1 is nan"):
    study.RowRuns.read(ROW, str(tmp_path))


def _summary(candidate, worst, within, rows=2, mean=0.0):
  return {"candidate": candidate, "rows": rows, "of_rows": 2, "worst": worst,
          "worst_row": "", "mean": mean, "within_noise": within}


def test_screening_rule():
  screen = [_summary("free", 3.0, 1), _summary("learnable_free=100", 3.0, 0),
            _summary("free_n", 5.0, 2)]
  assert study.goes_on(screen, 2) == {"learnable_free=100": "goes on", "free_n": "goes on"}
  screen = [_summary("free", 3.0, 1), _summary("learnable_free=100", 3.1, 1),
            _summary("free_n", 1.0, 0, rows=1)]
  verdict = study.goes_on(screen, 2)
  assert verdict["learnable_free=100"] == "stops"
  assert verdict["free_n"].startswith("pending")


def test_decision_rule_ties_under_half_a_unit():
  full = [_summary("free", 2.0, 1, mean=1.0), _summary("tau=0.1", 1.7, 2, mean=1.5),
          _summary("free_n", 1.0, 0, rows=1)]
  # tau=0.1 and free tie on worst case (0.3 < 0.5): more rows within noise wins.
  assert study.decision(full, ["free", "tau=0.1"]) == "`tau=0.1`"
  full[1]["within_noise"] = 1
  assert study.decision(full, ["free", "tau=0.1"]) == "`free`"  # then the smaller mean
  assert study.decision(full, ["free", "free_n"]).startswith("pending")


def test_decision_settles_when_no_missing_cell_can_change_it():
  # free_n has run 1 of 2 rows: its worst case can only grow from 3.0.
  full = [_summary("free", 2.0, 1), _summary("free_n", 3.0, 2, rows=1)]
  assert study.settled(full, ["free", "free_n"]) == "free"
  assert study.decision(full, ["free", "free_n"]).startswith("`free`, settled")
  full[1]["worst"] = 2.4  # within TIE: the missing row could still tie and then reorder
  assert study.settled(full, ["free", "free_n"]) is None
  assert study.decision(full, ["free", "free_n"]).startswith("pending")
  full[1]["worst"], full[0]["rows"] = 3.0, 1  # nobody has every row: nothing is settled
  assert study.decision(full, ["free", "free_n"]).startswith("pending")
  full[0]["rows"], full[1]["rows"], full[1]["worst"] = 2, 0, math.nan  # a candidate with no row
  assert study.settled(full, ["free", "free_n"]) is None


def test_committed_study_is_what_the_csvs_give():
  assert report.differs() == []


def test_check_names_a_stale_output(tmp_path, monkeypatch):
  monkeypatch.setattr(study, "ROWS", (ROW,))
  monkeypatch.setattr(report, "ROWS", (ROW,))
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": [0.8] * 4, "free": [0.7] * 4}))
  report.write(str(tmp_path))
  assert report.differs(str(tmp_path)) == []
  text = (tmp_path / "regret.md").read_text()
  assert "+10.00" in text and (tmp_path / "regret.png").stat().st_size > 0
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": [0.8] * 4, "free": [0.75] * 4}))
  assert report.differs(str(tmp_path)) == ["regret.md", "regret.csv"]
  assert math.isclose(float(next(csv.DictReader(open(tmp_path / "regret.csv")))["regret"]), 10.0)


def test_readme_shows_the_committed_summary():
  with open(os.path.join(os.path.dirname(study.RESULTS), os.pardir, "README.md")) as f:
    readme = f.read()
  table = "\n".join(report.summary_table(study.study()))
  assert table in readme, "README's regret summary differs from python -m experiments.regret"


def test_no_reference_before_the_whole_grid_is_committed(tmp_path):
  row = study.Row("c", "c", "acc", 4, ("toy", "grid", "regret_toy"), grid_tables=2)
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": [0.8] * 4, "free": [0.7] * 4}))
  assert study.RowRuns.read(row, str(tmp_path)).pair("free") is None
  _write(tmp_path / "grid.csv", _runs({"tau=0.05": [0.9] * 4}))
  runs = study.RowRuns.read(row, str(tmp_path))
  assert runs.reference == "tau=0.05" and runs.pair("free")["pairs"] == "across sweeps"
