"""The one training loop: progress bar, `metrics.csv`, orbax checkpoints every K steps and at the
end, resume, periodic evaluation. Checks the workdir and config before the first step.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from tfcl_jax.training import checkpoint, sharding
from tfcl_jax.training.state import TrainState

CONFIG_FILE = "config.json"  #: the run's config, in the workdir
METRICS_FILE = "metrics.csv"  #: the training metrics, one row per logged step
EVAL_FILE = "eval.csv"  #: the evaluations, one row per evaluation
CHECKPOINT_DIR = "checkpoints"  #: orbax's checkpoints, in the workdir


class Preempted(Exception):  # noqa: N818  # names the event, as KeyboardInterrupt does
  """SIGTERM reached a run: `train` saved a checkpoint at step `step` and stopped.

  The run continues with `resume=True`. A command line exits with status 143 (128 + SIGTERM),
  which schedulers read as "terminated, may be requeued".
  """

  def __init__(self, step: int, workdir: str):
    super().__init__(f"preempted (SIGTERM): checkpoint saved at step {step} in {workdir}; "
                     f"resume to continue.")
    self.step, self.workdir = step, workdir


class DiskFull(OSError):
  """A checkpoint or CSV write found no space on its device (`ENOSPC`, `EDQUOT`).

  `path` (also `filename`) is what was being written. Earlier checkpoints and the CSV rows
  written before stay complete: a checkpoint is only committed whole, and a partial CSV append
  is cut back.
  """

  def __init__(self, path: str, detail: str):
    super().__init__(errno.ENOSPC, f"no space left on device writing {path}: {detail}", path)
    self.path = path

  def __str__(self) -> str:
    return str(self.strerror)


def _is_disk_full(error: BaseException | None) -> bool:
  """Whether `error`, or an exception it was raised from, is a full disk or quota; orbax and
  tensorstore may re-raise the `OSError` as another type that keeps only its text."""
  while error is not None:
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
      return True
    if any(text in str(error) for text in ("No space left on device", "Disk quota exceeded")):
      return True
    error = error.__cause__ or error.__context__
  return False


def prepare_workdir(workdir: str, config: dict[str, Any], *, resume: bool) -> None:
  """Checks `workdir` before training and records `config` in `workdir/config.json`.

  Raises (before anything is written over):
    ValueError: `workdir` cannot be created or written; it already holds a run and
      `resume` is False; or `resume` is True and the recorded config differs from `config`
      (the differing fields are named).

  Examples:
    >>> import tempfile
    >>> from tfcl_jax.training import loop
    >>> workdir = tempfile.mkdtemp()
    >>> loop.prepare_workdir(workdir, {"lr": 0.1}, resume=False)
    >>> loop.prepare_workdir(workdir, {"lr": 0.2}, resume=True)
    Traceback (most recent call last):
    ...
    ValueError: ...config differs from the run in ...: lr: recorded 0.1, now 0.2...
  """
  config = json.loads(json.dumps(config, sort_keys=True, default=str))
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_probe_{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as error:
    raise ValueError(f"workdir {workdir!r} cannot be written: {error}") from error
  config_path = os.path.join(workdir, CONFIG_FILE)
  existing = [name for name in (CONFIG_FILE, METRICS_FILE, CHECKPOINT_DIR)
              if os.path.exists(os.path.join(workdir, name))]
  if existing and not resume:
    raise ValueError(
        f"workdir {workdir!r} already holds a run ({', '.join(existing)}); pass "
        f"--config.resume=True to continue it, or choose a new workdir. Nothing was overwritten.")
  recorded = None
  if resume and os.path.exists(config_path):
    try:
      with open(config_path) as f:
        recorded = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError):  # cut short (an older, non-atomic write)
      warnings.warn(f"{config_path} cannot be read; it is written again from this run's config.",
                    stacklevel=2)
  if recorded is not None:
    if recorded != config:
      keys = sorted(set(recorded) | set(config))
      diff = [f"{k}: recorded {recorded.get(k)!r}, now {config.get(k)!r}"
              for k in keys if recorded.get(k) != config.get(k)]
      raise ValueError(
          f"cannot resume: the config differs from the run in {workdir!r}: {'; '.join(diff)}. "
          f"Use the recorded config or a new workdir.")
  if jax.process_index() == 0:  # whole or not at all: a temporary file, then one rename
    partial = f"{config_path}.{os.getpid()}.tmp"
    try:
      with open(partial, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
      os.replace(partial, config_path)
    finally:
      if os.path.exists(partial):
        os.remove(partial)


def read_csv(path: str) -> dict[str, np.ndarray]:
  """Columns of a metrics/eval CSV written by `train`, as float arrays (empty dict if absent).

  An empty cell (a column a resumed run no longer logs) reads as NaN.
  """
  if not os.path.exists(path):
    return {}
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  if not rows:
    return {}
  return {key: np.asarray([float(row[key]) if row.get(key) not in ("", None) else np.nan
                           for row in rows]) for key in rows[0]}


class _CsvLog:
  """Appends rows to a CSV; on resume, drops rows past the restored step (they are redone)."""

  def __init__(self, path: str, *, keep_through_step: int):
    self.path = path
    self.fields: Sequence[str] | None = None
    self.enabled = jax.process_index() == 0
    if self.enabled and os.path.exists(path):
      with open(path, newline="") as f:
        reader = csv.DictReader(f)
        self.fields = reader.fieldnames
        rows = [row for row in reader if int(float(row["step"])) <= keep_through_step]
      self._rewrite(rows)

  def _text(self, rows, *, header: bool) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, self.fields or [], extrasaction="ignore")
    if header:
      writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()

  def _rewrite(self, rows):
    # A new file renamed over the old one: a failure (a full disk) leaves the old file whole.
    partial = f"{self.path}.partial"
    try:
      with open(partial, "w", newline="") as f:
        f.write(self._text(rows, header=bool(self.fields)))
      os.replace(partial, self.path)
    except OSError as error:
      if os.path.exists(partial):
        os.remove(partial)
      if _is_disk_full(error):
        raise DiskFull(self.path, f"{error}; the file is as it was") from error
      raise

  def write(self, rows: list[dict[str, float]]):
    if not self.enabled or not rows:
      return
    if self.fields is None:
      self.fields = list(rows[0])
      self._rewrite([])
    size = os.path.getsize(self.path)
    try:
      with open(self.path, "a", newline="") as f:
        f.write(self._text(rows, header=False))
    except OSError as error:
      # Cut a partial append back so that every row in the file is whole.
      with open(self.path, "r+b") as f:
        f.truncate(size)
      if _is_disk_full(error):
        raise DiskFull(self.path, f"{error}; the rows before are kept") from error
      raise


def _summary_writer(workdir: str):
  """A TensorBoard writer when `tensorboardX` is installed (optional), else None."""
  try:
    import tensorboardX  # noqa: PLC0415  # pyright: ignore[reportMissingImports]  (optional, in no extra)
  except ImportError:
    return None
  return tensorboardX.SummaryWriter(os.path.join(workdir, "tensorboard"))


class _NoBar:
  """Stands in for a tqdm bar when progress is off (tqdm is an optional dependency)."""

  def update(self, n=1):
    del n

  def set_postfix(self, *args, **kwargs):
    del args, kwargs

  def close(self):
    pass


def _progress_bar(*, total: int, initial: int, desc: str, enabled: bool):
  if not enabled:
    return _NoBar()
  try:
    import tqdm.auto as tqdm  # noqa: PLC0415
  except ImportError as error:
    raise ImportError("progress=True needs tqdm: pip install 'tfcl_jax[experiments]' (or tqdm), "
                      "or pass progress=False.") from error
  return tqdm.tqdm(total=total, initial=initial, desc=desc, leave=True)  # a line per run


class _Outputs:
  """What a run writes besides checkpoints: `metrics.csv`, `eval.csv`, TensorBoard (when
  `tensorboardX` is installed) and the progress bar. Rows past the restored step are dropped,
  so a resumed run rewrites them."""

  def __init__(self, workdir: str, *, start: int, num_steps: int, desc: str, progress: bool):
    self.metrics = _CsvLog(os.path.join(workdir, METRICS_FILE), keep_through_step=start)
    self.evals = _CsvLog(os.path.join(workdir, EVAL_FILE), keep_through_step=start)
    self.writer = _summary_writer(workdir) if jax.process_index() == 0 else None
    self.bar = _progress_bar(total=num_steps, initial=start, desc=desc, enabled=progress)

  def scalars(self, prefix: str, rows: list[dict[str, float]]):
    if self.writer is not None:
      for row in rows:
        for name, value in row.items():
          self.writer.add_scalar(f"{prefix}/{name}", value, row["step"])

  def evaluate(self, eval_fn, state: TrainState, step_number: int):
    if eval_fn is None:
      return
    row = {"step": step_number, **{k: float(v) for k, v in eval_fn(state).items()}}
    self.evals.write([row])
    self.scalars("eval", [row])

  def close(self):
    self.bar.close()
    if self.writer is not None:
      self.writer.close()


class _MetricsWindow:
  """The steps' metrics since the last fetch from the device, with the window's throughput."""

  def __init__(self, outputs: _Outputs, examples_per_step: int | None, *, run: str):
    self.outputs, self.examples_per_step, self.run = outputs, examples_per_step, run
    self.pending: list[dict] = []
    self.last_finite: tuple[int, float] | None = None  # (step, loss)
    self.start = time.perf_counter()

  def add(self, metrics: dict):
    self.pending.append(metrics)

  def flush(self, step_number: int, *, checkpointed_step: int):
    """Writes the window's rows (steps up to `step_number`); a non-finite loss or gradient
    norm stops the run with `FloatingPointError` after its rows are written."""
    if not self.pending:
      return
    rows = jax.device_get(self.pending)
    elapsed = time.perf_counter() - self.start
    # Throughput only where the examples per step are known (a full-graph step has none).
    rate = {} if self.examples_per_step is None else {
        "examples_per_sec": len(rows) * self.examples_per_step / max(elapsed, 1e-9)}
    rows = [{"step": step_number - len(rows) + 1 + i, **{k: float(v) for k, v in row.items()},
             **rate} for i, row in enumerate(rows)]
    self.outputs.metrics.write(rows)
    for row in rows:
      bad = [name for name in ("loss", "grad_norm")
             if name in row and not math.isfinite(row[name])]
      if bad:
        last = ("no finite loss before it" if self.last_finite is None else
                f"last finite loss {self.last_finite[1]:.6g} at step {self.last_finite[0]}")
        raise FloatingPointError(
            f"non-finite {' and '.join(bad)} at step {row['step']} of {self.run} ({last}; "
            f"metrics.csv has the rows); the run was not checkpointed past step "
            f"{checkpointed_step}.")
      self.last_finite = (row["step"], row["loss"])
    self.outputs.scalars("train", rows)
    postfix = {"loss": f"{rows[-1]['loss']:.4f}"}
    if rate:
      postfix["ex_per_s"] = f"{rate['examples_per_sec']:.0f}"
    self.outputs.bar.set_postfix(postfix)
    self.outputs.bar.update(len(rows))
    self.pending, self.start = [], time.perf_counter()


def _check_intervals(num_steps: int, checkpoint_every: int, eval_every: int, log_every: int):
  if num_steps < 0:
    raise ValueError(f"num_steps must be >= 0, got {num_steps}.")
  for name, value, minimum in (("checkpoint_every", checkpoint_every, 0),
                               ("eval_every", eval_every, 0), ("log_every", log_every, 1)):
    if value < minimum:
      raise ValueError(f"{name} must be >= {minimum}, got {value}.")


def _numbered_batches(batches, start: int, num_steps: int):
  """`(step, host batch)` for steps `start + 1 ... num_steps`, from `batches(start)`."""
  iterator: Iterator[Any] = iter(batches(start))
  for step_number in range(start + 1, num_steps + 1):
    try:
      yield step_number, next(iterator)
    except StopIteration:
      raise ValueError(
          f"batches({start}) ran out at step {step_number - 1} of {num_steps}; it must yield "
          f"one batch per step (use more epochs or fewer steps).") from None


def _due(step_number: int, every: int) -> bool:
  return bool(every) and step_number % every == 0


class _Preemption:
  """Notices SIGTERM and Ctrl-C during a run; `reached(step)` says when to checkpoint and stop.

  One process: a SIGTERM handler sets a flag (the previous handler is restored on exit; outside
  the main thread no handler can be installed and SIGTERM keeps its meaning). Several
  processes: JAX's preemption sync manager (`jax.distributed.initialize` installs it) agrees on
  one step for all of them, so that they save the same checkpoint.

  Ctrl-C (SIGINT, one process, where Python's own handler is in place) is held to the next step
  boundary the same way, so that it never lands inside a checkpoint write and the step it
  stops at is saved; a second Ctrl-C interrupts at once.
  """

  def __init__(self):
    self.requested = self.interrupted = self.installed = self.installed_int = False
    self.previous = self.previous_int = None
    self.distributed = jax.process_count() > 1

  def __enter__(self):
    if not self.distributed and threading.current_thread() is threading.main_thread():
      self.previous = signal.signal(signal.SIGTERM, self._handle)
      self.installed = True
      if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        self.previous_int = signal.signal(signal.SIGINT, self._handle_int)
        self.installed_int = True
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def _handle_int(self, signum, frame):
    del signum, frame
    if self.interrupted:  # the second Ctrl-C does not wait for the step
      raise KeyboardInterrupt
    self.interrupted = True

  def __exit__(self, *exc_info):
    if self.installed:  # None: a handler set outside Python, which Python cannot reinstall
      signal.signal(signal.SIGTERM,
                    signal.SIG_DFL if self.previous is None else self.previous)
    if self.installed_int:
      signal.signal(signal.SIGINT, self.previous_int)

  def reached(self, step_number: int) -> bool:
    if not self.distributed:
      return self.requested or self.interrupted
    from jax.experimental import multihost_utils  # noqa: PLC0415

    try:
      return multihost_utils.reached_preemption_sync_point(step_number)
    except RuntimeError:  # the preemption service is off (jax_enable_preemption_service)
      return False

  def stop(self, step_number: int, workdir: str) -> BaseException:
    """What to raise after the checkpoint of `step_number`: Ctrl-C, else `Preempted`."""
    if self.interrupted and not self.requested:
      return KeyboardInterrupt(f"checkpoint saved at step {step_number} in {workdir}")
    return Preempted(step_number, workdir)


def _save(manager, state: TrainState) -> None:
  """`checkpoint.save`, a full disk raised as `DiskFull` naming the step's directory."""
  try:
    checkpoint.save(manager, state)
  except Exception as error:
    if not _is_disk_full(error):
      raise
    path = os.path.join(str(manager.directory), str(int(jax.device_get(state.step))))
    raise DiskFull(path, f"checkpoints up to step {manager.latest_step() or 0} are kept") from error


def _restore(manager, state: TrainState, workdir: str):
  """The latest checkpoint that restores (damaged newer ones set aside, with a warning), and
  the manager to go on with."""
  restored, bad = checkpoint.restore_latest_good(manager, state)
  if bad:
    moved = checkpoint.set_aside(manager, bad)
    start = "from step 0" if restored is None else f"from step {int(restored.step)}"
    warnings.warn(
        f"checkpoint{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} in {workdir} "
        f"cannot be read (moved to {', '.join(moved)}); the run continues {start}.",
        stacklevel=3)
    manager = checkpoint.make_manager(str(manager.directory))
  return restored, manager


def train(
    state: TrainState,
    *,
    train_step: Callable[[TrainState, Any, jax.Array], tuple[TrainState, dict]],
    batches: Callable[[int], Iterable[Any]],
    num_steps: int,
    workdir: str,
    key: jax.Array,
    mesh: Mesh,
    config: dict[str, Any] | None = None,
    resume: bool = False,
    batch_sharded: bool = True,
    checkpoint_every: int = 0,
    eval_every: int = 0,
    eval_fn: Callable[[TrainState], dict[str, float]] | None = None,
    log_every: int = 10,
    examples_per_step: int | None = None,
    progress: bool = True,
    desc: str = "train",
) -> TrainState:
  """Runs `train_step` from the state's step (or the latest checkpoint) to `num_steps`.

  Files in `workdir`: `config.json` (checked on resume), `metrics.csv` (one row per step: `step`,
  the step's metrics, `examples_per_sec` when `examples_per_step` is given), `eval.csv`
  (`eval_fn` results every `eval_every` steps and at the end), `checkpoints/` (orbax, every
  `checkpoint_every` steps and at the end).
  Resuming (`resume=True`) restores the latest checkpoint and asks `batches(step)` to continue
  the data where it stopped; with the step's `fold_in(key, step)` randomness the final
  parameters equal those of an uninterrupted run, and the restore prints one line,
  `resuming <desc> from step N (<workdir>)`. A checkpoint holds only work already on disk: the
  metrics rows and the evaluation of its step are written before it is saved.

  What stops a run:

  * A non-finite loss or gradient norm: `FloatingPointError` naming the step, the run and the
    last finite loss, before the step is checkpointed.
  * SIGTERM (a preempted job): the run saves a checkpoint at the next step boundary (the final
    one if that comes first) and raises `Preempted` (its `step`); a command line exits with
    status 143. The previous SIGTERM handler is restored when `train` returns or raises.
  * Ctrl-C (SIGINT, one process): the same at the next step boundary, then `KeyboardInterrupt`;
    a second Ctrl-C interrupts at once. The previous handler is restored likewise.
  * A full disk on a checkpoint or CSV write: `DiskFull` (an `OSError`) naming the path; the
    earlier checkpoints and CSV rows stay whole.

  A damaged newest checkpoint (a truncated or missing file) is moved aside with a warning and
  the run resumes from the one before it (from step 0 if none can be read).

  Examples:
    >>> import tempfile, jax, jax.numpy as jnp, numpy as np, optax
    >>> from tfcl_jax.training import loop, sharding, state, step
    >>> def loss_fn(params, model_state, batch, key, step_index):
    ...   loss = jnp.mean((batch["x"] @ params["model"]["w"] - batch["y"]) ** 2)
    ...   return loss, (model_state, {})
    >>> mesh = sharding.make_mesh(jax.devices()[:1])
    >>> s = state.create_train_state(model_params={"w": jnp.zeros(2)}, tx=optax.sgd(0.5))
    >>> batches = lambda start: ({"x": np.eye(2, dtype=np.float32), "y": np.ones(2, np.float32)}
    ...                          for _ in range(start, 20))
    >>> s = loop.train(s, train_step=step.make_train_step(loss_fn, mesh=mesh), batches=batches,
    ...                num_steps=20, workdir=tempfile.mkdtemp(), key=jax.random.key(0), mesh=mesh,
    ...                progress=False)
    >>> int(s.step), bool(jnp.allclose(s.params["model"]["w"], 1.0, atol=0.1))
    (20, True)

  Args:
    state: the initial state (also the template a checkpoint is restored into).
    train_step: from `step.make_train_step`, built for `mesh` and `batch_sharded`.
    batches: `batches(start_step)` -> iterable of host batches (pytrees of NumPy arrays) for
      steps `start_step, start_step + 1, ...`.
    num_steps: total number of steps of the run.
    workdir: output directory (created).
    key: base PRNG key; the step folds in the step number.
    mesh: the device mesh.
    config: JSON-able dict recorded in `config.json` and compared on resume (`resume` ignored).
    resume: continue the run in `workdir`.
    batch_sharded: shard batches over `data` (True) or replicate them.
    checkpoint_every: save every that many steps (0: only at the end).
    eval_every: call `eval_fn(state)` every that many steps (0: only at the end).
    eval_fn: `state -> {name: float}`, e.g. kNN accuracy; optional.
    log_every: fetch metrics from the device every that many steps (all steps are logged).
    examples_per_step: for the examples/s column and the progress bar.
    progress: show a tqdm progress bar.
    desc: progress bar label.

  Returns:
    The final `TrainState`.
  """
  _check_intervals(num_steps, checkpoint_every, eval_every, log_every)
  config = {k: v for k, v in (config or {}).items() if k != "resume"}
  prepare_workdir(workdir, config, resume=resume)
  manager = checkpoint.make_manager(os.path.join(workdir, CHECKPOINT_DIR))
  if resume:
    restored, manager = _restore(manager, state, workdir)
    if restored is not None:
      state = restored
      if jax.process_index() == 0:
        print(f"resuming {desc} from step {int(jax.device_get(state.step))} ({workdir})",
              flush=True)
  state, key = sharding.replicate(state, mesh), sharding.replicate(key, mesh)
  start = int(jax.device_get(state.step))
  outputs = _Outputs(workdir, start=start, num_steps=num_steps, desc=desc, progress=progress)
  window = _MetricsWindow(outputs, examples_per_step, run=f"{desc!r} ({workdir})")
  try:
    with _Preemption() as preemption:
      for step_number, host_batch in _numbered_batches(batches, start, num_steps):
        batch = sharding.shard_batch(host_batch, mesh, sharded=batch_sharded)
        state, metrics = train_step(state, batch, key)
        window.add(metrics)
        last = step_number == num_steps
        preempted = not last and preemption.reached(step_number)
        save = not last and (preempted or _due(step_number, checkpoint_every))
        # Rows and evaluation first: a checkpoint never holds a step whose outputs are missing.
        if _due(step_number, log_every) or last or save:
          window.flush(step_number, checkpointed_step=int(manager.latest_step() or 0))
        if _due(step_number, eval_every) and not last:
          outputs.evaluate(eval_fn, state, step_number)
        if save:
          _save(manager, state)
        if preempted:
          raise preemption.stop(step_number, workdir)
      if start < num_steps or manager.latest_step() is None:
        outputs.evaluate(eval_fn, state, num_steps)
        _save(manager, state)
      if preemption.requested:  # during the last step: finished, but the job must still stop
        raise Preempted(num_steps, workdir)
  finally:
    outputs.close()
  return state
