"""The skeleton of every sweep: plan the runs from a config, resume them, write the tables.

An experiment supplies only what is its own: its data, its model and objective, how it trains
one `Run` and what it measures (`train_run(run) -> result row`), and its table
(`write_tables(rows)`). The skeleton does the rest, the same way for all of them:

- `plan`: the runs of a config: every loss spec of `config.losses` (`losses.canonical_spec`),
  every seed (`config.seeds`, from `config.seed_offset`), and the axes an experiment adds
  (a batch size, a normal class), in the experiment's order;
- one folder per run, `runs/<spec>[/<axis>_<value>...]/seed<seed>` (`Run.directory`);
- `prepare`: a workdir made with another config is refused before anything runs, naming the
  differing fields; the fields that only choose which runs exist (losses, seeds, ...) may
  change, so a sweep grows by rerunning it with more seeds. Run folders of an earlier layout
  are found and, with `--migrate`, moved to their place;
- `run_all`: a finished run leaves `result.json` in its folder and is never recomputed; an
  interrupted run continues from its last step checkpoint (`tfcl_jax.training.train`); the
  tables are rewritten after every finished run, so an interrupted sweep leaves the finished
  part of its table on disk;
- `finished_runs`: a finished workdir read back (what `grace_probe` probes);
- every results file is written whole or not at all (`tables.atomic_open`): a `result.json`
  that does not parse (a copy from before that rule, or a damaged disk) is not finished and
  the run is redone, with a one-line notice;
- one sweep at a time per workdir: `prepare` takes `workdir/.lock` (pid, host, start time);
  another sweep on it is refused, naming the holder; a lock whose holder died on this host is
  taken over with a notice; `sweep`, the command line and process exit release it.

The command line (`experiments.cli`) prints the final table and the files written.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import dataclasses
import datetime
import itertools
import json
import math
import numbers
import os
import re
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

from experiments import tables
from tfcl_jax.training import loop

RESULT_FILE = "result.json"
LOCK_FILE = ".lock"
RUNS_DIR = "runs"
LOSSES_FIELD, OLD_LOSSES_FIELD = "losses", "mappings"
_MIGRATE = contextvars.ContextVar("migrate", default=False)
_NOTICES: set = set()  # (field, value) pairs already noticed in this process
# Config fields added after workdirs were first recorded, with the value that reproduces the
# earlier behaviour: records leave them out at that value, so those workdirs still resume.
ADDED_FIELDS = {"objective": "simclr"}


class ConfigError(ValueError):
  """A config, dataset, checkpoint or workdir problem found before training: the command line
  prints it as one line and exits 2."""


class ConfigTypeError(ConfigError, TypeError):
  """A config field of the wrong type (a `ConfigError` that is also a `TypeError`)."""


MAX_RUNS = 100_000  # a plan larger than this is a typo (seeds=1e9), not a sweep


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of a sweep: its loss spec (canonical), its seed, and the axes an experiment adds,
  e.g. `(("batch_size", 256),)`.

  Examples:
    >>> from experiments.runner import Run
    >>> run = Run("sigmoid/tau=0.5/learn_b=prior", 3, (("batch_size", 256),))
    >>> run.directory("w"), run["batch_size"]
    ('w/runs/sigmoid_tau_0.5_learn_b_prior/batch_size_256/seed3', 256)
  """

  spec: str
  seed: int
  axes: tuple[tuple[str, Any], ...] = ()

  def __getitem__(self, name: str):
    return dict(self.axes)[name]

  def record(self) -> dict[str, Any]:
    """The run's identity as its folder's `config.json` records it."""
    return {"spec": self.spec, "seed": self.seed, **dict(self.axes)}

  def directory(self, workdir: str) -> str:
    axes = [f"{name}_{_safe(value)}" for name, value in self.axes]
    return os.path.join(workdir, RUNS_DIR, _safe(self.spec), *axes, f"seed{self.seed}")

  def label(self) -> str:
    return " ".join([self.spec, f"seed {self.seed}"] + [f"{n}={v}" for n, v in self.axes])


def _safe(value) -> str:
  return re.sub(r"[^A-Za-z0-9.]+", "_", str(value))


# -- config fields ----------------------------------------------------------------------------


def split_list(text, *, name: str) -> list[str]:
  """The items of a comma list config field (`"tau=0.1, free"`), at least one.

  Raises:
    ValueError: the list is empty; names `config.<name>`.
  """
  items = [item.strip() for item in str(text).split(",") if item.strip()]
  if not items:
    raise ValueError(f"config.{name} must list at least one item, got {text!r}.")
  return items


def check_positive_ints(config, *fields: str) -> None:
  """Each `config.<field>` is an int >= 1.

  Raises:
    ConfigError (a ValueError), ConfigTypeError (a TypeError): naming the first field that is
      not.
  """
  for field in fields:
    value = config[field]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      raise ConfigTypeError(f"config.{field} must be an int >= 1, got {value!r}.")
    if value < 1:
      raise ConfigError(f"config.{field} must be an int >= 1, got {value!r}.")


def check_fields(config, *, positive: Sequence[str] = (), non_negative: Sequence[str] = (),
                 positive_numbers: Sequence[str] = (), non_negative_numbers: Sequence[str] = (),
                 fractions: Sequence[str] = (), choices: Mapping[str, Sequence] | None = None
                 ) -> None:
  """Checks the types and ranges of a config's fields, without reading data or a workdir.

  Every experiment calls this first (`check_config`), so a bad field is named whatever the
  environment holds: before its data is opened, its workdir created or a device touched.

  Args:
    config: the ConfigDict.
    positive: ints >= 1 (counts, sizes, periods).
    non_negative: ints >= 0 (offsets, minimums where 0 means none).
    positive_numbers: finite numbers > 0 (learning rates, ratios).
    non_negative_numbers: finite numbers >= 0 (loss weights, weight decay).
    fractions: numbers in [0, 1) (dropout and masking rates).
    choices: field -> the values it may take.

  Raises:
    ConfigTypeError: a field of the wrong type, naming it.
    ConfigError: a value out of its range or not among its choices, naming the field.

  Examples:
    >>> import ml_collections
    >>> from experiments import runner
    >>> config = ml_collections.ConfigDict({"epochs": 0, "dropout": 0.1})
    >>> runner.check_fields(config, positive=("epochs",), fractions=("dropout",))
    Traceback (most recent call last):
    ...
    experiments.runner.ConfigError: config.epochs must be an int >= 1, got 0.
  """
  check_positive_ints(config, *positive)
  for field in non_negative:
    value = config[field]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      raise ConfigTypeError(f"config.{field} must be an int >= 0, got {value!r}.")
    if value < 0:
      raise ConfigError(f"config.{field} must be an int >= 0, got {value!r}.")
  ranges = ([(field, "> 0", lambda v: v > 0) for field in positive_numbers]
            + [(field, ">= 0", lambda v: v >= 0) for field in non_negative_numbers]
            + [(field, "in [0, 1)", lambda v: 0 <= v < 1) for field in fractions])
  for field, text, ok in ranges:
    value = config[field]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      raise ConfigTypeError(f"config.{field} must be a number {text}, got {value!r}.")
    if not (math.isfinite(value) and ok(value)):
      raise ConfigError(f"config.{field} must be a number {text}, got {value!r}.")
  for field, allowed in (choices or {}).items():
    if config[field] not in allowed:
      raise ConfigError(f"config.{field} must be one of {', '.join(map(repr, allowed))}, got "
                        f"{config[field]!r}.")


def renamed(config, field: str, old: str):
  """`config.<field>`, or `config.<old>` where a command still sets the field's former name
  (with a one-line notice on stderr)."""
  value = config.get(old) if old in config else None
  if value:
    if (old, value) not in _NOTICES:
      _NOTICES.add((old, value))
      print(f"note: config.{old} is now config.{field}; reading config.{old}={value!r}",
            file=sys.stderr)
    return value
  return config[field]


def loss_specs(config, *, example: str, field: str = LOSSES_FIELD,
               old: str | None = OLD_LOSSES_FIELD) -> list[str]:
  """The canonical loss specs (`tfcl_jax.losses.canonical_spec`) of `config.<field>`, each
  once, in order: the one parser of every experiment's losses (`free`, `tau=0.5`,
  `sigmoid/learnable=0.1/learn_b=siglip`, ...).

  Raises:
    ValueError: an empty list or a malformed spec; the message names `config.<field>` and
      shows `example` (e.g. `"free,tau=0.5"`).
  """
  from tfcl_jax import losses  # noqa: PLC0415

  text = renamed(config, field, old) if old else config[field]
  try:
    return list(dict.fromkeys(losses.canonical_spec(spec)
                              for spec in split_list(text, name=field)))
  except ValueError as error:
    message = str(error)
    if message.startswith("config."):
      raise
    raise ValueError(f"config.{field}: {message} (e.g. --config.{field}={example})") from error


def plan(config, *, order: Sequence[str] = ("seed", "spec"),
         axes: Mapping[str, Sequence] | None = None, specs: Sequence[str] | None = None,
         example: str = "free,tau=0.5", positive_ints: Sequence[str] = ()) -> list[Run]:
  """The runs of `config`: every spec × seed × axis value, nested in `order` (the first name
  varies slowest; e.g. `("seed", "spec")`: seed-major, so an interrupted sweep has as many
  seeds of every spec).

  Args:
    config: with `losses` (or `specs` given), `seeds` and optionally `seed_offset`.
    order: `"spec"`, `"seed"` and the names of `axes`.
    axes: the experiment's own axes, name -> values.
    specs: the canonical specs, when the experiment reads them itself.
    example: shown in the error for a bad `config.losses`.
    positive_ints: more fields the experiment needs to be ints >= 1 (epochs, batch size...).

  Raises:
    ConfigError: a bad `config.losses`, `config.seeds` or `positive_ints` field, naming it.
  """
  axes = dict(axes or {})
  if sorted(order) != sorted(["spec", "seed", *axes]):
    raise ValueError(f"order must name 'spec', 'seed' and the axes {sorted(axes)}, got {order}.")
  try:
    specs = loss_specs(config, example=example) if specs is None else list(specs)
    check_positive_ints(config, "seeds", *positive_ints)
  except (TypeError, ValueError) as error:
    raise ConfigError(str(error)) from error
  count = len(specs) * config.seeds * math.prod(len(values) for values in axes.values())
  if count > MAX_RUNS:
    raise ConfigError(f"config.seeds={config.seeds} plans {count} runs (losses x seeds x axes), "
                      f"more than {MAX_RUNS}.")
  first = int(config.get("seed_offset", 0))
  values = {"spec": specs, "seed": list(range(first, first + config.seeds)), **axes}
  runs = []
  for combination in itertools.product(*(values[name] for name in order)):
    named = dict(zip(order, combination, strict=True))
    runs.append(Run(named["spec"], named["seed"], tuple((name, named[name]) for name in axes)))
  return runs


# -- the workdir ------------------------------------------------------------------------------


def without_added(record: dict) -> dict:
  """`record` without the `ADDED_FIELDS` that hold their earlier-behaviour value.

  Examples:
    >>> from experiments import runner
    >>> runner.without_added({"objective": "simclr", "epochs": 3})
    {'epochs': 3}
    >>> runner.without_added({"objective": "supcon", "epochs": 3})
    {'objective': 'supcon', 'epochs': 3}
  """
  return {k: v for k, v in record.items()
          if not (k in ADDED_FIELDS and v == ADDED_FIELDS[k])}


@contextlib.contextmanager
def migrating(enabled: bool = True) -> Iterator[None]:
  """Within it, `prepare` moves run folders of an earlier layout instead of refusing them
  (the command line's `--migrate`)."""
  token = _MIGRATE.set(enabled)
  try:
    yield
  finally:
    _MIGRATE.reset(token)


def _run_folders(workdir: str) -> Iterator[str]:
  """Every folder under `workdir/runs` that a run started (it holds the run's `config.json`)."""
  for folder, subfolders, files in os.walk(os.path.join(workdir, RUNS_DIR)):
    if loop.CONFIG_FILE in files:
      subfolders.clear()
      yield folder


def _identity(record: dict, axis_names: Sequence[str]) -> Run | None:
  """The `Run` a run folder's `config.json` records (`spec`, or the former `mapping`)."""
  from tfcl_jax import losses  # noqa: PLC0415

  spec, seed = record.get("spec", record.get("mapping")), record.get("seed")
  if not isinstance(spec, str) or not isinstance(seed, int):
    return None
  try:
    spec = losses.canonical_spec(spec)
  except ValueError:
    return None
  return Run(spec, seed, tuple((name, record.get(name)) for name in axis_names))


def _read_record(folder: str) -> dict:
  """A run folder's `config.json`; {} (no identity) for one a kill cut short."""
  try:
    with open(os.path.join(folder, loop.CONFIG_FILE)) as f:
      record = json.load(f)
  except ValueError:
    return {}
  return record if isinstance(record, dict) else {}


def misplaced(workdir: str, runs: Sequence[Run]) -> list[tuple[str, Run]]:
  """`(folder, run)` for each planned run whose folder in `workdir` is not `run.directory`
  (a workdir of an earlier folder layout)."""
  planned = {run: run for run in runs}
  axis_names = [name for name, _ in runs[0].axes] if runs else []
  moves = []
  for folder in _run_folders(workdir):
    run = planned.get(_identity(_read_record(folder), axis_names))
    if run is not None and os.path.normpath(folder) != os.path.normpath(run.directory(workdir)):
      moves.append((folder, run))
  return moves


def migrate(moves: Sequence[tuple[str, Run]], workdir: str) -> None:
  """Moves each folder to its run's directory and records the run's identity there."""
  for folder, run in moves:
    target = run.directory(workdir)
    if os.path.exists(target):
      raise ConfigError(f"cannot move {folder} to {target}: it exists; move it by hand.")
    os.renames(folder, target)
    record = _read_record(target)
    if "mapping" in record and "spec" not in record:
      record["spec"] = record.pop("mapping")
    with tables.atomic_open(os.path.join(target, loop.CONFIG_FILE)) as f:
      json.dump(record, f, indent=2, sort_keys=True)


# -- one sweep per workdir --------------------------------------------------------------------

_HELD: set = set()  # lock paths this process holds


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's live process
    return True
  return True


def acquire(workdir: str) -> None:
  """Takes `workdir/.lock` for this process (a second call is a no-op).

  The lock records the holder's pid, host and start time, created with `O_CREAT | O_EXCL`. A
  lock whose holder is no longer alive on this host (a killed sweep) is taken over with a
  one-line notice on stderr; a lock that does not parse was cut short by such a kill and is
  taken over too.

  Raises:
    ConfigError: a live process, or one on another host, holds the lock; names its pid, host
      and start time.
  """
  path = os.path.abspath(os.path.join(workdir, LOCK_FILE))
  if path in _HELD:
    return
  host = socket.gethostname()
  record = {"pid": os.getpid(), "host": host,
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
  for _ in range(3):  # a stale lock taken over by another process at the same time: retry
    try:
      os.makedirs(workdir, exist_ok=True)
      handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      pass
    except OSError as error:
      raise ConfigError(f"workdir {workdir!r} cannot be written: {error}") from error
    else:
      with os.fdopen(handle, "w") as f:
        json.dump(record, f)
      _HELD.add(path)
      return
    try:
      with open(path) as f:
        holder = json.load(f)
      pid, holder_host = int(holder["pid"]), str(holder["host"])
    except FileNotFoundError:
      continue
    except (OSError, ValueError, KeyError, TypeError):
      holder, pid, holder_host = {}, None, host
    if pid == os.getpid() and holder_host == host:
      _HELD.add(path)
      return
    if pid is not None and (holder_host != host or _alive(pid)):
      raise ConfigError(
          f"workdir {workdir!r} is in use by pid {pid} on {holder_host} (since "
          f"{holder.get('started', '?')}): one sweep at a time per workdir; wait for it, or "
          f"remove {path} if that process is gone.")
    print(f"note: taking over the lock of {workdir!r} from pid {pid} on {holder_host}, which is "
          "no longer running", file=sys.stderr)
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)
  raise ConfigError(f"workdir {workdir!r}: could not take {path}; another sweep keeps taking it.")


def release(workdir: str | None = None) -> None:
  """Removes the lock of `workdir` (default: every lock this process holds)."""
  paths = ([os.path.abspath(os.path.join(workdir, LOCK_FILE))] if workdir is not None
           else list(_HELD))
  for path in paths:
    if path in _HELD:
      _HELD.discard(path)
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)


atexit.register(release)


@contextlib.contextmanager
def locked(workdir: str) -> Iterator[None]:
  """Holds the lock of `workdir` within (released also on an exception or Ctrl-C)."""
  held = os.path.abspath(os.path.join(workdir, LOCK_FILE)) in _HELD
  acquire(workdir)
  try:
    yield
  finally:
    if not held:
      release(workdir)


def _drop_torn_record(workdir: str) -> None:
  """Removes a workdir `config.json` that does not parse, with a one-line notice: a kill while
  it was written left it cut short (it is rewritten in place), and a rerun must not stop
  there. Each run folder keeps its own record."""
  path = os.path.join(workdir, loop.CONFIG_FILE)
  try:
    with open(path) as f:
      json.load(f)
  except FileNotFoundError:
    return
  except (OSError, ValueError) as error:
    if jax.process_index() == 0:
      print(f"note: {path} does not parse ({error}); recording the config again",
            file=sys.stderr)
      os.remove(path)


def prepare(workdir: str, config, *, runs: Sequence[Run] = (), plan_fields: Sequence[str] = (),
            ignored: Sequence[str] = ("resume", "progress"), outputs: Sequence[str] = ()) -> None:
  """Checks `workdir` against `config` and `runs` before anything runs; records `config`.

  `plan_fields` choose which runs exist and `ignored` change nothing in a run; neither is
  compared. Takes the workdir's lock (`acquire`; process 0 of a multi-process job), released by
  `release`, `sweep` or process exit, and at once when it refuses. With `config.resume = False`
  (where the config has that field), a workdir that already holds any of `outputs`,
  `results.csv` or `runs` is refused. Folders of planned runs
  in an earlier layout are refused, or moved within `migrating()`.

  Raises:
    ConfigError: the workdir cannot be written, is in use by another sweep, was made with
      another config, holds results and `config.resume` is False, or holds runs in an earlier
      folder layout.
  """
  record = without_added({k: v for k, v in config.to_dict().items()
                          if k not in {*plan_fields, *ignored, LOSSES_FIELD, OLD_LOSSES_FIELD}})
  resume = bool(config.get("resume", True))
  if not resume:
    existing = [name for name in ("results.csv", RUNS_DIR, *outputs)
                if os.path.exists(os.path.join(workdir, name))]
    if existing:
      raise ConfigError(f"workdir {workdir!r} already holds results ({', '.join(existing)}); pass "
                       "--config.resume=True (the default) or choose a new workdir. Nothing was "
                       "overwritten.")
  created = not os.path.exists(workdir)
  if jax.process_index() == 0:
    acquire(workdir)
  try:
    _drop_torn_record(workdir)
    try:
      loop.prepare_workdir(workdir, record, resume=resume)
    except ValueError as error:
      raise ConfigError(str(error)) from error
    moves = misplaced(workdir, runs)
    if moves and not _MIGRATE.get():
      folder, run = moves[0]
      old, new = (os.path.relpath(path, workdir) for path in (folder, run.directory(workdir)))
      raise ConfigError(
          f"workdir {workdir!r} holds {len(moves)} run folder(s) of an earlier layout, e.g. "
          f"{old} (now {new}); rerun the same command with --migrate to move them, or use a new "
          "workdir.")
    migrate(moves, workdir)
  except BaseException:
    release(workdir)
    if created:  # refused before anything ran: leave no folder behind
      with contextlib.suppress(OSError):
        os.rmdir(workdir)
    raise


# -- the sweep --------------------------------------------------------------------------------


def read_result(path: str) -> dict | None:
  """The result row in the `result.json` at `path`, or None: no such file, or one that does
  not parse as a JSON object (then a one-line notice on stderr: the run is not finished)."""
  try:
    with open(path) as f:
      result = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as error:
    result = error
  if isinstance(result, dict):
    return result
  if (path, "result") not in _NOTICES:
    _NOTICES.add((path, "result"))
    detail = result if isinstance(result, Exception) else f"a {type(result).__name__}"
    print(f"note: {path} does not hold a result ({detail}); the run is redone", file=sys.stderr)
  return None


def finished(run: Run, workdir: str) -> bool:
  """Whether `run` left a `result.json` that parses in `workdir`."""
  return read_result(os.path.join(run.directory(workdir), RESULT_FILE)) is not None


def finished_runs(workdir: str, *, axes: Sequence[str] = ()) -> list[tuple[Run, dict]]:
  """Every finished run of `workdir` (its folder holds `result.json`), with its result row,
  in folder order; `axes`: the experiment's axis names."""
  found = []
  for folder in sorted(_run_folders(workdir)):
    run = _identity(_read_record(folder), axes)
    result = read_result(os.path.join(folder, RESULT_FILE)) if run is not None else None
    if result is not None:
      found.append((run, result))
  return found


def run_all(runs: Sequence, train: Callable[[Any], dict], *, workdir: str,
            write_tables: Callable[[list[dict]], None] | None = None, progress: bool = True,
            desc: str = "runs") -> list[dict]:
  """Calls `train(run)` for every run without a `result.json` (`read_result`); reads the others
  back.

  After each newly finished run, process 0 writes its `result.json` (whole or not at all,
  `tables.atomic_open`) and calls
  `write_tables(results so far)`; it calls it once more at the end, so a sweep with nothing
  left to train still rewrites its tables. Returns the results in `runs` order.
  """
  paths = [os.path.join(run.directory(workdir), RESULT_FILE) for run in runs]
  done = [read_result(path) for path in paths]
  if progress and jax.process_index() == 0:  # one line here, then one bar per run (the loop's)
    finished = sum(result is not None for result in done)
    print(f"{desc}: {len(runs)} planned, {finished} finished, {len(runs) - finished} to train",
          flush=True)
  results = []
  for index, (run, path, result) in enumerate(zip(runs, paths, done, strict=True)):
    if result is not None:
      results.append(result)
      continue
    result = train(run)
    results.append(result)
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with tables.atomic_open(path) as f:
        json.dump(result, f, indent=2)
      if write_tables is not None and index < len(runs) - 1:  # the last one is written below
        write_tables(results)
  if write_tables is not None and results and jax.process_index() == 0:
    write_tables(results)
  return results


def sweep(config, workdir: str, *, runs: Sequence[Run], train_run: Callable[[Run], dict],
          write_tables: Callable[[list[dict]], None], plan_fields: Sequence[str] = (),
          outputs: Sequence[str] = (), progress: bool = True, desc: str = "runs") -> list[dict]:
  """`prepare` the workdir for `runs`, then `run_all`: an experiment's whole sweep, holding the
  workdir's lock throughout."""
  held = os.path.abspath(os.path.join(workdir, LOCK_FILE)) in _HELD
  try:
    prepare(workdir, config, runs=runs, plan_fields=plan_fields, outputs=outputs)
    return run_all(runs, train_run, workdir=workdir, write_tables=write_tables,
                   progress=progress, desc=desc)
  finally:
    if not held:
      release(workdir)
