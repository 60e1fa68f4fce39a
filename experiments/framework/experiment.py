"""What an experiment declares to the framework (`Experiment`): its name, its kind, its configs,
`train_and_evaluate`, and what `experiments.regenerate` and the lowering tests call.

Each experiment binds one as `EXPERIMENT` in its module (or its package's `__init__`), which
registers it (`experiments.registry` finds the modules of `experiments/` that bind one), and
runs it with `EXPERIMENT.main()` under `python -m`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

from experiments.framework import cli

#: A sweep trains the runs of its plan (`sweep.sweep`); a study computes its tables in one go
#: (`sweep.study`). Both hold their workdir's lock and record their config there.
Kind = Literal["sweep", "study"]


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One experiment: `python -m experiments.<name> --config=FILE --workdir=DIR`.

  Attributes:
    name: its name under `experiments` (`"grace"` for `python -m experiments.grace`).
    kind: `"sweep"` or `"study"` (`Kind`).
    train_and_evaluate: `(config, workdir) -> rows`, after `check_config` passed.
    check_config: `(config) -> None`, every check that needs no data; raises
      `plan.ConfigError` naming the field.
    configs: its config files, from the repository root (`experiments/configs/NAME.py`, the
      one place of every experiment's configs); the first is the one the usage line, the
      command-line tests and the lowering tests take.
    default_config: the config file used when `--config` is not given (or None).
    results_markdown: `(rows, config, command) -> str`, its `results.md` from its
      `results.csv` rows: what `experiments.regenerate` rebuilds a committed table with.
    abstract_step: `(config, mesh, *, spec=...) -> (jitted_step, (state, batch, key))` with
      shapes only: its train step to lower for another platform (`tests/cross/test_lowering.py`).
    reads_files: whether `config.data_dir` names files the user supplies.
    command_tables: the tables of its other commands, by module (`"experiments.grace.probe"`):
      `table(rows, command=..., name=..., committed=...) -> str`, where `committed(name)`
      gives `(rows, config)` of another committed table.
  """

  name: str
  kind: Kind
  train_and_evaluate: Callable[[Any, str], Any]
  check_config: Callable[[Any], None]
  configs: tuple[str, ...]
  default_config: str | None = None
  results_markdown: Callable[..., str] | None = None
  abstract_step: Callable[..., tuple] | None = None
  reads_files: bool = False
  command_tables: Mapping[str, Callable[..., str]] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.kind not in get_args(Kind):
      raise ValueError(f"Experiment {self.name!r}: kind must be one of {get_args(Kind)}, got "
                       f"{self.kind!r}.")
    if not self.configs:
      raise ValueError(f"Experiment {self.name!r} names no config file.")

  def usage(self) -> str:
    if self.default_config is not None:
      return "pass --workdir=DIR [--config=FILE]"
    return f"pass --config={self.configs[0]} --workdir=DIR"

  def main(self) -> None:
    """The command line (`cli.run_main`): what `python -m experiments.<name>` runs."""
    cli.run_main(self.train_and_evaluate, check_config=self.check_config, usage=self.usage(),
                 default_config=self.default_config)
