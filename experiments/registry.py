"""Every experiment, found by its place: a module or package directly under `experiments/` whose
top level binds `EXPERIMENT = framework.experiment.Experiment(...)` is registered by that line,
beside its own code; there is no list to keep. `experiments.regenerate`, the lowering tests and
the command-line tests read the experiments here; the framework imports none of them.

Listing reads each module's source (`ast`), so it imports nothing; an experiment is imported
when it is asked for.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil

import experiments as _package
from experiments.framework.experiment import Experiment

#: The name a module binds its experiment to: the one line that registers it.
BINDING = "EXPERIMENT"


def _binds_experiment(source: str) -> bool:
  """Whether `source` assigns `EXPERIMENT` at its top level."""
  for node in ast.parse(source).body:
    targets = (node.targets if isinstance(node, ast.Assign) else
               [node.target] if isinstance(node, ast.AnnAssign) else [])
    if any(isinstance(target, ast.Name) and target.id == BINDING for target in targets):
      return True
  return False


def modules() -> list[str]:
  """Every experiment's module (`"experiments.grace"`), sorted: the modules and packages of
  `experiments/` whose source (a package's `__init__.py`) binds `EXPERIMENT`."""
  found = []
  for info in pkgutil.iter_modules(_package.__path__, prefix="experiments."):
    spec = importlib.util.find_spec(info.name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
      continue
    with open(spec.origin, encoding="utf-8") as f:
      if _binds_experiment(f.read()):
        found.append(info.name)
  return sorted(found)


def load(module: str) -> Experiment:
  """The `EXPERIMENT` of `module` (imported on first use: listing costs no import).

  Raises:
    TypeError: `module` binds no `Experiment`, or one named other than the module.
  """
  experiment = getattr(importlib.import_module(module), BINDING, None)
  if not isinstance(experiment, Experiment):
    raise TypeError(f"{module} binds no EXPERIMENT (an experiments.framework.experiment."
                    f"Experiment), got {type(experiment).__name__}.")
  if module != f"experiments.{experiment.name}":
    raise TypeError(f"{module}'s EXPERIMENT is named {experiment.name!r}: an experiment is "
                    f"named after its module (python -m {module}).")
  return experiment


def experiments() -> dict[str, Experiment]:
  """Module -> experiment, for every module of `modules()`."""
  return {module: load(module) for module in modules()}


def get(name: str) -> Experiment:
  """The experiment called `name` (`"grace"`: the module `experiments.grace`).

  Raises:
    KeyError: no experiment has that name; lists the names.
  """
  found = modules()
  if f"experiments.{name}" not in found:
    names = ", ".join(module.removeprefix("experiments.") for module in found)
    raise KeyError(f"no experiment {name!r}; registered: {names}.")
  return load(f"experiments.{name}")


def owner(module: str) -> Experiment:
  """The experiment that `python -m module` belongs to: its own module, or one of its other
  commands (`Experiment.command_tables`).

  Raises:
    KeyError: no registered experiment runs `module`.
  """
  for name, experiment in experiments().items():
    if module == name or module in experiment.command_tables:
      return experiment
  raise KeyError(f"no registered experiment runs python -m {module}.")
