"""SimCLR with fixed, learnable or temperature-free InfoNCE: Section 5.1, Table 2 of the paper.

  python -m experiments.simclr --config=experiments/configs/simclr_digits.py --workdir=DIR \
    [--config.losses=tau=0.1,free --config.seeds=3 --config.epochs=20 --config.batch_size=256]

Trains one run per (loss spec, seed) (or per (batch size, loss spec, seed) with
`--config.mode=n_sensitivity`) with `tfcl_jax.training`, each in `DIR/runs/...`, and writes
`DIR/results.csv`, `DIR/results.md` and PNG plots (`experiments/simclr_report.py`); the
runs are `experiments/simclr_trainer.py`, shared with MSC's pretraining.
Everything a run needs is checked before the first step; rerunning the command continues the
workdir (`experiments/runner.py`: finished runs kept, an interrupted one resumed from its last
checkpoint, a workdir made with another config refused; more seeds or losses may be added).
"""

from __future__ import annotations

import jax
import ml_collections

from experiments import cli, runner, simclr_report, simclr_trainer, tables
from tfcl_jax.training import sharding

ConfigError = runner.ConfigError


def run_experiment(config: ml_collections.ConfigDict, workdir: str, *,
                   command: str | None = None) -> list[dict]:
  """Checks everything, trains every run not yet finished, writes results and plots."""
  command = tables.command_line() if command is None else command
  mesh = sharding.make_mesh(jax.devices()[:config.devices] if config.devices else None)
  try:
    runs = simclr_trainer.check_config(config, mesh)
  except (ValueError, TypeError) as error:  # includes data.DatasetNotPreparedError
    raise ConfigError(str(error)) from error
  trainer = simclr_trainer.Trainer(config, mesh)
  run_dirs = [run.directory(workdir) for run in runs]
  return runner.sweep(
      config, workdir, runs=runs, plan_fields=simclr_trainer.PLAN_FIELDS,
      train_run=lambda run: trainer.run(run, workdir), progress=config.progress,
      write_tables=lambda results: simclr_report.write(
          results, workdir, config=config, command=command, run_dirs=run_dirs[:len(results)],
          figures=len(results) == len(runs)))


if __name__ == "__main__":
  cli.run_main(run_experiment, user_errors=(ConfigError,),
               usage="pass --config=experiments/configs/simclr_digits.py --workdir=DIR")


results_markdown = simclr_report.results_markdown
