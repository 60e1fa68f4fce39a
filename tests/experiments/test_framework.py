"""`experiments.framework`: the plan of a config, the workdir, the resume rule of a sweep and the
results writer."""

from __future__ import annotations

import ast
import csv
import dataclasses
import json
import os
import pathlib
import re

import ml_collections
import numpy as np
import pytest

from experiments.framework import held_out, plan, sweep, tables
from experiments.framework import workdir as workdirs
from tfcl_jax import losses


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
  first = sweep.run_all(runs[:2], train, workdir=workdir, progress=False,
                         write_tables=lambda results: written.append(len(results)))
  assert trained == ["a", "b"] and written == [1, 2]
  assert sweep.finished(runs[0], workdir) and not sweep.finished(runs[2], workdir)
  with open(os.path.join(workdir, "runs", "a", sweep.RESULT_FILE)) as f:
    assert json.load(f) == {"name": "a", "value": 1}
  written.clear()
  grown = sweep.run_all(runs, train, workdir=workdir, progress=False,
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
    sweep.run_all([Run("a"), Run("b")], train, workdir=workdir, progress=False)
  assert sweep.finished(Run("a"), workdir) and not sweep.finished(Run("b"), workdir)


def _config(**fields):
  config = ml_collections.ConfigDict(dict(epochs=2, seeds=1, losses="free", progress=False))
  config.update(fields)
  return config


def test_prepare_allows_plan_fields_to_change_and_refuses_the_others(tmp_path):
  workdir = str(tmp_path / "w")
  workdirs.prepare(workdir, _config(classes="0"), plan_fields=("classes",))
  workdirs.prepare(workdir, _config(seeds=5, losses="free,tau=0.1", progress=True, classes="1"),
                   plan_fields=("classes",))
  with pytest.raises(plan.ConfigError, match="epochs: recorded 2, now 3"):
    workdirs.prepare(workdir, _config(epochs=3, classes="0"), plan_fields=("classes",))
  os.makedirs(os.path.join(workdir, "runs"))
  with pytest.raises(plan.ConfigError, match="already holds results \\(runs\\)"):
    workdirs.prepare(workdir, _config(resume=False, classes="0"), plan_fields=("classes",))


def test_one_rule_records_the_config_and_reads_resume_and_progress():
  """What a workdir and each run record, and `resume` / `progress`, are read the same way
  for every experiment (`plan.recorded`, `sweep.train_arguments`)."""
  config = _config(losses="free,tau=0.1", seeds=3, seed_offset=1, classes="all", lr=0.5,
                   resume=False)
  assert plan.recorded(config, plan_fields=("classes",)) == {"epochs": 2, "lr": 0.5}
  run = plan.Run("tau=0.1", 2, (("normal_class", 7),))
  arguments = sweep.train_arguments(config, run, "w", plan_fields=("classes",))
  assert arguments == {
      "workdir": os.path.join("w", "runs", "tau_0.1", "normal_class_7", "seed2"),
      "config": {"epochs": 2, "lr": 0.5, "spec": "tau=0.1", "seed": 2, "normal_class": 7},
      "resume": False, "progress": False, "desc": "tau=0.1 seed 2 normal_class=7"}
  bare = ml_collections.ConfigDict(dict(losses="free", seeds=1))  # no resume, no progress
  assert plan.resume(bare) and plan.progress(bare)


def test_split_list_names_the_field():
  assert plan.split_list(" tau=0.1, free ,", name="losses") == ["tau=0.1", "free"]
  with pytest.raises(plan.ConfigError, match="config.losses must list at least one item"):
    plan.split_list(" , ", name="losses")


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


def test_held_out_steps_are_the_first_steps_past_each_fraction():
  assert held_out.steps(100) == {0.1: 10, 0.25: 25, 0.5: 50, 1.0: 100}
  assert held_out.steps(1000) == {0.1: 100, 0.25: 250, 0.5: 500, 1.0: 1000}
  assert held_out.steps(7) == {0.1: 1, 0.25: 2, 0.5: 4, 1.0: 7}
  assert held_out.steps(2) == {0.1: 1, 0.25: 1, 0.5: 1, 1.0: 2}  # fractions may share a step
  with pytest.raises(ValueError, match="num_steps must be >= 1"):
    held_out.steps(0)


def test_held_out_subset_is_fixed_and_capped():
  np.testing.assert_array_equal(held_out.subset(5), np.arange(5))
  rows = held_out.subset(10_000)
  assert len(rows) == held_out.MAX_ROWS == len(set(rows.tolist()))
  assert np.all(np.diff(rows) > 0) and rows.max() < 10_000
  np.testing.assert_array_equal(rows, held_out.subset(10_000))  # every run the same rows


def test_held_out_columns_read_each_fraction_from_the_runs_file(tmp_path):
  assert held_out.columns(str(tmp_path), 8) == {}  # a run without scores
  (tmp_path / held_out.FILE).write_text(
      "step,rankme,lidar\n1,1.5,2.0\n4,3.0,4.0\n8,5.0,6.0\n")  # step 2 (25%) missing
  got = held_out.columns(str(tmp_path), 8)
  assert list(got) == [f"label_free/{name}{at}" for at in ("@10%", "@25%", "@50%", "")
                       for name in ("rankme", "lidar")]
  assert (got["label_free/rankme@10%"], got["label_free/lidar@50%"], got["label_free/rankme"]
          ) == (1.5, 4.0, 5.0)
  assert np.isnan(got["label_free/rankme@25%"]) and np.isnan(got["label_free/lidar@25%"])


def test_train_run_scores_the_held_out_set_and_adds_its_columns(tmp_path, monkeypatch):
  rng = np.random.default_rng(0)
  held = held_out.HeldOut(*(rng.normal(size=(40, 8)).astype(np.float32) for _ in range(3)),
                          views=rng.normal(size=(10, 3, 8)).astype(np.float32))

  def fake_train(state, *, evaluations, workdir, num_steps, **kwargs):
    del kwargs
    (evaluation,) = evaluations
    assert evaluation.file == held_out.FILE and evaluation.steps == {1, 2, 4, 7}
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, held_out.FILE), "w") as f:
      scores = evaluation.fn(state)
      f.write("step," + ",".join(scores) + "\n")
      for step in sorted(evaluation.steps):
        f.write(f"{step}," + ",".join(str(step * v) for v in scores.values()) + "\n")
    return state

  def build(loss, run_keys, mesh):
    del loss, run_keys, mesh
    state = type("State", (), {"params": {"loss": {}}})()
    return sweep.Trainable(state, train_step=None, batches=lambda first: iter(()), num_steps=7,
                           result=lambda trained: {}, held_out=lambda state: held)

  monkeypatch.setattr(sweep.training, "train", fake_train)
  run = plan.Run("free", 0, loss=losses.spec.parse("free"))
  row = sweep.train_run(_config(num_devices=1, log_every=1), run, str(tmp_path),
                        num_candidates=3, build=build, mesh=object())
  scores = held_out.score(held)
  assert sorted(scores) == ["alignment", "alpha_req", "lidar", "rankme", "uniformity",
                            "view_top1"]
  for name, value in scores.items():
    for fraction, step in held_out.steps(7).items():
      assert row[held_out.column(name, fraction)] == pytest.approx(step * value, rel=1e-6)


def test_markdown_table_and_mean_std():
  table = tables.markdown_table([{"a": 1.23456, "b": float("nan")}], ["a", "b"])
  assert table.splitlines() == ["| a | b |", "|---|---|", "| 1.23 | - |"]
  mean, std = tables.mean_std([1.0, 2.0, 4.0])
  np.testing.assert_allclose((mean, std), (7 / 3, np.std([1.0, 2.0, 4.0], ddof=1)))
  assert np.isnan(tables.mean_std([1.0])[1])


def test_one_folder_rule_and_plan_order():
  run = plan.Run("sigmoid/learnable=0.1/learn_b=siglip", 2, (("batch_size", 64),))
  assert run.directory("w") == os.path.join(
      "w", "runs", "sigmoid_learnable_0.1_learn_b_siglip", "batch_size_64", "seed2")
  assert run.record() == {"spec": "sigmoid/learnable=0.1/learn_b=siglip", "seed": 2,
                          "batch_size": 64}
  config = _config(losses=" tau=0.50, free,tau=0.5", seeds=2, seed_offset=3)
  seed_major = plan.plan(config, order=("seed", "spec"))
  assert [(r.spec, r.seed) for r in seed_major] == [("tau=0.5", 3), ("free", 3), ("tau=0.5", 4),
                                                    ("free", 4)]
  with_axis = plan.plan(config, order=("batch_size", "spec", "seed"),
                        axes={"batch_size": [8, 16]})
  assert [(r["batch_size"], r.spec, r.seed) for r in with_axis][:3] == [
      (8, "tau=0.5", 3), (8, "tau=0.5", 4), (8, "free", 3)]
  assert len({r.directory("w") for r in with_axis}) == 8
  with pytest.raises(ValueError, match="order must name"):
    plan.plan(config, order=("spec",))
  with pytest.raises(plan.ConfigError, match="config.seed_offset must be an int >= 0"):
    plan.plan(_config(seed_offset=-1))
  with pytest.raises(plan.ConfigError, match="plans 1000000 runs"):
    plan.plan(_config(seeds=10**6))


def test_loss_specs_are_canonical_and_a_bad_one_names_the_field():
  assert plan.loss_specs(_config(losses="tau=0.10, free,tau=0.1"),
                         example="free") == ["tau=0.1", "free"]
  assert plan.loss_specs(_config(losses="sigmoid/free/learn_b=prior"),
                         example="free") == ["sigmoid/free/learn_b=prior"]
  with pytest.raises(plan.ConfigError, match=r"(?s)config.losses: Invalid loss spec 'tua=1'.*"
                     r"--config.losses=free"):
    plan.loss_specs(_config(losses="tua=1"), example="free")
  # Another field, and names an experiment runs beside its losses, as they are.
  assert plan.loss_specs(_config(n_losses="popularity, clip:free, tau=1.0"), example="free",
                         field="n_losses", others=("popularity",)) == [
                             "popularity", "clip:free", "tau=1"]


def test_finished_runs_are_read_back_from_their_folders(tmp_path):
  workdir = str(tmp_path)
  config = _config(losses="tau=0.5,free")
  runs = plan.plan(config, order=("spec", "batch_size", "seed"), axes={"batch_size": [8]})

  def train(run):
    os.makedirs(run.directory(workdir), exist_ok=True)
    with open(os.path.join(run.directory(workdir), "config.json"), "w") as f:
      json.dump(run.record(), f)
    if run.spec == "free":
      raise KeyboardInterrupt  # started, not finished
    return {"spec": run.spec, "acc": 1}

  with pytest.raises(KeyboardInterrupt):
    sweep.run_all(runs, train, workdir=workdir, progress=False)
  torn = os.path.join(workdir, "runs", "torn", "seed0")
  os.makedirs(torn)
  with open(os.path.join(torn, "config.json"), "w") as f:
    f.write('{"spec": "tau')  # a record a kill cut short: no run
  assert sweep.finished_runs(workdir, axes=("batch_size",)) == [
      (runs[0], {"spec": "tau=0.5", "acc": 1})]


def test_a_result_without_its_runs_spec_is_refused_naming_the_file(tmp_path):
  """A run's `result.json` names the run's spec in its `spec` column; one that does not (its
  spec in another column) is refused, not read as a finished run nor trained over."""
  workdir = str(tmp_path)
  run = plan.Run("tau=0.1", 0)
  os.makedirs(run.directory(workdir))
  with open(os.path.join(run.directory(workdir), "config.json"), "w") as f:
    json.dump(run.record(), f)
  path = os.path.join(run.directory(workdir), sweep.RESULT_FILE)
  with open(path, "w") as f:
    json.dump({"loss": "tau=0.1", "seed": 0, "acc": 0.5}, f)
  refused = (f"{path} is no result of run 'tau=0.1' seed 0: expected the column 'spec' = "
             "'tau=0.1', found the columns loss, seed, acc")
  with pytest.raises(plan.ConfigError, match=re.escape(refused)):
    sweep.run_all([run], lambda run: pytest.fail("trained"), workdir=workdir, progress=False)
  with pytest.raises(plan.ConfigError, match=re.escape(refused)):
    sweep.finished(run, workdir)
  with pytest.raises(plan.ConfigError, match=re.escape(refused)):
    sweep.finished_runs(workdir)
  with open(path, "w") as f:
    json.dump({"spec": "tau=0.1", "seed": 0, "acc": 0.5}, f)
  assert sweep.finished_runs(workdir) == [(run, {"spec": "tau=0.1", "seed": 0, "acc": 0.5})]


def test_read_csv_refuses_a_header_without_the_columns_it_reads(tmp_path):
  path = tmp_path / "results.csv"
  path.write_text("dataset,loss,seed,f1_micro\ncora,free,0,0.8\n")
  with pytest.raises(plan.ConfigError, match=re.escape(
      f"{path} lacks the columns spec: expected spec, seed in its header, found "
      "dataset,loss,seed,f1_micro.")):
    tables.read_csv(str(path), columns=("spec", "seed"))
  assert tables.read_csv(str(path), columns=("seed",)) == [
      {"dataset": "cora", "loss": "free", "seed": "0", "f1_micro": "0.8"}]


def test_the_framework_imports_no_experiment_and_no_module_of_it_imports_itself_back():
  """`experiments.framework` imports itself and `tfcl_jax` only (`lowering`, which builds each
  experiment's train step, excepted), and its modules import each other without a cycle, at the
  top of a module or inside its functions."""
  folder = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "framework"
  names = {path.stem for path in folder.glob("*.py")} - {"__init__"}
  graph = {}
  for name in names:
    imported = set()
    for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
      if isinstance(node, ast.ImportFrom) and node.module:
        imported |= {f"{node.module}.{alias.name}" for alias in node.names}
      elif isinstance(node, ast.Import):
        imported |= {alias.name for alias in node.names}
    outside = {module for module in imported if module.startswith("experiments.")
               and not module.startswith("experiments.framework.")}
    assert name == "lowering" or not outside, (name, outside)
    graph[name] = {module.split(".")[2] for module in imported
                   if module.startswith("experiments.framework.")} & names
  done: set = set()
  while len(done) < len(graph):  # peel off the modules whose imports are all peeled off
    ready = {name for name, needs in graph.items() if name not in done and needs <= done}
    assert ready, f"an import cycle among {sorted(set(graph) - done)}"
    done |= ready


@pytest.mark.parametrize("keys", [1, 3])
def test_train_run_keys_the_run_by_its_seed_and_builds_its_row(tmp_path, monkeypatch, keys):
  import jax  # noqa: PLC0415

  seen = {}

  def fake_train(state, *, key, **kwargs):
    seen["train_key"], seen["kwargs"] = key, kwargs
    os.makedirs(kwargs["workdir"], exist_ok=True)
    with open(os.path.join(kwargs["workdir"], "metrics.csv"), "w") as f:
      f.write("step,loss,seconds\n1,0.75,1.5\n2,0.5,3.25\n")
    return state

  def build(loss, run_keys, mesh):
    seen["run_keys"], seen["loss"] = run_keys, loss
    state = type("State", (), {"params": {"loss": {"t": np.float32(0.5)}}})()
    return sweep.Trainable(state, train_step=None, batches=lambda first: iter(()), num_steps=2,
                           result=lambda trained: {"own": len(trained.metrics["loss"])},
                           options={"eval_every": 0})

  monkeypatch.setattr(sweep.training, "train", fake_train)
  run = plan.Run("learnable=0.2", 7, loss=losses.spec.parse("learnable=0.2"))
  row = sweep.train_run(_config(num_devices=1, log_every=1), run, str(tmp_path),
                        num_candidates=3, build=build, keys=keys, mesh=object())
  seed_key = jax.random.key(7)
  want = ([seed_key] if keys == 1 else list(jax.random.split(seed_key, keys)))
  assert [jax.random.key_data(k).tolist() for k in seen["run_keys"]] == [
      jax.random.key_data(k).tolist() for k in want]
  # The training key: the seed's own with one key, else the second of the split.
  assert (jax.random.key_data(seen["train_key"]).tolist()
          == jax.random.key_data(want[min(1, keys - 1)]).tolist())
  assert seen["loss"].spec == "learnable=0.2" and seen["kwargs"]["eval_every"] == 0
  assert row == {"spec": "learnable=0.2", "seed": 7, "final_loss": 0.5, "final_t": 0.5,
                 "train_seconds": 3.25, "own": 2}


def test_train_run_refuses_no_keys(tmp_path):
  with pytest.raises(ValueError, match="keys must be >= 1, got 0"):
    sweep.train_run(_config(num_devices=1, log_every=1),
                    plan.Run("free", 0, loss=losses.spec.parse("free")), str(tmp_path),
                    num_candidates=3, build=None, keys=0, mesh=object())  # type: ignore[arg-type]


def test_a_run_carries_its_loss_parsed_once_from_the_plan(tmp_path, monkeypatch):
  reads = []
  read = losses.SPECS.read
  monkeypatch.setattr(losses.SPECS, "read", lambda text: reads.append(text) or read(text))
  config = ml_collections.ConfigDict({"losses": "sigmoid/free_n/learn_b=prior, tau=0.50, tau=0.5",
                                      "seeds": 2})
  runs = plan.plan(config, axes={"batch_size": [4, 8]},
                   order=("batch_size", "spec", "seed"))
  assert reads == ["sigmoid/free_n/learn_b=prior", "tau=0.50", "tau=0.5"]  # the config's text
  assert [run.loss.spec for run in runs[:4]] == [run.spec for run in runs[:4]] == [
      "sigmoid/free_n/learn_b=prior"] * 2 + ["tau=0.5"] * 2

  class Built(Exception):
    """The loss is all this test needs: training stops there."""

  def build(loss, run_keys, mesh):
    seen.append(loss)
    raise Built

  seen = []
  for run in runs[:2]:
    with pytest.raises(Built):
      sweep.train_run(_config(num_devices=1, log_every=1), run, str(tmp_path),
                      num_candidates=run["batch_size"] - 1, build=build, mesh=object())
  assert len(reads) == 3  # built from the parsed spec, not parsed again
  assert [loss.mapping.spec for loss in seen] == ["free_n=3", "free_n=3"]
  assert seen[0].bias == pytest.approx(np.log(1 / 2))


def test_train_run_refuses_a_run_without_a_loss(tmp_path):
  with pytest.raises(ValueError, match="run 'popularity' carries no parsed loss"):
    sweep.train_run(_config(num_devices=1, log_every=1), plan.Run("popularity", 0),
                    str(tmp_path), num_candidates=3, build=None, mesh=object())  # type: ignore
  with pytest.raises(ValueError, match="run 'free' carries the loss of 'tau=0.5'"):
    plan.Run("free", 0, loss=losses.spec.parse("tau=0.5"))
