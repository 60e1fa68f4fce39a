"""`experiments.runner` and `experiments.tables`: the resume rule and the results writer."""

from __future__ import annotations

import csv
import dataclasses
import json
import os

import ml_collections
import numpy as np
import pytest

from experiments import runner, tables


@dataclasses.dataclass(frozen=True)
class Run:
  name: str

  def directory(self, workdir: str) -> str:
    return os.path.join(workdir, "runs", self.name)


def test_finished_runs_are_read_back_and_tables_follow_every_new_run(tmp_path):
  workdir = str(tmp_path)
  trained, written = [], []

  def train(run):
    trained.append(run.name)
    return {"name": run.name, "value": len(trained)}

  runs = [Run("a"), Run("b"), Run("c")]
  first = runner.run_all(runs[:2], train, workdir=workdir, progress=False,
                         write_tables=lambda results: written.append(len(results)))
  assert trained == ["a", "b"] and written == [1, 2]
  assert runner.finished(runs[0], workdir) and not runner.finished(runs[2], workdir)
  with open(os.path.join(workdir, "runs", "a", runner.RESULT_FILE)) as f:
    assert json.load(f) == {"name": "a", "value": 1}
  written.clear()
  grown = runner.run_all(runs, train, workdir=workdir, progress=False,
                         write_tables=lambda results: written.append(len(results)))
  assert trained == ["a", "b", "c"]  # a and b are not trained again
  assert grown[:2] == first and grown[2] == {"name": "c", "value": 3}
  assert written == [3]


def test_an_interrupted_sweep_keeps_the_finished_part(tmp_path):
  workdir = str(tmp_path)

  def train(run):
    if run.name == "b":
      raise KeyboardInterrupt
    return {"name": run.name}

  with pytest.raises(KeyboardInterrupt):
    runner.run_all([Run("a"), Run("b")], train, workdir=workdir, progress=False)
  assert runner.finished(Run("a"), workdir) and not runner.finished(Run("b"), workdir)


def _config(**fields):
  config = ml_collections.ConfigDict(dict(epochs=2, seeds=1, mappings="free", progress=False))
  config.update(fields)
  return config


def test_prepare_allows_plan_fields_to_change_and_refuses_the_others(tmp_path):
  workdir = str(tmp_path / "w")
  runner.prepare(workdir, _config(), plan_fields=("seeds", "mappings"))
  runner.prepare(workdir, _config(seeds=5, mappings="free,tau=0.1", progress=True),
                 plan_fields=("seeds", "mappings"))
  with pytest.raises(ValueError, match="epochs: recorded 2, now 3"):
    runner.prepare(workdir, _config(epochs=3), plan_fields=("seeds", "mappings"))
  os.makedirs(os.path.join(workdir, "runs"))
  with pytest.raises(ValueError, match="already holds results \\(runs\\)"):
    runner.prepare(workdir, _config(resume=False), plan_fields=("seeds", "mappings"))


def test_a_field_added_later_resumes_earlier_workdirs_at_its_old_behaviour(tmp_path):
  """A workdir recorded before `objective` existed resumes with `objective="simclr"` (what
  it trained) and refuses any other objective."""
  workdir = str(tmp_path / "w")
  runner.prepare(workdir, _config())
  runner.prepare(workdir, _config(objective="simclr"))
  with pytest.raises(ValueError, match="objective: recorded None, now 'supcon'"):
    runner.prepare(workdir, _config(objective="supcon"))


def test_split_list_names_the_field():
  assert runner.split_list(" tau=0.1, free ,", name="mappings") == ["tau=0.1", "free"]
  with pytest.raises(ValueError, match="config.mappings must list at least one item"):
    runner.split_list(" , ", name="mappings")


def test_write_results_writes_csv_markdown_and_figures(tmp_path):
  rows = [{"mapping": "free", "seed": 0, "f1": 0.5}, {"mapping": "tau=1", "seed": 0, "x": 1}]
  drawn = []
  tables.write_results(str(tmp_path), rows, markdown="# t", figures=[drawn.append])
  with open(tmp_path / "results.csv", newline="") as f:
    read = list(csv.DictReader(f))
  assert list(read[0]) == ["mapping", "seed", "f1", "x"]  # every key, first-seen order
  assert read[1] == {"mapping": "tau=1", "seed": "0", "f1": "", "x": "1"}
  assert (tmp_path / "results.md").read_text() == "# t\n"
  assert drawn == [str(tmp_path)]
  with pytest.raises(ValueError, match="rows must not be empty"):
    tables.write_results(str(tmp_path), [], markdown="")


def test_markdown_table_and_mean_std():
  table = tables.markdown_table([{"a": 1.23456, "b": float("nan")}], ["a", "b"])
  assert table.splitlines() == ["| a | b |", "|---|---|", "| 1.23 | - |"]
  mean, std = tables.mean_std([1.0, 2.0, 4.0])
  np.testing.assert_allclose((mean, std), (7 / 3, np.std([1.0, 2.0, 4.0], ddof=1)))
  assert np.isnan(tables.mean_std([1.0])[1])


def test_one_folder_rule_and_plan_order():
  run = runner.Run("sigmoid/learnable=0.1/learn_b=siglip", 2, (("batch_size", 64),))
  assert run.directory("w") == os.path.join(
      "w", "runs", "sigmoid_learnable_0.1_learn_b_siglip", "batch_size_64", "seed2")
  assert run.record() == {"spec": "sigmoid/learnable=0.1/learn_b=siglip", "seed": 2,
                          "batch_size": 64}
  config = _config(losses=" tau=0.50, free,tau=0.5", mappings="", seeds=2, seed_offset=3)
  seed_major = runner.plan(config, order=("seed", "spec"))
  assert [(r.spec, r.seed) for r in seed_major] == [("tau=0.5", 3), ("free", 3), ("tau=0.5", 4),
                                                    ("free", 4)]
  with_axis = runner.plan(config, order=("batch_size", "spec", "seed"),
                          axes={"batch_size": [8, 16]})
  assert [(r["batch_size"], r.spec, r.seed) for r in with_axis][:3] == [
      (8, "tau=0.5", 3), (8, "tau=0.5", 4), (8, "free", 3)]
  assert len({r.directory("w") for r in with_axis}) == 8
  with pytest.raises(ValueError, match="order must name"):
    runner.plan(config, order=("spec",))


def test_loss_specs_reads_the_former_field_name_with_a_notice(capsys):
  assert runner.loss_specs(_config(losses="free", mappings="tau=0.1, free"),
                           example="free") == ["tau=0.1", "free"]
  assert "config.mappings is now config.losses" in capsys.readouterr().err
  assert runner.loss_specs(_config(losses="sigmoid/free/learn_b=prior", mappings=""),
                           example="free") == ["sigmoid/free/learn_b=prior"]
  with pytest.raises(ValueError, match=r"(?s)config.losses: Invalid loss spec 'tua=1'.*--config"):
    runner.loss_specs(_config(losses="tua=1", mappings=""), example="free")


def _legacy_run(workdir, folder, record, result=None):
  path = os.path.join(workdir, "runs", folder)
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(record, f)
  if result is not None:
    with open(os.path.join(path, runner.RESULT_FILE), "w") as f:
      json.dump(result, f)
  return path


def test_runs_of_an_earlier_layout_are_refused_then_moved_with_migrate(tmp_path):
  workdir = str(tmp_path)
  config = _config(losses="tau=0.5,free", mappings="", seeds=1)
  runs = runner.plan(config, order=("spec", "batch_size", "seed"), axes={"batch_size": [8]})
  _legacy_run(workdir, "bs8/tau_0.5/seed0",
              {"mapping": "tau=0.5", "seed": 0, "batch_size": 8, "epochs": 2}, {"acc": 1})
  _legacy_run(workdir, "bs8/free/seed0", {"mapping": "free", "seed": 0, "batch_size": 8})
  _legacy_run(workdir, "bs8/tau_1/seed0", {"mapping": "tau=1", "seed": 0, "batch_size": 8})
  with pytest.raises(ValueError, match=r"2 run folder\(s\) of an earlier layout, e.g. "
                     r"runs/bs8/(free|tau_0.5)/seed0 .*--migrate"):
    runner.prepare(workdir, config, runs=runs)
  with runner.migrating():
    runner.prepare(workdir, config, runs=runs)
  assert runner.finished(runs[0], workdir) and not runner.finished(runs[1], workdir)
  with open(os.path.join(runs[0].directory(workdir), "config.json")) as f:
    assert json.load(f) == {"spec": "tau=0.5", "seed": 0, "batch_size": 8, "epochs": 2}
  assert os.path.isdir(os.path.join(workdir, "runs", "bs8", "tau_1", "seed0"))  # not planned
  runner.prepare(workdir, config, runs=runs)  # nothing left to move
  assert runner.finished_runs(workdir, axes=("batch_size",)) == [(runs[0], {"acc": 1})]
