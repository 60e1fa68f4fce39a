"""The command line every experiment shares: `--config=FILE --workdir=DIR [--config.field=value]`.

`python -m experiments.NAME` parses the flags, calls the experiment's `check_config(config)`
(every check that needs no data), then its `train_and_evaluate(config, workdir)`, and prints
the table it wrote. Flags are defined when an experiment runs as a script, not when it is
imported, so the tests can import every experiment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging as std_logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from experiments.framework import plan, tables
from experiments.framework import workdir as workdirs
from tfcl_jax.training import files, preemption

#: Exit status of a command stopped by SIGTERM after saving its checkpoint (128 + SIGTERM, as a
#: shell reports a terminated job; batch schedulers requeue on it).
PREEMPTED_STATUS = 143


def run_main(
    train_and_evaluate: Callable[[object, str], object],
    *,
    check_config: Callable[[object], object],
    usage: str,
    default_config: str | None = None,
    quiet_logs: bool = True,
) -> None:
  """Parses the flags, then calls `check_config(config)` and `train_and_evaluate(config,
  workdir)`.

  Args:
    train_and_evaluate: the experiment.
    check_config: the experiment's checks of its config that need no data; raises
      `plan.ConfigError` naming the field.
    usage: one line shown when `--config` or `--workdir` is missing.
    default_config: config file used when `--config` is not given.
    quiet_logs: lower absl logging to WARNING (orbax logs every save at INFO).

  The steps, in the order they run: `define_flags`, `parse_flags` (absl's parser: `--help`, or
  the config file run once and the flags parsed), then in `main` `read_flags`, `set_log_levels`,
  `check_config` under `config_errors_exit`, `start_distributed`, `train_and_evaluate` under
  `training_exits`, and `print_summary`; Ctrl-C anywhere ends in `interrupted`.

  How a command ends, each with one line on stderr: a user's mistake (`plan.ConfigError`),
  exit 2; a full disk (`ENOSPC`, `EDQUOT`) naming the file, or a non-finite loss naming the
  step and the run, exit 1; Ctrl-C after the checkpoint of the current step, exit 130;
  SIGTERM (preemption) likewise, exit `PREEMPTED_STATUS` (143). The workdir's lock
  (`workdir.acquire`) is released on every way out. Rerunning the same command resumes.
  """
  from absl import app

  command_flags = define_flags()

  def main(argv: list[str]) -> None:
    config, workdir = read_flags(argv, command_flags, usage=usage)
    set_log_levels(quiet_logs)
    with config_errors_exit():
      check_config(config)
    start_distributed(command_flags)
    with training_exits():
      train_and_evaluate(config, workdir)
    print_summary(workdir)

  try:
    app.run(main, flags_parser=functools.partial(parse_flags, usage=usage,
                                                 default_config=default_config))
  except KeyboardInterrupt:
    interrupted()


@dataclasses.dataclass(frozen=True)
class CommandFlags:
  """The command line's own flags (absl's `FlagHolder`s), beside `--config`."""

  workdir: Any
  distributed: Any
  coordinator_address: Any
  num_processes: Any
  process_id: Any


def define_flags() -> CommandFlags:
  """Defines `--workdir` and the flags of a multi-host run (`--config` comes with its file)."""
  from absl import flags

  return CommandFlags(
      workdir=flags.DEFINE_string("workdir", None, "output directory"),
      distributed=flags.DEFINE_bool(
          "distributed", False, "call jax.distributed.initialize() first (one process per host; "
          "SLURM, Open MPI and TPU pods are detected, else give the three flags below)"),
      coordinator_address=flags.DEFINE_string("coordinator_address", None,
                                               "host:port of process 0"),
      num_processes=flags.DEFINE_integer("num_processes", None, "processes in the job"),
      process_id=flags.DEFINE_integer("process_id", None, "this process's index"))


def parse_flags(argv: list[str], *, usage: str, default_config: str | None) -> list[str]:
  """absl's flag parser: `--help` printed, or the config file run once, its overrides checked
  and every flag parsed; a bad flag or config is one line on stderr, exit 2."""
  from absl import flags
  from ml_collections import config_flags

  if any(arg in ("-h", "--help", "--helpshort") for arg in argv[1:]):
    try:
      print(help_text(argv, usage=usage, default_config=default_config), flush=True)
    except BrokenPipeError:  # `--help | head`: the reader has all it wants
      os._exit(0)
    sys.exit(0)
  try:
    # The config file runs once: its fields checked here, then overridden by the flags.
    path = _config_path(argv, default_config)
    config = None
    if path is not None and os.path.isfile(path.partition(":")[0]):
      config = load_config(path)
    problem = check_overrides(argv, default_config=default_config, config=config)
    if problem:
      _exit(problem, 2)
    argv = _without_config_file(argv)
    if config is not None:  # `--config.FIELD=VALUE` overrides its fields
      config_flags.DEFINE_config_dict("config", config, "experiment config file", sys_argv=argv)
    return flags.FLAGS(argv)
  except (flags.Error, ValueError, TypeError, AttributeError, KeyError, OSError) as error:
    _exit(error, 2)


def read_flags(argv: list[str], command_flags: CommandFlags, *, usage: str) -> tuple[Any, str]:
  """The parsed config and the workdir; absl's usage error when either is missing."""
  from absl import app, flags

  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; {usage}")
  config = flags.FLAGS["config"] if "config" in flags.FLAGS else None
  if config is None or not command_flags.workdir.value:
    raise app.UsageError(usage)
  return config.value, command_flags.workdir.value


def set_log_levels(quiet_logs: bool) -> None:
  """absl's logging at WARNING if `quiet_logs`; JAX's probe of absent backends at WARNING."""
  from absl import logging

  if quiet_logs:
    logging.set_verbosity(logging.WARNING)
  # JAX's probe of absent backends ("Unable to initialize backend 'tpu'") is INFO, not a fault.
  std_logging.getLogger("jax._src.xla_bridge").setLevel(std_logging.WARNING)


@contextlib.contextmanager
def config_errors_exit() -> Iterator[None]:
  """A `plan.ConfigError` inside becomes its one line on stderr and exit 2."""
  try:
    yield
  except plan.ConfigError as error:
    _exit(error, 2)


def start_distributed(command_flags: CommandFlags) -> None:
  """`jax.distributed.initialize` when `--distributed` or `--coordinator_address` asks for it."""
  if not (command_flags.distributed.value or command_flags.coordinator_address.value):
    return
  import jax  # noqa: PLC0415

  try:
    jax.distributed.initialize(command_flags.coordinator_address.value,
                               command_flags.num_processes.value, command_flags.process_id.value)
  except ValueError as error:  # no cluster detected and no coordinator given
    _exit(f"--distributed: {error} (no cluster was detected: pass --coordinator_address, "
          "--num_processes and --process_id)", 2)


@contextlib.contextmanager
def training_exits() -> Iterator[None]:
  """Each way training ends early becomes one line on stderr and its exit status; the
  workdir's lock is released on every way out."""
  try:
    yield
  except plan.ConfigError as error:
    _exit(error, 2)
  except preemption.Preempted as error:  # SIGTERM: the checkpoint of error.step is on disk
    workdirs.release()
    print(f"stopped: {error}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(PREEMPTED_STATUS)  # as for Ctrl-C: no interpreter shutdown mid-prefetch
  except FloatingPointError as error:  # a non-finite loss or gradient, step and run named
    _exit(error, 1)
  except Exception as error:  # a full disk met by any writer, orbax's included
    if not files.is_disk_full(error):
      raise
    if not isinstance(error, files.DiskFull):
      error = files.DiskFull.of(error, getattr(error, "filename", None) or "a file",
                                "the files written before are kept")
    _exit(error, 1)
  finally:
    workdirs.release()


def print_summary(workdir: str) -> None:
  """Prints `summary(workdir)` on the first process."""
  import jax  # noqa: PLC0415

  if jax.process_index() == 0:
    print(summary(workdir))


def interrupted() -> None:
  """Ctrl-C: the lock released, one line on stderr, exit 130 without interpreter shutdown."""
  workdirs.release()  # os._exit below skips the atexit hook that would
  print("interrupted: finished runs and the last checkpoint are on disk; rerun the same "
        "command to resume.", file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  # Not sys.exit: interpreter shutdown would join the loader's prefetch threads and the
  # checkpointer's event loop mid-step and print their noise after the line above.
  os._exit(130)


def _exit(error: object, status: int) -> NoReturn:
  """`error: ...` on stderr, then exit `status`."""
  print(f"error: {error}", file=sys.stderr)
  sys.exit(status)


def summary(workdir: str) -> str:
  """What a finished command prints: its results table (`results.md`) and the files it wrote."""
  lines = []
  table = os.path.join(workdir, "results.md")
  if os.path.isfile(table):
    with open(table) as f:
      lines += [f.read().rstrip(), ""]
  names = sorted(name for name in os.listdir(workdir) if not name.startswith(".")) if (
      os.path.isdir(workdir)) else []  # not the lock, nor a temporary file a kill left
  lines.append(f"wrote {os.path.abspath(workdir)}/: " + (", ".join(
      name + ("/" if os.path.isdir(os.path.join(workdir, name)) else "") for name in names)
      or "nothing"))
  return "\n".join(lines)


def _config_path(argv: list[str], default_config: str | None) -> str | None:
  for index, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.split("=", 1)[1]
    if arg == "--config" and index + 1 < len(argv):
      return argv[index + 1]
  return default_config


def _without_config_file(argv: list[str]) -> list[str]:
  """`argv` without `--config=FILE` (or `--config FILE`): the file is read already."""
  kept, skip = [], False
  for index, arg in enumerate(argv):
    if skip:
      skip = False
    elif arg.startswith("--config="):
      continue
    elif arg == "--config" and index + 1 < len(argv):
      skip = True
    else:
      kept.append(arg)
  return kept


def load_config(path: str):
  """`get_config()` of a config file (`FILE` or `FILE:ARG`), as `--config` loads it."""
  import importlib.util  # noqa: PLC0415

  path, _, arg = path.partition(":")
  spec = importlib.util.spec_from_file_location("_experiment_config", path)
  if spec is None or not path.endswith(".py"):
    raise FileNotFoundError(f"--config={path}: not a Python config file.")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _fields(config, prefix: str = "") -> dict[str, object]:
  """Every field of a ConfigDict, nested ones dotted, with its value."""
  out = {}
  for name, value in config.items():
    if hasattr(value, "items") and not isinstance(value, dict):
      out.update(_fields(value, f"{prefix}{name}."))
    else:
      out[f"{prefix}{name}"] = value
  return out


def check_overrides(argv: list[str], *, default_config: str | None = None,
                    config=None) -> str | None:
  """A one-line problem with the `--config.FIELD=VALUE` overrides in `argv`, or None.

  Names an unknown field with the closest known ones (`difflib`), a missing config file, and
  a negative value for an int field whose default is >= 0. `config`: the config file's
  `get_config()` where it is loaded already (else it is loaded here).
  """
  import difflib  # noqa: PLC0415

  values = dict(arg[len("--config."):].partition("=")[::2] for arg in argv
                if arg.startswith("--config."))
  overrides = list(values)
  path = _config_path(argv, default_config)
  if path is None:
    return None  # main() says --config is missing
  if not os.path.isfile(path.partition(":")[0]):
    return f"--config={path}: no such file."
  if not overrides:
    return None
  fields = _fields(load_config(path) if config is None else config)
  for name in overrides:
    if name not in fields:
      initials = [f for f in fields
                  if "".join(part[:1] for part in f.split(".")[-1].split("_")) == name]
      close = list(dict.fromkeys(
          initials + difflib.get_close_matches(name, list(fields), n=3, cutoff=0.5)))[:3]
      hint = f"; did you mean {', '.join(close)}?" if close else ""
      return (f"unknown config field {name!r}{hint} (`--help` lists the fields of "
              f"{path.partition(':')[0]})")
    default = fields[name]
    if isinstance(default, int) and not isinstance(default, bool) and default >= 0:
      try:
        value = int(values[name])
      except ValueError:
        continue  # not an int: the flag parser names it
      if value < 0:  # a count, a size, a period or an index: none of them is negative
        return f"config.{name} must be >= 0 (its default is {default}), got {value}."
  return None


def help_text(argv: list[str], *, usage: str, default_config: str | None = None) -> str:
  """Usage, the common flags, and every config field with its default."""
  module = tables.main_module()
  command = f"python -m {module}" if module else f"python {os.path.relpath(sys.argv[0])}"
  lines = [f"usage: {command} --config=FILE "
           "--workdir=DIR [--config.FIELD=VALUE ...]", f"  ({usage})", "",
           "  --distributed | --coordinator_address=HOST:PORT --num_processes=N --process_id=I",
           "      run as one process of a multi-host job (jax.distributed.initialize)", ""]
  path = _config_path(argv, default_config)
  if path is None:
    lines.append("config fields: pass --config=FILE --help to list them.")
  else:
    lines.append(f"config fields of {path} (override with --config.FIELD=VALUE):")
    for name, value in _fields(load_config(path)).items():
      lines.append(f"  {name} = {value!r}")
  return "\n".join(lines)
