"""`experiments.registry`: every experiment found by its place, with its configs in the one
place, its kind and its command line; no experiment importing another (nor the framework one:
test_framework.py); a study's workdir under a sweep's rules (its lock, its config checked);
and the worked example of `docs/architecture.md` ("Adding an experiment") added to a copy of
the repository from the page and run there, by its tests and its command line."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import shutil
import subprocess
import sys
import types
import typing

import ml_collections
import pytest

from experiments import registry
from experiments.framework import experiment, plan, sweep, workdir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENTS = pathlib.Path(ROOT, "experiments")
# The commands of `experiments/` that are not experiments: they take no config and no workdir.
NOT_EXPERIMENTS = {"experiments.regenerate", "experiments.regret"}


def _commands() -> set[str]:
  """Every `python -m experiments.NAME` of `experiments/`: a package with a `__main__.py`, or a
  module with an `if __name__ == "__main__":` block."""
  found = {f"experiments.{path.parent.name}" for path in EXPERIMENTS.glob("*/__main__.py")}
  return found | {f"experiments.{path.stem}" for path in EXPERIMENTS.glob("*.py")
                  if 'if __name__ == "__main__":' in path.read_text()}


def test_every_command_is_an_experiment_found_by_its_place():
  """The registry finds (by the line that binds `EXPERIMENT`) exactly the commands of
  `experiments/`, each named after its module."""
  found = registry.experiments()
  assert list(found) == registry.modules() == sorted(_commands() - NOT_EXPERIMENTS)
  for module, declared in found.items():
    assert module == f"experiments.{declared.name}"
    assert declared.kind in typing.get_args(experiment.Kind)
    assert registry.get(declared.name) is declared and registry.owner(module) is declared


def test_every_config_is_in_experiments_configs_and_belongs_to_one_experiment():
  """The one place of the configs (docs/architecture.md): `experiments/configs/`, each file
  named by exactly one experiment."""
  owned = [path for declared in registry.experiments().values() for path in declared.configs]
  assert all(path.startswith("experiments/configs/") and os.path.isfile(os.path.join(ROOT, path))
             for path in owned), owned
  configs = sorted(str(path.relative_to(ROOT)) for path in EXPERIMENTS.glob("configs/*.py")
                   if path.name != "__init__.py")
  assert sorted(owned) == configs
  assert not list(EXPERIMENTS.glob("*/configs")), "a config folder outside experiments/configs"


def _imports(path: pathlib.Path) -> set[str]:
  """The modules `path` imports, at its top or inside its functions (`from a import b`: `a.b`)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      found |= {f"{node.module}.{alias.name}" for alias in node.names}
  return found


def _reaching_out(module: str) -> dict[str, set[str]]:
  """File -> the modules of `experiments` it imports other than `module`'s own and the
  framework's, for every file of the experiment `module`."""
  name = module.removeprefix("experiments.")
  files = sorted((EXPERIMENTS / name).rglob("*.py")) or [EXPERIMENTS / f"{name}.py"]
  allowed = (f"{module}.", "experiments.framework.")
  found = {str(path.relative_to(ROOT)): {imported for imported in _imports(path)
                                         if imported.split(".")[0] == "experiments"
                                         and imported not in (module, "experiments.framework")
                                         and not imported.startswith(allowed)}
           for path in files}
  return {path: imported for path, imported in found.items() if imported}


def test_no_experiment_imports_another():
  """What two experiments share is in `experiments.framework` (or `tfcl_jax`): an experiment
  imports, of `experiments`, its own modules and the framework only (no sibling, no registry)."""
  assert registry.modules()
  found = {module: _reaching_out(module) for module in registry.modules()}
  assert not {module: files for module, files in found.items() if files}


def test_an_unknown_name_lists_the_registered_ones():
  with pytest.raises(KeyError, match="registered: augment_views, dcrec"):
    registry.get("dcrecs")
  assert registry.owner("experiments.grace.probe") is registry.get("grace")


def test_an_experiment_named_other_than_its_module_is_refused(monkeypatch):
  module = types.ModuleType("experiments.dcrec_copy")
  module.EXPERIMENT = registry.get("dcrec")
  monkeypatch.setitem(sys.modules, module.__name__, module)
  with pytest.raises(TypeError, match="named 'dcrec': an experiment is named after its module"):
    registry.load(module.__name__)
  module.EXPERIMENT = None
  with pytest.raises(TypeError, match="binds no EXPERIMENT"):
    registry.load(module.__name__)


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


# -- the worked example of docs/architecture.md, added to a copy of the repository ----------

#: What Python and pytest import from the repository: the copy holds these.
COPIED = ("experiments", "tfcl_jax", "tests", "pyproject.toml")
EXAMPLE = {"experiments/pairs/__init__.py", "experiments/pairs/__main__.py",
           "experiments/configs/pairs.py", "tests/experiments/test_pairs.py"}


def _example_files() -> dict[str, str]:
  """`path -> code` of each file the page's "Adding an experiment" shows (a line naming the
  file in backquotes, then its fenced block)."""
  with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
    page = f.read()
  section = page.split("### Adding an experiment", 1)[1].split("\n### ", 1)[0]
  found = re.findall(r"^`([\w/.]+)`:\n\n```python\n(.*?)```$", section,
                     re.MULTILINE | re.DOTALL)
  return dict(found)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> pathlib.Path:
  """A copy of the repository with the page's experiment added: the files the page lists, each
  new, and nothing else touched."""
  files = _example_files()
  assert set(files) == EXAMPLE
  root = tmp_path_factory.mktemp("repository")
  for name in COPIED:
    source = pathlib.Path(ROOT, name)
    if source.is_dir():
      shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    else:
      shutil.copy2(source, root / name)
  for path, code in files.items():
    assert not (root / path).exists(), f"{path} is in the repository already"
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(code)
  return root


def _run(command: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess:
  # The inner pytest takes none of the outer run's options (CI's coverage threshold).
  env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
  proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  return proc


def test_the_worked_example_is_registered_and_passes_its_tests_and_the_registrys(pairs):
  """In the copy: the example's own test, and the registry's checks of every experiment (found
  by its place, its configs in the one place, no import of another experiment), which now
  include it."""
  checks = [f"tests/experiments/test_registry.py::{name}" for name in (
      "test_every_command_is_an_experiment_found_by_its_place",
      "test_every_config_is_in_experiments_configs_and_belongs_to_one_experiment",
      "test_no_experiment_imports_another")]
  proc = _run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
               "tests/experiments/test_pairs.py", *checks], pairs)
  tests = len(re.findall(r"^def test_", (pairs / "tests/experiments/test_pairs.py").read_text(),
                         re.MULTILINE))
  assert re.search(rf"\b{tests + len(checks)} passed\b", proc.stdout), proc.stdout[-2000:]
  listed = _run([sys.executable, "-c", "from experiments import registry; "
                 "print(registry.modules())"], pairs)
  assert "'experiments.pairs'" in listed.stdout


def test_the_worked_example_runs_from_the_command_line(pairs):
  workdir = pairs / "cli"
  proc = _run([sys.executable, "-m", "experiments.pairs", "--config=experiments/configs/pairs.py",
               f"--workdir={workdir}", "--config.seeds=1", "--config.losses=free"], pairs)
  assert "| free | 0 |" in proc.stdout and f"wrote {workdir}/" in proc.stdout
