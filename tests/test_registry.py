"""`experiments.registry`: every experiment listed once, with its configs, its kind and its
command line; and a study's workdir under a sweep's rules (its lock, its config checked)."""

from __future__ import annotations

import os

import ml_collections
import pytest

from experiments import registry
from experiments.framework import experiment, plan, sweep, workdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_registered_experiment_is_its_module_and_owns_its_configs():
  experiments = registry.experiments()
  assert len(experiments) == len(registry.MODULES)
  owned = []
  for module, found in experiments.items():
    assert module == f"experiments.{found.name}"
    assert found.kind in experiment.KINDS
    assert registry.get(found.name) is found and registry.owner(module) is found
    for path in found.configs:
      assert os.path.isfile(os.path.join(ROOT, path)), (found.name, path)
    owned += found.configs
  folder = os.path.join(ROOT, "experiments", "configs")
  configs = sorted(f"experiments/configs/{name}" for name in os.listdir(folder)
                   if name.endswith(".py") and name != "__init__.py")
  assert sorted(owned) == configs  # each config belongs to exactly one experiment


def test_an_unknown_name_lists_the_registered_ones():
  with pytest.raises(KeyError, match="registered: augment_views, dcrec"):
    registry.get("dcrecs")
  assert registry.owner("experiments.grace.probe") is registry.get("grace")


def test_a_study_holds_its_workdir_and_refuses_another_config(tmp_path):
  calls = []

  @sweep.study
  def train_and_evaluate(config, folder):
    calls.append(workdir.holds(folder))
    return [{"value": config.value}]

  assert train_and_evaluate(ml_collections.ConfigDict({"value": 1}), str(tmp_path)) == [
      {"value": 1}]
  assert calls == [True] and not workdir.holds(str(tmp_path))
  train_and_evaluate(ml_collections.ConfigDict({"value": 1}), str(tmp_path))  # a rerun
  with pytest.raises(plan.ConfigError, match="value"):
    train_and_evaluate(ml_collections.ConfigDict({"value": 2}), str(tmp_path))
  assert calls == [True, True]
