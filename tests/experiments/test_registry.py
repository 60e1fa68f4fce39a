"""`experiments.registry`: every experiment listed once, with its configs, its kind and its
command line, and the framework importing none of them; a study's workdir under a sweep's rules
(its lock, its config checked); and the worked example of `docs/architecture.md` ("Adding an
experiment") built from the page, registered and run end to end."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys
import typing

import ml_collections
import numpy as np
import pytest

import experiments
from experiments import registry
from experiments.framework import cli, experiment, plan, sweep, tables, workdir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_registered_experiment_is_its_module_and_owns_its_configs():
  experiments = registry.experiments()
  assert len(experiments) == len(registry.MODULES)
  owned = []
  for module, found in experiments.items():
    assert module == f"experiments.{found.name}"
    assert found.kind in typing.get_args(experiment.Kind)
    assert registry.get(found.name) is found and registry.owner(module) is found
    for path in found.configs:
      assert os.path.isfile(os.path.join(ROOT, path)), (found.name, path)
    owned += found.configs
  # The configs' two places (docs/architecture.md): experiments/configs/ for the older
  # experiments, experiments/<name>/configs/ for a new one.
  configs = sorted(
      str(path.relative_to(ROOT)) for pattern in ("configs/*.py", "*/configs/*.py")
      for path in pathlib.Path(ROOT, "experiments").glob(pattern) if path.name != "__init__.py")
  assert sorted(owned) == configs  # each config belongs to exactly one experiment


def test_the_framework_imports_no_experiment():
  """Imports at the top of a module and inside its functions alike, read with `ast`; nor does
  it load one by name (`importlib`): experiments are found through `experiments.registry`."""
  folder = os.path.join(ROOT, "experiments", "framework")
  found = []
  for name in sorted(os.listdir(folder)):
    if not name.endswith(".py"):
      continue
    with open(os.path.join(folder, name)) as f:
      source = f.read()
    for node in ast.walk(ast.parse(source)):
      modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      found += [f"{name}: {module}" for module in modules
                if module.startswith("experiments") and not module.startswith(
                    "experiments.framework")]
    assert "import_module" not in source and "__import__" not in source, name
  assert not found


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


# -- the worked example of docs/architecture.md, built from the page -----------------------


def _example_files() -> dict[str, str]:
  """`path -> code` of each file the page's "Adding an experiment" shows (a line naming the
  file in backquotes, then its fenced block)."""
  with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
    page = f.read()
  section = page.split("### Adding an experiment", 1)[1].split("\n### ", 1)[0]
  found = re.findall(r"^`([\w/.]+)`(?:, one line of `MODULES`)?:\n\n```python\n(.*?)```$",
                     section, re.MULTILINE | re.DOTALL)
  return dict(found)


@pytest.fixture
def pairs(tmp_path, monkeypatch):
  """The page's experiment written under `tmp_path/experiments` and registered."""
  files = _example_files()
  assert set(files) == {"experiments/pairs/__init__.py", "experiments/pairs/__main__.py",
                        "experiments/pairs/configs/default.py", "experiments/registry.py"}
  line = files.pop("experiments/registry.py").strip()
  for path, code in files.items():
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(code)
  monkeypatch.setattr(experiments, "__path__", [*experiments.__path__,
                                                str(tmp_path / "experiments")])
  monkeypatch.setattr(registry, "MODULES", [*registry.MODULES, ast.literal_eval(line)[0]])
  yield tmp_path
  for name in [name for name in sys.modules if name.startswith("experiments.pairs")]:
    del sys.modules[name]


def test_the_worked_example_runs_through_the_registry(pairs):
  found = registry.get("pairs")
  config = cli.load_config(str(pairs / found.configs[0]))
  found.check_config(config)
  workdir = str(pairs / "work")
  rows = found.train_and_evaluate(config, workdir, command="python -m experiments.pairs")
  assert [(row["spec"], row["seed"]) for row in rows] == [
      ("free", 0), ("tau=0.1", 0), ("free", 1), ("tau=0.1", 1)]
  assert all(0 <= row["pair_top1"] <= 1 and np.isfinite(row["final_loss"]) for row in rows)
  assert os.path.isdir(os.path.join(workdir, "runs", "tau_0.1", "seed1"))
  with open(os.path.join(workdir, "results.md")) as f:
    table = f.read()
  csv_rows = tables.typed(tables.read_csv(os.path.join(workdir, "results.csv")))
  rebuilt = found.results_markdown(csv_rows, config, "python -m experiments.pairs")
  assert table == rebuilt.rstrip() + "\n"  # what experiments.regenerate checks
  config.seeds = 3  # the sweep grows: only the third seed trains
  assert len(found.train_and_evaluate(config, workdir, command="c")) == 6


def test_the_worked_example_runs_from_the_command_line(pairs):
  code = (f"import experiments, runpy; experiments.__path__.append({str(pairs / 'experiments')!r})"
          "; runpy.run_module('experiments.pairs', run_name='__main__', alter_sys=True)")
  workdir = pairs / "cli"
  proc = subprocess.run(
      [sys.executable, "-c", code, f"--config={pairs / 'experiments/pairs/configs/default.py'}",
       f"--workdir={workdir}", "--config.seeds=1", "--config.losses=free"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "| free | 0 |" in proc.stdout and f"wrote {workdir}/" in proc.stdout
