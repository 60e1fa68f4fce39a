"""The regret study (`experiments.regret`) against hand-computed regrets and the rules of
`docs/regret.md`, on small made-up tables; and the committed study against its CSVs."""

import csv
import math

import numpy as np
import pytest
from scipy import stats

from experiments.regret import report, rows, runs, scales, study, traces
from tests.helpers.csv_files import write_csv as _write


def _runs(values, metric="acc", **extra):
  """CSV lines from `{loss: [value per seed]}`."""
  return [{"spec": loss, "seed": seed, metric: value, **extra}
          for loss, per_seed in values.items() for seed, value in enumerate(per_seed)]


ROW = rows.Row("toy", "toy row", "toy", "acc", 4, ("toy",), ("regret_toy",), screening_seeds=4)


def test_reference_is_the_best_committed_tau_not_a_candidate_tau(tmp_path):
  _write(tmp_path / "toy.csv", _runs({
      "tau=0.1": [0.80, 0.82, 0.81, 0.83], "tau=0.5": [0.70, 0.71, 0.72, 0.69],
      "free": [0.78, 0.80, 0.80, 0.80]}))
  # tau=0.2 is higher, but it is a candidate the study adds, not the committed grid.
  _write(tmp_path / "regret_toy.csv", _runs({
      "tau=0.1": [0.80, 0.82, 0.81, 0.83], "tau=0.2": [0.90, 0.90, 0.90, 0.90],
      "free_n": [0.81, 0.81, 0.82, 0.84]}))
  row_runs = runs.RowRuns.read(ROW, str(tmp_path))
  assert row_runs.reference == "tau=0.1" and row_runs.reference_table == "toy"
  assert row_runs.grid == pytest.approx({"tau=0.1": 0.815, "tau=0.5": 0.705})
  cell = row_runs.pair("tau=0.2")
  assert cell["regret"] == pytest.approx(-8.5) and cell["seeds_won"] == 4
  assert row_runs.reruns() == {"regret_toy": 0.0}


def test_regret_is_paired_by_seed_in_points_with_scipys_paired_test(tmp_path):
  reference = np.array([0.80, 0.82, 0.81, 0.83])
  free = np.array([0.78, 0.80, 0.82, 0.80])
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": list(reference), "free": list(free)}))
  cell = runs.RowRuns.read(ROW, str(tmp_path)).pair("free")
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
  cell = runs.RowRuns.read(ROW, str(tmp_path)).pair("free_n")
  assert cell["pairs"] == "same sweep" and cell["table"] == "regret_toy"
  assert cell["regret"] == pytest.approx(-0.5)


def test_without_the_reference_in_its_sweep_a_candidate_pairs_across_sweeps(tmp_path):
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": [0.80, 0.80, 0.80, 0.80]}))
  _write(tmp_path / "regret_toy.csv", _runs({"free_n": [0.70, 0.70, 0.70, 0.70]}))
  cell = runs.RowRuns.read(ROW, str(tmp_path)).pair("free_n")
  assert cell["pairs"] == "across sweeps" and cell["reference_table"] == "toy"
  assert cell["regret"] == pytest.approx(10.0) and cell["p_value"] == 0.0


def test_unit_and_averaging_over_a_runs_lines(tmp_path):
  row = rows.Row("msc", "msc", "MSC", "roc_auc", 2, ("msc",), unit=0.005)
  lines = []
  for loss, by_seed in {"tau=0.1": [(0.90, 0.94), (0.91, 0.95)],
                        "free": [(0.90, 0.92), (0.93, 0.92)]}.items():
    for seed, classes in enumerate(by_seed):
      lines += [{"spec": loss, "seed": seed, "normal_class": k, "roc_auc": v}
                for k, v in enumerate(classes)]
  _write(tmp_path / "msc.csv", lines)
  cell = runs.RowRuns.read(row, str(tmp_path)).pair("free")
  # seed 0: 0.92 - 0.91 = 0.01 = 2 units; seed 1: 0.93 - 0.925 = 1 unit.
  assert cell["regret"] == pytest.approx(1.5)


def test_other_loss_forms_stay_out_of_a_row(tmp_path):
  _write(tmp_path / "toy.csv", _runs({
      "tau=0.1": [0.8] * 4, "clip:tau=0.1": [0.9] * 4, "free+logq": [0.95] * 4,
      "sigmoid/learnable=0.1/learn_b=siglip": [0.99] * 4, "clip:free": [0.7] * 4}))
  one_tower = runs.RowRuns.read(ROW, str(tmp_path))
  assert set(one_tower.by_table["toy"]) == {"tau=0.1"}
  clip = runs.RowRuns.read(rows.Row("c", "c", "f", "acc", 4, ("toy",), prefix="clip:"),
                           str(tmp_path))
  assert set(clip.by_table["toy"]) == {"tau=0.1", "free"}
  assert clip.pair("free")["regret"] == pytest.approx(20.0)


def test_a_suffix_row_reads_its_loss_form_only(tmp_path):
  _write(tmp_path / "q.csv", _runs({
      "tau=0.1+logq": [0.40, 0.42, 0.41, 0.43], "tau=0.5+logq": [0.30] * 4,
      "free+logq": [0.38, 0.40, 0.40, 0.40], "learnable=0.07:100+logq": [0.45] * 4,
      "tau=0.1": [0.99] * 4, "free": [0.99] * 4, "clip:free+logq": [0.10] * 4,
      "clip:tau=0.1+logq": [0.35] * 4, "dot+logq+x": [0.1] * 4}))
  logq = rows.Row("q", "q", "logQ", "acc", 4, ("q",), suffix="+logq", round=2)
  row_runs = runs.RowRuns.read(logq, str(tmp_path))
  assert set(row_runs.by_table["q"]) == {"tau=0.1", "tau=0.5", "free", "learnable=0.07:100"}
  assert row_runs.reference == "tau=0.1" and logq.loss("free") == "free+logq"
  assert row_runs.pair("free")["regret"] == pytest.approx(100 * (0.415 - 0.395))
  assert row_runs.pair("learnable=0.07:100")["regret"] == pytest.approx(-3.5)
  clip = rows.Row("c", "c", "logQ", "acc", 4, ("q",), prefix="clip:", suffix="+logq")
  clip_runs = runs.RowRuns.read(clip, str(tmp_path))
  assert set(clip_runs.by_table["q"]) == {"tau=0.1", "free"}
  assert clip_runs.pair("free")["regret"] == pytest.approx(25.0)


def test_a_run_without_a_result_is_refused(tmp_path):
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": [0.8, float("nan"), 0.8, 0.8]}))
  with pytest.raises(ValueError, match="seed 1 is nan"):
    runs.RowRuns.read(ROW, str(tmp_path))


def test_no_reference_before_the_whole_grid_is_committed(tmp_path):
  row = rows.Row("c", "c", "f", "acc", 4, ("toy", "grid"), ("regret_toy",))
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": [0.8] * 4, "free": [0.7] * 4}))
  assert runs.RowRuns.read(row, str(tmp_path)).pair("free") is None
  _write(tmp_path / "grid.csv", _runs({"tau=0.05": [0.9] * 4}))
  row_runs = runs.RowRuns.read(row, str(tmp_path))
  assert row_runs.reference == "tau=0.05" and row_runs.pair("free")["pairs"] == "across sweeps"


@pytest.mark.parametrize("tau, up, following", [
    (2.0, True, 5.0), (5.0, True, 10.0), (0.05, False, 0.02), (0.01, False, 0.005),
    (0.25, True, 0.5), (0.25, False, 0.2), (1.0, False, 0.5), (50.0, True, 100.0)])
def test_next_tau_follows_one_two_five(tau, up, following):
  assert runs.next_tau(tau, up=up) == following


def test_grid_extension_moves_the_reference_and_the_edge_report(tmp_path):
  row = rows.Row("t", "t", "tutorial", "acc", 4, ("toy",), extension=("toy_grid",))
  _write(tmp_path / "toy.csv", _runs({
      "tau=0.5": [0.20] * 4, "tau=1": [0.22] * 4, "tau=2": [0.24, 0.25, 0.24, 0.25],
      "free": [0.21] * 4}))
  before = runs.RowRuns.read(row, str(tmp_path))
  assert before.reference == "tau=2" and before.edge() == "top"
  assert "top edge" in report.where(before) and "τ = 5 next" in report.where(before)
  assert "`toy_grid.csv`" in report.where(before)
  assert before.pair("free")["regret"] == pytest.approx(3.5)
  # τ = 5 beats τ = 2: the reference moves there and is still at the top edge; τ = 10 with
  # fewer seeds than the row's does not join the grid yet.
  _write(tmp_path / "toy_grid.csv", _runs({
      "tau=5": [0.26, 0.27, 0.26, 0.27], "tau=10": [0.30, 0.30]}))
  moved = runs.RowRuns.read(row, str(tmp_path))
  assert set(moved.grid) == {"tau=0.5", "tau=1", "tau=2", "tau=5"}
  assert moved.reference == "tau=5" and moved.reference_table == "toy_grid"
  assert moved.edge() == "top" and "τ = 10 next" in report.where(moved)
  cell = moved.pair("free")
  assert cell["regret"] == pytest.approx(5.5) and cell["pairs"] == "across sweeps"
  assert cell["reference_table"] == "toy_grid"
  # As of round 1 the extension is not read: round 1's reference stays.
  assert runs.RowRuns.read(row, str(tmp_path), as_of=1).reference == "tau=2"
  _write(tmp_path / "toy_grid.csv", _runs({
      "tau=5": [0.26, 0.27, 0.26, 0.27], "tau=10": [0.25] * 4}))
  inside = runs.RowRuns.read(row, str(tmp_path))
  assert inside.reference == "tau=5" and inside.edge() == "inside"
  assert report.where(inside) == "inside the grid"
  unextended = rows.Row("g", "g", "GRACE", "acc", 4, ("toy",))
  assert "not extended" in report.where(runs.RowRuns.read(unextended, str(tmp_path)))


def _summary(candidate, worst, within, rows_run=2, mean=0.0, of_rows=2):
  return {"candidate": candidate, "rows": rows_run, "of_rows": of_rows, "worst": worst,
          "worst_row": "", "mean": mean, "within_noise": within}


def test_screening_rule():
  new = ("learnable_free=100", "free_n")
  screen = [_summary("free", 3.0, 1), _summary("learnable_free=100", 3.0, 0),
            _summary("free_n", 5.0, 2)]
  assert study.goes_on(screen, new, 2) == {"learnable_free=100": "goes on", "free_n": "goes on"}
  screen = [_summary("free", 3.0, 1), _summary("learnable_free=100", 3.1, 1),
            _summary("free_n", 1.0, 0, rows_run=1)]
  verdict = study.goes_on(screen, new, 2)
  assert verdict["learnable_free=100"] == "stops"
  assert verdict["free_n"].startswith("pending")
  # Settled before every row: within noise on more rows than free can reach (free misses one),
  # or unable to reach free's count and behind free's final worst case.
  # (worst, within noise, rows run) of free, learnable_free and free_n over 4 screening rows.
  cases = [
      (((3.0, 1, 3), (9.0, 3, 3), (9.0, 2, 3)),
       ("goes on (settled with 3/4 screening rows, free 3/4)",
        "pending (3/4 screening rows, free 3/4)")),
      (((3.0, 2, 4), (4.0, 1, 3), (2.0, 0, 2)),
       ("stops (settled with 3/4 screening rows, free 4/4)",
        "pending (2/4 screening rows, free 4/4)"))]
  for summaries, expected in cases:
    screen = [_summary(name, worst, within, rows_run=run, of_rows=4) for name, (worst, within, run)
              in zip(("free", *new), summaries, strict=True)]
    assert tuple(study.goes_on(screen, new, 4)[name] for name in new) == expected


def test_decision_rule_ties_under_half_a_unit():
  full = [_summary("free", 2.0, 1, mean=1.0), _summary("tau=0.1", 1.7, 2, mean=1.5),
          _summary("free_n", 1.0, 0, rows_run=1)]
  # tau=0.1 and free tie on worst case (0.3 < 0.5): more rows within noise wins.
  assert study.decision(full, ["free", "tau=0.1"]) == "`tau=0.1`"
  full[1]["within_noise"] = 1
  assert study.decision(full, ["free", "tau=0.1"]) == "`free`"  # then the smaller mean
  assert study.decision(full, ["free", "free_n"]).startswith("pending")


def test_decision_settles_when_no_missing_cell_can_change_it():
  # free_n has run 1 of 2 rows: its worst case can only grow from 3.0.
  full = [_summary("free", 2.0, 1), _summary("free_n", 3.0, 2, rows_run=1)]
  assert study.settled(full, ["free", "free_n"]) == "free"
  assert study.decision(full, ["free", "free_n"]).startswith("`free`, settled")
  full[1]["worst"] = 2.4  # within TIE: the missing row could still tie and then reorder
  assert study.settled(full, ["free", "free_n"]) is None
  assert study.decision(full, ["free", "free_n"]).startswith("pending")
  full[1]["worst"], full[0]["rows"] = 3.0, 1  # nobody has every row: nothing is settled
  assert study.decision(full, ["free", "free_n"]).startswith("pending")
  full[0]["rows"], full[1]["rows"], full[1]["worst"] = 2, 0, math.nan  # a candidate with no row
  assert study.settled(full, ["free", "free_n"]) is None


def _screening(number, verdict):
  return study.Screening(rows.ROUNDS[number - 1], (), [], [], verdict)


def test_each_round_decides_among_its_candidates_that_went_on():
  worst = {"free": 8.0, "tau=0.1": 9.0, "tau=0.2": 2.3, "tau=0.5": 9.0, "tau=1": 9.0,
           "learnable=0.07:100": 9.0, "dynamic=0.1:0.2": 9.0, "learnable_free=100": 6.0,
           "free_n": 0.5, "calibrated_free": 2.0, "perplexity_free": 0.1, "accuracy_free": 7.0}
  within = {"tau=0.2": 9, "calibrated_free": 5}
  by_candidate = [_summary(c, w, within.get(c, 3), rows_run=16, of_rows=16)
                  for c, w in worst.items()]
  screenings = [_screening(1, {"learnable_free=100": "goes on", "free_n": "stops"}),
                _screening(2, {"calibrated_free": "goes on", "perplexity_free": "stops",
                               "accuracy_free": "goes on"})]
  _, first, advised, _ = rows.row_sets(rows.ROWS)
  # Round 1 picks among its own, free_n (0.5) stopped: tau=0.2 (2.3). Round 2 among all that
  # went on, perplexity_free (0.1) stopped: calibrated_free (2.0) and tau=0.2 (2.3) tie, and
  # tau=0.2 has more rows within noise, then fewer.
  assert study.decide(first, by_candidate, screenings) == "`tau=0.2`"
  assert study.decide(advised, by_candidate, screenings) == "`tau=0.2`"
  within["calibrated_free"] = 10
  by_candidate = [_summary(c, w, within.get(c, 3), rows_run=16, of_rows=16)
                  for c, w in worst.items()]
  assert study.decide(advised, by_candidate, screenings) == "`calibrated_free`"
  screenings[1].verdict["accuracy_free"] = "pending (3/11 screening rows, free 11/11)"
  assert study.decide(advised, by_candidate, screenings) == (
      "pending: screening of `accuracy_free`")
  assert study.decide(first, by_candidate, screenings) == "`tau=0.2`"


def test_the_sets_of_rows_of_the_summary():
  sets = {s.key: s for s in rows.row_sets(rows.ROWS)}
  first = [r.key for r in rows.ROWS if r.round == 1]
  assert len(sets["all"].rows) == 20 and len(first) == 16 and sets["round_1"].rows == tuple(first)
  advised = [k + "_logq" if k.startswith(("retrieval_tutorial", "retrieval_features")) else k
             for k in first]
  assert sets["advised"].rows == tuple(advised)
  tutorial = [k + "_logq" if k.startswith("retrieval_tutorial") else k for k in first]
  assert sets["advised_tutorial"].rows == tuple(tutorial)
  assert (sets["round_1"].decides, sets["advised"].decides) == (1, 2)
  assert not sets["all"].decides and not sets["advised_tutorial"].decides


def _toy_design():
  """Rows A, T (a tutorial row), F (a feature row) of round 1; T's and F's logQ rows of round 2;
  A, T and the logQ row TQ screen."""
  a = rows.Row("A", "A", "GRACE", "acc", 4, ("a",), screening_seeds=2, extension=("a_grid",))
  t = rows.Row("T", "T", "tutorial", "acc", 4, ("t",), screening_seeds=4)
  f = rows.Row("F", "F", "feature towers", "acc", 4, ("f",))
  tq = rows.Row("TQ", "TQ", "logQ", "acc", 4, ("tq",), suffix="+logq", screening_seeds=4,
                round=2, stands_for="T")
  fq = rows.Row("FQ", "FQ", "logQ", "acc", 4, ("fq",), suffix="+logq", round=2,
                stands_for="F")
  return (a, t, f, tq, fq)


def _regrets(tmp_path, name, regrets, suffix=""):
  """A table with the reference tau=0.1 at 0.50 and each candidate `regret` points below."""
  values = {"tau=0.1" + suffix: [0.50] * 4}
  values.update({c + suffix: [0.50 - r / 100] * 4 for c, r in regrets.items()})
  _write(tmp_path / f"{name}.csv", _runs(values))


def test_the_four_summaries_and_the_goals(tmp_path):
  _regrets(tmp_path, "a", {"free": 1.0, "tau=1": 0.5, "tau=0.5": 0.2})
  _regrets(tmp_path, "t", {"free": 4.0, "tau=1": 0.5})
  _regrets(tmp_path, "f", {"free": 2.0, "tau=1": 0.5})
  _regrets(tmp_path, "tq", {"free": -1.0, "tau=1": 0.5}, suffix="+logq")
  _regrets(tmp_path, "fq", {"free": 3.0, "tau=1": 0.5}, suffix="+logq")
  result = study.study(str(tmp_path), _toy_design())
  sets = {s.rows.key: s for s in result.sets}
  assert [s.rows.rows for s in result.sets] == [
      ("A", "T", "F", "TQ", "FQ"), ("A", "T", "F"), ("A", "TQ", "FQ"), ("A", "TQ", "F")]
  expected = {"all": (4.0, "T", 9 / 5, 1), "round_1": (4.0, "T", 7 / 3, 0),
              "advised": (3.0, "FQ", 1.0, 1), "advised_tutorial": (2.0, "F", 2 / 3, 1)}
  for key, (worst, row, mean, within) in expected.items():
    free = next(s for s in sets[key].summary if s["candidate"] == "free")
    assert (free["worst"], free["worst_row"], free["within_noise"]) == (
        pytest.approx(worst), row, within)
    assert free["mean"] == pytest.approx(mean)
    assert free["rows"] == free["of_rows"] == len(sets[key].rows.rows)
  # tau=0.1 (the reference) and tau=1 reach 1 on every set; tau=0.5 has run A only.
  assert study.goal(sets["all"].summary, 1.0).startswith("`tau=0.1`, `tau=1`; still open: ")
  assert "`tau=0.5` (1/5 rows, +0.20 so far)" in study.goal(sets["all"].summary, 1.0)
  assert "`calibrated_free` (0/5 rows)" in study.goal(sets["all"].summary, 3.0)
  tau_05 = next(s for s in sets["advised"].summary if s["candidate"] == "tau=0.5")
  assert (tau_05["rows"], tau_05["of_rows"]) == (1, 3)
  assert sets["advised"].decision == ("pending: screening of `learnable_free=100`, `free_n`, "
                                    "`calibrated_free`, `perplexity_free`, `accuracy_free`")


def test_round_2_screens_on_its_own_rows_and_leaves_round_1_as_it_was(tmp_path):
  # A screens on seeds 0-1: seeds 2-3 (far behind for every candidate) stay out.
  _write(tmp_path / "a.csv", _runs({
      "tau=0.1": [0.50] * 4, "free": [0.49, 0.49, 0.0, 0.0],
      "learnable_free=100": [0.47, 0.47, 0.0, 0.0], "calibrated_free": [0.48, 0.48, 0.0, 0.0],
      "perplexity_free": [0.495, 0.495, 0.0, 0.0]}))
  _regrets(tmp_path, "t", {"free": 2.0, "learnable_free=100": 1.0, "free_n": 9.0})
  _regrets(tmp_path, "tq", {"free": 3.0, "calibrated_free": 1.0, "perplexity_free": 4.0},
           suffix="+logq")
  first, second = study.study(str(tmp_path), _toy_design()).screenings
  assert first.rows == ("A", "T") and second.rows == ("A", "T", "TQ")
  # Round 1 over A and T: learnable_free's worst case 3 (A) is above free's 2 (T) and neither
  # is within noise anywhere: it stops; free_n has not run A.
  assert first.verdict["learnable_free=100"] == "stops"
  assert first.verdict["free_n"].startswith("pending (1/2 screening rows")
  # Round 2 over A, T and TQ: free's worst case is TQ's 3; the new ones have not run T.
  by = {s["candidate"]: s for s in second.summary}
  assert (by["free"]["worst"], by["free"]["worst_row"]) == (pytest.approx(3.0), "TQ")
  assert (by["calibrated_free"]["rows"], by["calibrated_free"]["worst"]) == (2, pytest.approx(2))
  assert set(second.verdict) == set(rows.ROUND_2_CANDIDATES)
  assert all(v.startswith("pending (") for v in second.verdict.values())
  _regrets(tmp_path, "t", {"free": 2.0, "learnable_free=100": 1.0, "free_n": 9.0,
                           "calibrated_free": 2.5, "perplexity_free": 0.0, "accuracy_free": 0.0})
  _write(tmp_path / "tq.csv", _runs({
      "tau=0.1+logq": [0.50] * 4, "free+logq": [0.47] * 4, "calibrated_free+logq": [0.49] * 4,
      "perplexity_free+logq": [0.46] * 4, "accuracy_free+logq": [0.52, 0.40, 0.52, 0.40]}))
  # τ = 0.05 extends A's grid and is its reference as of round 2 (0.60): A's cells pair
  # against it across sweeps (free 11, calibrated_free 12, perplexity_free 10.5 behind).
  _write(tmp_path / "a_grid.csv", _runs({"tau=0.05": [0.60] * 4}))
  first_again, second = study.study(str(tmp_path), _toy_design()).screenings
  assert first_again.verdict == first.verdict and first_again.summary == first.summary
  by = {s["candidate"]: s for s in second.summary}
  assert (by["free"]["worst"], by["free"]["within_noise"]) == (pytest.approx(11.0), 0)
  assert by["calibrated_free"]["worst"] == pytest.approx(12.0)
  assert (by["perplexity_free"]["worst"], by["perplexity_free"]["within_noise"]) == (
      pytest.approx(10.5), 1)
  # accuracy_free on TQ: regrets -2, 10, -2, 10 (p = 0.33): within noise, as on T (level).
  assert (by["accuracy_free"]["rows"], by["accuracy_free"]["within_noise"]) == (2, 2)
  assert second.verdict["calibrated_free"] == "stops"  # 12 > 11, within noise on 0 rows as free
  assert second.verdict["perplexity_free"] == "goes on"  # 10.5 <= 11
  # accuracy_free has not run A, but is within noise on 2 rows where free, with every row, is
  # on none: whatever A holds, it goes on.
  assert second.verdict["accuracy_free"] == ("goes on (settled with 2/3 screening rows, "
                                             "free 3/3)")


def test_scale_traces_from_each_kind_of_column(tmp_path):
  row = rows.Row("r", "r", "tutorial", "acc", 2, ("r",))
  lines = [
      {"spec": "learnable_free=100", "seed": s, "acc": 0.1, "scale_start": 1.0,
       "scale@1": 0.5 + s, "scale@2": 2.0 + s, "final_t": "", "final_scale": ""}
      for s in range(3)]
  lines += [{"spec": "learnable=0.07:100", "seed": s, "acc": 0.1, "scale_start": "nan",
             "scale@1": "nan", "scale@2": "nan", "final_t": math.log(50.0 * (s + 3)),
             "final_scale": ""} for s in range(2)]
  lines += [{"spec": "calibrated_free", "seed": s, "acc": 0.1, "scale_start": "nan",
             "scale@1": "nan", "scale@2": "nan", "final_t": "", "final_scale": 3.0 + s}
            for s in range(2)]
  lines += [{"spec": "free", "seed": 0, "acc": 0.1, "scale_start": "nan", "scale@1": "nan",
             "scale@2": "nan", "final_t": "", "final_scale": ""}]
  _write(tmp_path / "r.csv", lines)
  found = {t.candidate: t for t in scales.traces([row], str(tmp_path))}
  assert set(found) == {"learnable_free=100", "learnable=0.07:100", "calibrated_free"}
  learnt = found["learnable_free=100"]  # seeds 0 and 1 of the row's 2
  assert learnt.progress == (0.0, 0.5, 1.0) and learnt.scale == pytest.approx((1.0, 1.0, 2.5))
  clip = found["learnable=0.07:100"]  # exp(t) = 150 and 200, capped at 100; starts at 1/0.07
  assert clip.progress == (0.0, 1.0) and clip.scale == pytest.approx((1 / 0.07, 100.0), rel=1e-6)
  assert found["calibrated_free"].progress == (1.0,)
  assert found["calibrated_free"].scale == pytest.approx((3.5,))


def test_committed_study_is_what_the_csvs_give():
  assert report.differs() == []


def test_check_names_a_stale_output(tmp_path):
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": [0.8] * 4, "free": [0.7] * 4}))
  report.write(str(tmp_path), (ROW,))
  assert report.differs(str(tmp_path), (ROW,)) == []
  text = (tmp_path / "regret.md").read_text()
  assert "+10.00" in text and (tmp_path / "regret.png").stat().st_size > 0
  assert (tmp_path / "regret_scales.png").stat().st_size > 0
  _write(tmp_path / "toy.csv", _runs({"tau=0.1": [0.8] * 4, "free": [0.75] * 4}))
  assert report.differs(str(tmp_path), (ROW,)) == ["regret.md", "regret.csv"]
  assert math.isclose(float(next(csv.DictReader(open(tmp_path / "regret.csv")))["regret"]), 10.0)


def _run_folder(folder, spec, seed, steps, scales):
  folder.mkdir(parents=True)
  (folder / "result.json").write_text(f'{{"spec": "{spec}", "seed": {seed}}}')
  _write(folder / "metrics.csv", [{"step": t, "loss": 1.0, "loss/scale": s}
                                  for t, s in zip(steps, scales, strict=True)])


def test_traced_run_logs_give_a_row_its_scale_path(tmp_path):
  # Two runs of one spec and seed (MSC's classes) average; a run without a result is unfinished.
  work = tmp_path / "work"
  _run_folder(work / "runs" / "calibrated_free" / "class0" / "seed0", "calibrated_free", 0,
              [1, 11, 21], [1.0, 2.0, 4.0])
  _run_folder(work / "runs" / "calibrated_free" / "class1" / "seed0", "calibrated_free", 0,
              [1, 11, 21], [3.0, 4.0, 6.0])
  _run_folder(work / "runs" / "calibrated_free" / "class0" / "seed1", "calibrated_free", 1,
              [2, 4], [5.0, "nan"])  # a non-finite logged scale is dropped
  (work / "runs" / "calibrated_free" / "class0" / "seed2").mkdir()
  traced = traces.read_workdir(str(work))
  assert set(traced) == {("calibrated_free", 0), ("calibrated_free", 1)}
  # fraction f of the last step 21 is step 21 f, linear between logged steps, the first value
  # before step 1; the mean of the two classes
  expect = [np.interp(21 * f, [1, 11, 21], [2.0, 3.0, 5.0]) for f in traces.PROGRESS]
  np.testing.assert_allclose(traced[("calibrated_free", 0)], expect)
  np.testing.assert_allclose(traced[("calibrated_free", 1)], 5.0)
  results = tmp_path / "results"
  results.mkdir()
  _write(results / "r.csv", [{"spec": "calibrated_free", "seed": s, "acc": 0.1,
                              "final_scale": 9.0} for s in range(2)])
  assert traces.main(["--table", "r", "--workdir", str(work), "--results", str(results)]) == str(
      results / "r_scales.csv")
  row = rows.Row("r", "r", "MSC", "acc", 2, ("r",))
  (found,) = scales.traces([row], str(results))
  assert found.progress == traces.PROGRESS and found.seeds == 2
  np.testing.assert_allclose(found.scale, (np.array(expect) + 5.0) / 2, rtol=1e-5)
  with pytest.raises(ValueError, match="--table"):
    traces.main(["--table", "absent", "--workdir", str(work), "--results", str(results)])
  # Logs cut to what a trace reads trace as the whole logs do, on unevenly logged steps too.
  logged = list(range(1, 61)) + [63, 70, 88, 100]
  _run_folder(work / "runs" / "perplexity_free" / "seed0", "perplexity_free", 0, logged,
              np.arange(len(logged), dtype=float) ** 2)
  kept = tmp_path / "kept"
  traces.main(["--workdir", str(work), "--cut_into", str(kept)])
  cut = traces.read_workdir(str(kept))
  assert set(cut) == set(traces.read_workdir(str(work)))
  for key, value in traces.read_workdir(str(work)).items():
    np.testing.assert_allclose(cut[key], value, rtol=1e-6)
  assert len((kept / "runs" / "perplexity_free" / "seed0" / "metrics.csv").read_text()
             .splitlines()) < len(logged) // 2


def test_per_row_names_a_candidate_its_screening_stopped(tmp_path):
  # Round 2 screens on A, T and TQ: calibrated_free is 12 behind on A (free 11) and within
  # noise nowhere, so it stops; perplexity_free goes on. Neither has run F: one never will.
  _write(tmp_path / "a.csv", _runs({
      "tau=0.1": [0.50] * 4, "free": [0.49] * 4, "learnable_free=100": [0.47] * 4,
      "calibrated_free": [0.48] * 4, "perplexity_free": [0.495] * 4}))
  _write(tmp_path / "a_grid.csv", _runs({"tau=0.05": [0.60] * 4}))
  _regrets(tmp_path, "t", {"free": 2.0, "learnable_free=100": 1.0, "free_n": 9.0,
                           "calibrated_free": 2.5, "perplexity_free": 0.0})
  _regrets(tmp_path, "tq", {"free": 3.0, "calibrated_free": 1.0, "perplexity_free": 4.0},
           suffix="+logq")
  _regrets(tmp_path, "f", {"free": 2.0})
  result = study.study(str(tmp_path), _toy_design())
  assert result.screenings[1].verdict["calibrated_free"] == "stops"
  assert result.screenings[1].verdict["perplexity_free"] == "goes on"
  sections = report.markdown(result, [], str(tmp_path)).split("\n### ")
  row_f = next(s for s in sections if s.startswith("F"))
  assert "| `calibrated_free` | stopped at screening |" in row_f
  assert "| `perplexity_free` | not yet run |" in row_f
