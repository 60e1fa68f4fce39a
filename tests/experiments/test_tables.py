"""`experiments.framework.tables`: `results.csv`, `results.md` and the figures of a sweep, its
markdown tables, and the columns a CSV must hold."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest

from experiments.framework import plan, tables


def test_write_results_writes_csv_markdown_and_figures(tmp_path):
  rows = [{"spec": "free", "seed": 0, "f1": 0.5}, {"spec": "tau=1", "seed": 0, "x": 1}]
  drawn = []
  tables.write_results(str(tmp_path), rows, markdown="# t", figures=[drawn.append])
  with open(tmp_path / "results.csv", newline="") as f:
    read = list(csv.DictReader(f))
  assert list(read[0]) == ["spec", "seed", "f1", "x"]  # every key, first-seen order
  assert read[1] == {"spec": "tau=1", "seed": "0", "f1": "", "x": "1"}
  assert (tmp_path / "results.md").read_text() == "# t\n"
  assert drawn == [str(tmp_path)]
  with pytest.raises(ValueError, match="rows must not be empty"):
    tables.write_results(str(tmp_path), [], markdown="")


def test_given_columns_keep_a_solved_scale_where_a_row_has_one(tmp_path):
  rows = [{"spec": "free", "seed": 0, "x": 1}, {"spec": "calibrated_free", "seed": 0,
                                                 "final_scale": 2.5, "other": 3}]
  tables.write_results(str(tmp_path), rows, markdown="# t", columns=("spec", "seed"))
  with open(tmp_path / "results.csv", newline="") as f:
    assert list(csv.reader(f)) == [["spec", "seed", "final_scale"], ["free", "0", ""],
                                   ["calibrated_free", "0", "2.5"]]
  tables.write_results(str(tmp_path), rows[:1], markdown="# t", columns=("spec", "seed"))
  with open(tmp_path / "results.csv", newline="") as f:
    assert next(csv.reader(f)) == ["spec", "seed"]  # tables without one stay as they were


def test_given_columns_keep_the_label_free_scores_where_a_row_has_them(tmp_path):
  rows = [{"spec": "popularity", "seed": 0},
          {"spec": "free", "seed": 0, "label_free/rankme@10%": 3.5, "label_free/rankme": 4.0}]
  tables.write_results(str(tmp_path), rows, markdown="# t", columns=("spec", "seed"))
  with open(tmp_path / "results.csv", newline="") as f:
    assert list(csv.reader(f)) == [
        ["spec", "seed", "label_free/rankme@10%", "label_free/rankme"], ["popularity", "0", "", ""],
        ["free", "0", "3.5", "4.0"]]


def test_markdown_table_and_mean_std():
  table = tables.markdown_table([{"a": 1.23456, "b": float("nan")}], ["a", "b"])
  assert table.splitlines() == ["| a | b |", "|---|---|", "| 1.23 | - |"]
  mean, std = tables.mean_std([1.0, 2.0, 4.0])
  np.testing.assert_allclose((mean, std), (7 / 3, np.std([1.0, 2.0, 4.0], ddof=1)))
  assert np.isnan(tables.mean_std([1.0])[1])


def test_read_csv_refuses_a_header_without_the_columns_it_reads(tmp_path):
  path = tmp_path / "results.csv"
  path.write_text("dataset,loss,seed,f1_micro\ncora,free,0,0.8\n")
  with pytest.raises(plan.ConfigError, match=re.escape(
      f"{path} lacks the columns spec: expected spec, seed in its header, found "
      "dataset,loss,seed,f1_micro.")):
    tables.read_csv(str(path), columns=("spec", "seed"))
  assert tables.read_csv(str(path), columns=("seed",)) == [
      {"dataset": "cora", "loss": "free", "seed": "0", "f1_micro": "0.8"}]
