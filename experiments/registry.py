"""Every experiment, one line each: the list that `experiments.regenerate`, the lowering tests and
the command-line tests read. The framework imports no experiment; this list names them all.

A new experiment is a module or folder under `experiments/` that binds
`EXPERIMENT = framework.experiment.Experiment(...)`, and its line in `MODULES`.
"""

from __future__ import annotations

import importlib

from experiments.framework.experiment import Experiment

MODULES = [
    "experiments.simclr",
    "experiments.msc",
    "experiments.grace",
    "experiments.dcrec",
    "experiments.retrieval",
    "experiments.augment_views",
    "experiments.gradient_scales",
    "experiments.hard_negatives",
    "experiments.learnable_vs_free",
    "experiments.sphere",
]


def load(module: str) -> Experiment:
  """The `EXPERIMENT` of `module` (imported on first use: listing costs no import)."""
  experiment = getattr(importlib.import_module(module), "EXPERIMENT", None)
  if not isinstance(experiment, Experiment):
    raise TypeError(f"{module} binds no EXPERIMENT (an experiments.framework.experiment."
                    f"Experiment), got {type(experiment).__name__}.")
  return experiment


def experiments() -> dict[str, Experiment]:
  """Module -> experiment, for every line of `MODULES`."""
  return {module: load(module) for module in MODULES}


def get(name: str) -> Experiment:
  """The experiment called `name` (`"grace"`).

  Raises:
    KeyError: no experiment of `MODULES` has that name; lists the names.
  """
  found = {experiment.name: experiment for experiment in experiments().values()}
  if name not in found:
    raise KeyError(f"no experiment {name!r}; registered: {', '.join(sorted(found))}.")
  return found[name]


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
