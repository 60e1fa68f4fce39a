"""What the pages quote from the regret study (`experiments.regret.quotes`, `outcome`,
`fragility`, `changes`, `predictions`) against references computed here: from the committed
CSVs read with `csv`, from the study's cells with the decision rule written out again, and on
made-up cells whose answer is worked out by hand."""

import csv
import os

import numpy as np
import pytest

from experiments.regret import changes, fragility, predictions, quotes, rows, study
from experiments.regret.runs import RESULTS


@pytest.fixture(scope="module")
def result():
  return study.study()


def _csv_mean(table: str, spec: str, metric: str) -> float:
  with open(os.path.join(RESULTS, table + ".csv")) as f:
    values = [float(line[metric]) for line in csv.DictReader(f) if line["spec"] == spec]
  return float(np.mean(values))


def _rule(worst: dict, within: dict, mean: dict) -> str:
  """The decision rule of docs/regret.md, written again: the smallest worst case; within 0.5
  of it a tie, broken by more rows within noise, then the smaller mean."""
  best = min(worst.values())
  tied = [c for c in worst if worst[c] - best < 0.5]
  return min(tied, key=lambda c: (-within[c], mean[c]))


def _went_on(result, number: int) -> list[str]:
  stopped = {c for s in result.screenings if s.round.number <= number
             for c, v in s.verdict.items() if v.startswith("stops")}
  return [c for c in rows.candidates_of(number) if c not in stopped]


def test_leaving_each_row_out_follows_the_rule(result):
  for over in fragility.deciding_sets(result):
    chosen = _went_on(result, over.rows.decides)
    got = {x.row: x for x in fragility.leave_one_out(result, over)}
    assert list(got) == list(over.rows.rows)
    for left in over.rows.rows:
      kept = [c for c in result.full if c["row"] in over.rows.rows and c["row"] != left]
      mine = {c: [x for x in kept if x["candidate"] == c] for c in chosen}
      worst = {c: max(x["regret"] for x in cs) for c, cs in mine.items()}
      within = {c: sum(x["regret"] <= 0 or x["p_value"] > 0.05 for x in cs)
                for c, cs in mine.items()}
      mean = {c: float(np.mean([x["regret"] for x in cs])) for c, cs in mine.items()}
      winner = _rule(worst, within, mean)
      assert got[left].winner == winner and got[left].worst == pytest.approx(worst[winner])


def test_the_margin_is_the_next_finalists_worst_case(result):
  for over in fragility.deciding_sets(result):
    m = fragility.margin(result, over)
    worst = {s["candidate"]: s["worst"] for s in over.summary
             if s["candidate"] in _went_on(result, over.rows.decides)}
    others = sorted(v for c, v in worst.items() if c != m.winner)
    assert m.worst == worst[m.winner] and m.runner_up_worst == others[0]
    assert m.above_tie == pytest.approx(others[0] - worst[m.winner] - 0.5)
    assert f"`{m.winner}` {m.worst:.2f} at worst against `{m.runner_up}`" in (
        fragility.markdown(result))


def _toy(regrets: dict[str, list[float]]) -> study.Study:
  """Round 1's candidates on three made-up rows, every one gone on at screening."""
  keys = ("r1", "r2", "r3")
  full = [{"row": key, "candidate": c, "regret": r, "p_value": 0.01, "seeds": 5, "of_seeds": 5}
          for c, values in regrets.items() for key, r in zip(keys, values, strict=True)]
  over = rows.RowSet("round_1", "toy", keys, decides=1)
  screening = study.Screening(rows.ROUNDS[0], keys, [], [],
                              {c: "goes on" for c in rows.ROUNDS[0].new_mappings})
  return study.Study((), [], full, [screening],
                     [study.SetSummary(over, study.summary(full, keys, rows.CANDIDATES))])


def test_a_decision_that_rests_on_one_row_flips_without_it():
  # free is 1 behind at worst (on r1), tau=0.1 2 (on r2); everyone else 9 or more.
  regrets = {c: [9.0, 9.0, 9.0] for c in rows.ROUND_1_CANDIDATES}
  regrets["free"] = [1.0, 0.5, 0.5]
  regrets["tau=0.1"] = [0.0, 2.0, 0.0]
  toy = _toy(regrets)
  over = toy.sets[0]
  m = fragility.margin(toy, over)
  assert (m.winner, m.worst, m.runner_up, m.runner_up_worst) == ("free", 1.0, "tau=0.1", 2.0)
  by_row = {x.row: (x.winner, x.worst) for x in fragility.leave_one_out(toy, over)}
  # Without r2, tau=0.1's worst is 0 and free's 1: tau=0.1 wins, a gap of 1 >= 0.5.
  assert by_row == {"r1": ("free", 0.5), "r2": ("tau=0.1", 0.0), "r3": ("free", 1.0)}
  assert "another candidate in 1 of 3 cases: without r2, `tau=0.1`" in fragility.markdown(toy)


def test_the_evidence_row_is_the_csvs_mean_and_best_tau(result):
  taus = ("tau=0.1", "tau=0.25", "tau=0.5", "tau=1")
  best = max(taus, key=lambda t: _csv_mean("grace_cora", t, "f1_micro"))
  free = 100 * _csv_mean("grace_cora", "free", "f1_micro")
  reference = 100 * _csv_mean("grace_cora", best, "f1_micro")
  line = next(x for x in quotes.evidence(result).splitlines() if x.startswith("| GRACE, Cora"))
  assert f"| {reference:.2f} (τ {best[4:]}) | {free:.2f} |" in line
  assert f"{free - reference:+.2f}".replace("-", "−") in line


def test_the_settings_table_ranks_worst_cases_over_its_rows(result):
  grace = ("grace_cora", "grace_citeseer")
  went_on = _went_on(result, 2)
  worst = {c: max(x["regret"] for x in result.full if x["candidate"] == c and x["row"] in grace)
           for c in went_on}
  first = sorted(worst, key=worst.get)[:3]
  line = next(x for x in quotes.settings(result).splitlines() if "(GRACE)" in x)
  listed = line.split(" | ")[1]
  assert [part.split("`")[1] for part in listed.split(", ")] == first


def test_the_headline_says_what_the_smallest_worst_case_supports(result):
  advised = next(s for s in result.sets if s.rows.key == "advised")
  smallest = min(max(x["regret"] for x in result.full
                     if x["candidate"] == c and x["row"] in advised.rows.rows)
                 for c in _went_on(result, 2))
  text = quotes.headline(result)
  if smallest > 3:
    assert "no candidate stays within 3 points of the best fixed τ" in text
  assert f"at worst {smallest:.2f} points behind" in text


def test_tau_0_2_counted_as_a_reference_names_the_rows_it_leads(result):
  ahead = sorted(c["row"] for c in result.full if c["candidate"] == "tau=0.2" and c["regret"] < 0)
  text = changes.tau_0_2_as_reference(result)
  assert f"ahead of the reference on {len(ahead)} rows" in text
  assert all(f"{row} by" in text for row in ahead)


def test_the_grid_extension_moved_the_feature_rows_reference(result):
  old = max(("tau=0.05", "tau=0.1", "tau=0.2", "tau=0.5", "tau=1"),
            key=lambda t: _csv_mean("retrieval_ml100k_features", t, "top@100"))
  extended = _csv_mean("regret2_retrieval_ml100k_features_grid", "tau=0.02", "top@100")
  assert extended > _csv_mean("retrieval_ml100k_features", old, "top@100")
  assert f"retrieval_features from `{old}` to `tau=0.02`" in changes.grids_extended(result)


def test_every_change_is_dated_in_order_and_says_what_it_moved(result):
  dates = [c.date for c in changes.CHANGES]
  assert dates == sorted(dates)
  for line in changes.lines(result):
    assert line.startswith("- **2026-") and line.endswith(".")


def test_predictions_hold_as_their_words_say(result):
  cells = {(c["row"], c["candidate"]): c for c in result.full}
  by_row = {r.key: r for r in result.rows}
  checked = 0
  for (row, candidate), cell in cells.items():
    said = predictions.prediction(by_row[row], candidate)
    if said is None or candidate not in rows.ROUND_2_CANDIDATES:
      continue
    regret, level = cell["regret"], cell["regret"] <= 0 or cell["p_value"] > 0.05
    expected = {"within noise": level, "within 0.1": regret <= 0.1, "within 3": regret <= 3,
                "1-3 behind": 1 <= regret <= 3}.get(said.text, regret > 3)
    assert said.holds(cell) == expected, (row, candidate, said.text)
    checked += 1
  assert checked >= 40
  table = "\n".join(predictions.table(result))
  assert table.count("none, ") == 2  # perplexity_free on the feature towers' logQ rows
