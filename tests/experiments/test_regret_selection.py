"""Round 3 of the regret study (`experiments.regret.selection`): τ picked per seed by a score of
the runs, against hand-computed regrets on made-up round-3 tables; the stop rule; the rows and
grids of the plan against the committed tables of rounds 1-2."""

import csv
import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from experiments.regret import report, rows, runs, selection, selection_report
from tests.helpers.csv_files import write_csv

TOY = rows.Row("toy", "toy row", "toy", "acc", 4, ("toy",))
GRID = ("tau=0.1", "tau=0.5", "tau=1")
TOY_ROW = selection.SelectionRow(TOY, "regret3_toy", GRID, label_free=True)
BY_NAME = {s.name: s for s in selection.SELECTORS}

# Per τ and seed: the metric and two scores (RankMe highest at τ = 0.1 on seeds 0-2; α-ReQ
# nearest 1 at τ = 0.5 except on seed 3, where τ = 0.5 and τ = 1 tie).
ACC = {"tau=0.1": [0.80, 0.81, 0.79, 0.80], "tau=0.5": [0.85, 0.86, 0.84, 0.83],
       "tau=1": [0.82, 0.80, 0.86, 0.81]}
RANKME = {"tau=0.1": [9.0, 9.0, 9.0, 1.0], "tau=0.5": [5.0, 5.0, 5.0, 5.0],
          "tau=1": [2.0, 2.0, 2.0, 2.0]}
ALPHA = {"tau=0.1": [3.0, 3.0, 3.0, 3.0], "tau=0.5": [1.1, 0.9, 1.2, 1.5],
         "tau=1": [0.5, 0.5, 0.5, 0.5]}




def _lines(seeds=4, **columns):
  """Round-3 CSV lines: one per (τ, seed), with the metric and the given `label_free/` columns."""
  return [{"spec": spec, "seed": seed, "acc": ACC[spec][seed],
           **{name: values[spec][seed] for name, values in columns.items()}}
          for spec in GRID for seed in range(seeds)]


def _grid(tmp_path, **columns):
  write_csv(tmp_path / "regret3_toy.csv", _lines(**columns))
  return selection.GridRuns.read(TOY_ROW, str(tmp_path))


def test_reference_picks_and_regret_by_hand(tmp_path):
  grid = _grid(tmp_path, **{"label_free/rankme": RANKME, "label_free/alpha_req": ALPHA})
  assert grid.reference(4) == "tau=0.5"  # mean 0.845 against 0.80 and 0.8225
  cell = grid.cell(BY_NAME["rankme"], 4)
  # Seeds 0-2 pick τ = 0.1, seed 3 τ = 0.5: regrets 5, 5, 5, 0 points.
  assert cell["regret"] == pytest.approx(3.75) and cell["seeds_won"] == 1
  assert cell["sem"] == pytest.approx(np.std([5, 5, 5, 0], ddof=1) / 2)
  assert cell["p_value"] == pytest.approx(stats.ttest_1samp([5, 5, 5, 0], 0).pvalue)
  assert cell["at_smallest"] == 0.75 and cell["at_largest"] == 0.0
  assert cell["picks"] == {"tau=0.1": 3, "tau=0.5": 1}
  # α-ReQ: nearest 1 is τ = 0.5 on seeds 0-2; on seed 3, |1.5 - 1| = |0.5 - 1|: a tie of
  # τ = 0.5 (regret 0) and τ = 1 (0.83 - 0.81: 2 points) counts 1 point.
  cell = grid.cell(BY_NAME["alpha_req"], 4)
  assert cell["regret"] == pytest.approx(0.25) and cell["picks"] == {"tau=0.5": 3.5, "tau=1": 0.5}
  assert cell["at_largest"] == 0.125


def test_the_edge_rules_read_nothing_and_the_labelled_baseline_its_column(tmp_path):
  grid = _grid(tmp_path, val_f1_micro={spec: ACC[spec][::-1] for spec in GRID})
  smallest, largest = grid.cell(BY_NAME["smallest τ"], 4), grid.cell(BY_NAME["largest τ"], 4)
  assert smallest["regret"] == pytest.approx(100 * (0.845 - 0.80))
  assert largest["regret"] == pytest.approx(100 * (0.845 - 0.8225))
  assert smallest["at_smallest"] == 1.0 and largest["at_largest"] == 1.0
  # The validation metric, reversed by seed, picks τ = 0.5 (seeds 0, 2: 0.83, 0.84 largest),
  # τ = 1 on seed 1 (0.86) and τ = 0.5 on seed 3 (0.85).
  picks = [grid.picks(BY_NAME["validation"], seed) for seed in range(4)]
  assert picks == [["tau=0.5"], ["tau=1"], ["tau=0.5"], ["tau=0.5"]]


def test_a_missing_or_non_finite_score_leaves_the_cell_out(tmp_path):
  broken = {spec: list(values) for spec, values in RANKME.items()}
  broken["tau=1"][2] = math.nan
  grid = _grid(tmp_path, **{"label_free/rankme": broken})
  assert grid.picks(BY_NAME["rankme"], 2) is None and grid.cell(BY_NAME["rankme"], 4) is None
  assert grid.cell(BY_NAME["rankme"], 2) is not None  # seeds 0-1 are whole
  assert grid.cell(BY_NAME["lidar"], 4) is None  # no such column
  write_csv(tmp_path / "regret3_toy.csv", [line for line in _lines() if line["seed"] < 3])
  assert selection.GridRuns.read(TOY_ROW, str(tmp_path)).reference(4) is None
  assert selection.GridRuns.read(TOY_ROW, str(tmp_path / "none")) is None


def _cell(row, selector, regret, seeds=5):
  return {"row": row, "selector": selector, "regret": regret, "seeds": seeds, "p_value": 0.01,
          "at_smallest": 0.0, "at_largest": 0.0}


def test_stop_rule_screening_then_grace_at_five_seeds():
  screen_a = selection.SelectionRow(TOY, "a", GRID, label_free=True)
  screen_b = selection.SelectionRow(rows.Row("b", "b", "toy", "acc", 4, ("b",)), "b", GRID, False)
  grace = selection.SelectionRow(rows.Row("g", "g", "GRACE", "acc", 20, ("g",)), "g", GRID,
                                 True, screening=False)
  plan = (screen_a, screen_b, grace)
  rank = BY_NAME["rankme"]
  full = [_cell("toy", "rankme", 1.0), _cell("b", "rankme", 3.5)]
  assert selection.verdict(rank, plan, full, []) == "stops at screening (b +3.50)"
  full[1]["regret"] = 3.0  # not more than 3 behind
  assert selection.verdict(rank, plan, full, []) == "pending (GRACE, seeds 0-4: g)"
  assert selection.verdict(rank, plan, full, [_cell("g", "rankme", 3.2)]) == (
      "stops at GRACE, seeds 0-4 (g +3.20)")
  assert selection.verdict(rank, plan, full, [_cell("g", "rankme", -1.0)]) == "goes on"
  assert selection.verdict(rank, plan, full[:1], []) == "pending (screening: b)"
  assert selection.verdict(BY_NAME["largest τ"], plan, [], []) == "reference (not screened)"
  # The labelled baseline is read where a validation split exists (GRACE), never screened.
  assert selection.verdict(BY_NAME["validation"], plan, [], []) == (
      "labelled baseline (not screened)")


def test_summary_over_the_rows_a_selector_applies_to():
  tutorial = selection.SelectionRow(rows.Row("t", "t", "tutorial", "acc", 4, ("t",)), "t", GRID,
                                    False)
  plan = (TOY_ROW, tutorial)
  cells = [_cell("toy", "lidar", 2.0), _cell("toy", "rankme", -1.0),
           {**_cell("t", "rankme", 4.0, seeds=10), "p_value": 0.2, "at_smallest": 1.0}]
  by = {s["selector"]: s for s in selection.summary(cells, plan)}
  assert by["lidar"]["of_rows"] == 1 and by["lidar"]["worst"] == 2.0  # no LiDAR on two towers
  assert (by["rankme"]["rows"], by["rankme"]["worst"], by["rankme"]["worst_row"]) == (2, 4.0, "t")
  assert by["rankme"]["mean"] == pytest.approx(1.5) and by["rankme"]["within_noise"] == 2
  assert by["rankme"]["at_smallest"] == pytest.approx(10 / 15) and not by["rankme"]["measures_tau"]
  cells[1]["at_smallest"] = 1.0  # every pick on the smallest τ: 15 of 15 row-seeds
  by = {s["selector"]: s for s in selection.summary(cells, plan)}
  assert by["rankme"]["measures_tau"] == "smallest" and by["smallest τ"]["measures_tau"] == ""
  assert by["validation"]["of_rows"] == 0 and math.isnan(by["validation"]["worst"])


def test_the_plan_is_every_row_of_rounds_1_and_2_with_a_grid_of_three_or_more():
  planned = {r.key: r for r in selection.SELECTION_ROWS}
  for row in rows.ROWS:
    committed = runs.RowRuns.read(row).grid
    if len(committed) < 3:
      assert row.key not in planned, row.key  # DCRec: one τ
      continue
    assert set(planned[row.key].grid) == set(committed), row.key
  assert {r.key for r in selection.SELECTION_ROWS if r.label_free} == {
      "simclr_digits_e20", "simclr_digits_e100", "simclr_mnist1d_knn", "simclr_mnist1d_linear",
      "msc_digits", "grace_citeseer", "grace_cora"}
  assert {r.key for r in selection.SELECTION_ROWS if not r.screening} == {
      "grace_citeseer", "grace_cora"}
  assert len({s.name for s in selection.SELECTORS}) == len(selection.SELECTORS) == 21


def test_the_report_writes_round_3_only_once_a_table_is_committed(tmp_path):
  toy = rows.Row("toy", "toy", "toy", "acc", 4, ("toy",))
  write_csv(tmp_path / "toy.csv", [{"spec": "tau=0.1", "seed": s, "acc": 0.8} for s in range(4)])
  report.write(str(tmp_path), (toy,))
  assert "Round 3" not in (tmp_path / "regret.md").read_text()
  assert not (tmp_path / selection_report.CSV_NAME).exists()
  # A round-3 table of the digits row: the section and its CSV appear, the rest is pending.
  grid = selection.PLAN["simclr_digits_e20"][1]
  lines = [{"spec": spec, "seed": seed, "knn_top1": 0.8 + 0.01 * index,
            **{f"label_free/{name}{at}": float(index) for name in ("rankme", "view_top1")
               for at in ("", "@10%", "@25%")}}
           for index, spec in enumerate(grid) for seed in range(5)]
  write_csv(tmp_path / "regret3_simclr_digits_grid.csv", lines)
  report.write(str(tmp_path), (toy,))
  text = (tmp_path / "regret.md").read_text()
  assert "## Round 3: τ chosen without labels" in text
  assert "| `rankme` | pending (screening: simclr_digits_e100," in text
  with open(tmp_path / selection_report.CSV_NAME, newline="") as f:
    cells = {(c["row"], c["selector"]): c for c in csv.DictReader(f)}
  # RankMe and view retrieval grow with τ as the metric does: they pick τ = 1, the best; the
  # smallest τ is 4 points behind it.
  assert float(cells[("simclr_digits_e20", "rankme")]["regret"]) == pytest.approx(0.0)
  assert float(cells[("simclr_digits_e20", "view_top1@10%")]["regret"]) == pytest.approx(0.0)
  assert float(cells[("simclr_digits_e20", "smallest τ")]["regret"]) == pytest.approx(4.0)
  assert ("simclr_digits_e20", "lidar") not in cells
  assert report.differs(str(tmp_path), (toy,)) == []


def test_only_a_label_free_selector_can_reach_a_goal():
  summary = [{"selector": "validation", "rows": 2, "of_rows": 2, "worst": 0.1},
             {"selector": "largest τ", "rows": 3, "of_rows": 3, "worst": 0.0},
             {"selector": "lidar", "rows": 3, "of_rows": 3, "worst": 0.9},
             {"selector": "rankme", "rows": 2, "of_rows": 3, "worst": 0.2}]
  assert selection_report._goal_lines(summary) == [
      "A label-free selector with a worst regret ≤ 1 on every row: `lidar`.",
      "A label-free selector with a worst regret ≤ 3 on every row: `lidar`."]


def test_in_short_counts_the_stops_and_names_the_closest_selector():
  plan = (TOY_ROW, selection.SelectionRow(rows.Row("b", "b", "toy", "acc", 4, ("b",)), "b", GRID,
                                          False))
  cells = [_cell("toy", s.name, 0.5) for s in selection.SELECTORS if not s.labelled]
  cells += [_cell("b", s.name, 4.0) for s in selection.SELECTORS if not s.labelled]
  next(c for c in cells if c["row"] == "b" and c["selector"] == "lidar")["regret"] = 3.25
  verdicts = {s.name: selection.verdict(s, plan, cells, []) for s in selection.SELECTORS}
  result = selection.Selection(
      rows=plan, grids={"toy": None, "b": None}, full=cells, grace_5=[], verdict=verdicts,
      summaries={"all": selection.summary(cells, plan),
                 "label_free": selection.summary(cells, plan[:1])})
  text = selection_report.in_short(result)
  labelfree = sum(not s.labelled and not s.reference for s in selection.SELECTORS)
  assert f"2 of its 2 screening rows run): {labelfree} of the {labelfree} label-free" in text
  assert "GRACE's stages do not run" in text
  assert "`lidar` (worst +3.25 on b, within noise on 0 of the 2 rows run)" in text
  assert text.endswith("on every row: none.\n")
  # One selector within 3 everywhere: it goes on, and the sentence says so.
  for c in cells:
    if c["selector"] == "lidar":
      c["regret"] = 0.5
  verdicts["lidar"] = selection.verdict(BY_NAME["lidar"], plan, cells, [])
  assert verdicts["lidar"] == "goes on"
  text = selection_report.in_short(dataclasses.replace(result, verdict=verdicts))
  assert f"{labelfree - 1} of the {labelfree}" in text and "`lidar` went on" in text
