"""A sweep's workdir: one sweep at a time (its lock), checked against the config before anything
runs, and its run folders read back.

- `prepare`: a workdir made with another config is refused before anything runs, naming the
  differing fields; the fields that only choose which runs exist (`plan.PLAN_FIELDS` and an
  experiment's own) may change, so a sweep grows by rerunning it with more seeds or losses.
- one sweep at a time per workdir: `prepare` takes `workdir/.lock` (pid, host, start time);
  another sweep on it is refused, naming the holder; a lock whose holder died on this host is
  taken over with a notice; `sweep.sweep`, the command line and process exit release it.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import os
import socket
import sys
from collections.abc import Iterator, Sequence

import jax

from experiments.framework import plan
from tfcl_jax.training import loop

LOCK_FILE = ".lock"
_HELD: set = set()  # lock paths this process holds


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's live process
    return True
  return True


def _lock_path(workdir: str) -> str:
  return os.path.abspath(os.path.join(workdir, LOCK_FILE))


def holds(workdir: str) -> bool:
  """Whether this process holds the lock of `workdir`."""
  return _lock_path(workdir) in _HELD


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
  path = _lock_path(workdir)
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
      raise plan.ConfigError(f"workdir {workdir!r} cannot be written: {error}") from error
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
      raise plan.ConfigError(
          f"workdir {workdir!r} is in use by pid {pid} on {holder_host} (since "
          f"{holder.get('started', '?')}): one sweep at a time per workdir; wait for it, or "
          f"remove {path} if that process is gone.")
    print(f"note: taking over the lock of {workdir!r} from pid {pid} on {holder_host}, which is "
          "no longer running", file=sys.stderr)
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)
  raise plan.ConfigError(
      f"workdir {workdir!r}: could not take {path}; another sweep keeps taking it.")


def release(workdir: str | None = None) -> None:
  """Removes the lock of `workdir` (default: every lock this process holds)."""
  paths = [_lock_path(workdir)] if workdir is not None else list(_HELD)
  for path in paths:
    if path in _HELD:
      _HELD.discard(path)
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)


atexit.register(release)


@contextlib.contextmanager
def lock_scope(workdir: str) -> Iterator[None]:
  """Within it, the lock of `workdir`, once taken (`acquire`, `prepare`), is released on the way
  out (also on an exception or Ctrl-C), unless this process held it before."""
  held = holds(workdir)
  try:
    yield
  finally:
    if not held:
      release(workdir)


@contextlib.contextmanager
def locked(workdir: str) -> Iterator[None]:
  """Holds the lock of `workdir` within (released also on an exception or Ctrl-C)."""
  with lock_scope(workdir):
    acquire(workdir)
    yield


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


def prepare(workdir: str, config, *, plan_fields: Sequence[str] = (),
            outputs: Sequence[str] = ()) -> None:
  """Checks `workdir` against `config` before anything runs; records `config` there
  (`plan.recorded`).

  The fields that choose which runs exist (`plan.PLAN_FIELDS`, `plan_fields`) and
  `plan.NOT_RECORDED` are not compared. Takes the workdir's lock (`acquire`; process 0 of a
  multi-process job), released by `release`, `sweep.sweep` or process exit, and at once when
  it refuses. With `config.resume = False` (`plan.resume`), a workdir that already holds any of
  `outputs`, `results.csv` or `runs` is refused.

  Raises:
    ConfigError: the workdir cannot be written, is in use by another sweep, was made with
      another config, or holds results and `config.resume` is False.
  """
  resume = plan.resume(config)
  if not resume:
    existing = [name for name in ("results.csv", plan.RUNS_DIR, *outputs)
                if os.path.exists(os.path.join(workdir, name))]
    if existing:
      raise plan.ConfigError(
          f"workdir {workdir!r} already holds results ({', '.join(existing)}); pass "
          "--config.resume=True (the default) or choose a new workdir. Nothing was overwritten.")
  created = not os.path.exists(workdir)
  if jax.process_index() == 0:
    acquire(workdir)
  try:
    _drop_torn_record(workdir)
    try:
      loop.prepare_workdir(workdir, plan.recorded(config, plan_fields=plan_fields),
                           resume=resume)
    except ValueError as error:
      raise plan.ConfigError(str(error)) from error
  except BaseException:
    release(workdir)
    if created:  # refused before anything ran: leave no folder behind
      with contextlib.suppress(OSError):
        os.rmdir(workdir)
    raise


def run_folders(workdir: str) -> Iterator[str]:
  """Every folder under `workdir/runs` that a run started (it holds the run's `config.json`)."""
  for folder, subfolders, files in os.walk(os.path.join(workdir, plan.RUNS_DIR)):
    if loop.CONFIG_FILE in files:
      subfolders.clear()
      yield folder


def run_of(folder: str, axes: Sequence[str] = ()) -> plan.Run | None:
  """The `Run` a run folder's `config.json` records (`Run.record`), or None: a record a kill
  cut short, or one without a spec and a seed."""
  try:
    with open(os.path.join(folder, loop.CONFIG_FILE)) as f:
      record = json.load(f)
  except ValueError:
    return None
  if not isinstance(record, dict):
    return None
  spec, seed = record.get("spec"), record.get("seed")
  if not isinstance(spec, str) or not isinstance(seed, int):
    return None
  return plan.Run(spec, seed, tuple((name, record.get(name)) for name in axes))
