"""`experiments.framework.sweep`: finished runs read back and kept, an interrupted sweep, a result
refused that is not its run's, and one run trained by `train_run` (its keys, its loss, its row,
its held-out scores)."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import ml_collections
import numpy as np
import pytest

from experiments.framework import held_out, plan, sweep
from tfcl_jax import losses


def _config(**fields):
  config = ml_collections.ConfigDict(dict(epochs=2, seeds=1, losses="free", progress=False))
  config.update(fields)
  return config


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


def test_train_run_refuses_a_run_without_a_loss(tmp_path):
  with pytest.raises(ValueError, match="run 'popularity' carries no parsed loss"):
    sweep.train_run(_config(num_devices=1, log_every=1), plan.Run("popularity", 0),
                    str(tmp_path), num_candidates=3, build=None, mesh=object())  # type: ignore
  with pytest.raises(ValueError, match="run 'free' carries the loss of 'tau=0.5'"):
    plan.Run("free", 0, loss=losses.spec.parse("tau=0.5"))
