"""`experiments.framework.plan`: the runs of a config in their order and folders, the loss specs
parsed once and named in errors, what a workdir and a run record."""

from __future__ import annotations

import os

import ml_collections
import numpy as np
import pytest

from experiments.framework import plan, sweep
from tfcl_jax import losses


def _config(**fields):
  config = ml_collections.ConfigDict(dict(epochs=2, seeds=1, losses="free", progress=False))
  config.update(fields)
  return config


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
