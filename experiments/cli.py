"""The command line every experiment shares: `--config=FILE --workdir=DIR [--config.field=value]`.

Flags are defined when an experiment runs as a script, not when it is imported, so experiments
can import each other (MSC pretrains with SimCLR) and the tests can import them all.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class ConfigError(ValueError):
  """A config, dataset, checkpoint or workdir problem found before training (printed, no trace)."""


def run_main(
    run: Callable[[object, str], object],
    *,
    usage: str,
    default_config: str | None = None,
    workdir_aliases: tuple[str, ...] = (),
    quiet_logs: bool = True,
    user_errors: tuple[type[Exception], ...] = (),
) -> None:
  """Parses the flags and calls `run(config, workdir)`.

  Args:
    run: the experiment.
    usage: one line shown when `--config` or `--workdir` is missing.
    default_config: config file used when `--config` is not given.
    workdir_aliases: other names for `--workdir` (e.g. `out`).
    quiet_logs: lower absl logging to WARNING (orbax logs every save at INFO).
    user_errors: exception types that are the user's mistake: printed as one line, exit 2.
  """
  from absl import app, flags, logging
  from ml_collections import config_flags

  config = config_flags.DEFINE_config_file("config", default_config, "experiment config file")
  workdir = flags.DEFINE_string("workdir", None, "output directory")
  for alias in workdir_aliases:
    flags.DEFINE_alias(alias, "workdir")
  distributed = flags.DEFINE_bool(
      "distributed", False, "call jax.distributed.initialize() first (one process per host; "
      "SLURM, Open MPI and TPU pods are detected, else give the three flags below)")
  coordinator = flags.DEFINE_string("coordinator_address", None, "host:port of process 0")
  num_processes = flags.DEFINE_integer("num_processes", None, "processes in the job")
  process_id = flags.DEFINE_integer("process_id", None, "this process's index")

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments {argv[1:]}; {usage}")
    if config.value is None or not workdir.value:
      raise app.UsageError(usage)
    if quiet_logs:
      logging.set_verbosity(logging.WARNING)
    if distributed.value or coordinator.value:
      import jax  # noqa: PLC0415

      try:
        jax.distributed.initialize(coordinator.value, num_processes.value, process_id.value)
      except ValueError as error:  # no cluster detected and no coordinator given
        print(f"error: --distributed: {error} (no cluster was detected: pass "
              "--coordinator_address, --num_processes and --process_id)", file=sys.stderr)
        sys.exit(2)
    try:
      run(config.value, workdir.value)
    except user_errors as error:
      print(f"error: {error}", file=sys.stderr)
      sys.exit(2)

  app.run(main)
