"""`experiments.framework.workdir`: a workdir holds one config; the plan's fields may change."""

from __future__ import annotations

import os

import ml_collections
import pytest

from experiments.framework import plan
from experiments.framework import workdir as workdirs


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
