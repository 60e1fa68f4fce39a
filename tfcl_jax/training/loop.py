"""The one training loop: runs the steps, writes their metrics and evaluations (`outputs`),
checkpoints every K steps and at the end, resumes, and stops at a step boundary (`preemption`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

import jax
from jax.sharding import Mesh

from tfcl_jax.training import checkpoint, outputs, sharding
from tfcl_jax.training.files import DiskFull, atomic_open, is_disk_full
from tfcl_jax.training.preemption import Preempted, Preemption
from tfcl_jax.training.state import TrainState

CONFIG_FILE = "config.json"  #: the run's config, in the workdir
CHECKPOINT_DIR = "checkpoints"  #: orbax's checkpoints, in the workdir


def prepare_workdir(workdir: str, config: dict[str, Any], *, resume: bool) -> None:
  """Checks `workdir` before training and records `config` in `workdir/config.json`.

  The checks come before anything is written over; `config.json` is written whole or not at all.

  Raises:
    ValueError: `workdir` cannot be created or written; it already holds a run and
      `resume` is False; or `resume` is True and the recorded config differs from `config`
      (the differing fields are named).
    files.DiskFull: no space to write `config.json`; the recorded one is as it was.

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
  existing = [name for name in (CONFIG_FILE, outputs.METRICS_FILE, CHECKPOINT_DIR)
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
    except (json.JSONDecodeError, UnicodeDecodeError):  # cut short by a write that was not whole
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
  if jax.process_index() == 0:
    with atomic_open(config_path) as f:  # whole or not at all
      json.dump(config, f, indent=2, sort_keys=True)

@dataclasses.dataclass(frozen=True)
class StepEvaluation:
  """An evaluation at chosen steps, beside `eval_fn`'s: `fn(state)` is written as a row of
  `workdir/<file>` (and TensorBoard scalars `<file stem>/<name>`) after each step of `steps`
  (the last step included when it is one of them), before that step's checkpoint.

  Examples:
    >>> from tfcl_jax.training import loop
    >>> sorted(loop.StepEvaluation("scores.csv", lambda state: {"score": 1.0}, [25, 10]).steps)
    [10, 25]
  """

  file: str
  fn: Callable[[TrainState], dict[str, float]]
  steps: Collection[int]

  def __post_init__(self):
    names = (outputs.METRICS_FILE, outputs.EVAL_FILE, CONFIG_FILE)
    if self.file in names or not self.file.endswith(".csv") or os.sep in self.file:
      raise ValueError(f"StepEvaluation.file must be a CSV file name other than {names}, got "
                       f"{self.file!r}.")
    object.__setattr__(self, "steps", frozenset(int(s) for s in self.steps))


class _MetricsWindow:
  """The steps' metrics since the last fetch from the device, with the window's throughput."""

  def __init__(self, out: outputs.Outputs, examples_per_step: int | None, *, run: str):
    self.outputs, self.examples_per_step, self.run = out, examples_per_step, run
    self.pending: list[dict] = []
    self.last_finite: tuple[int, float] | None = None  # (step, loss)
    self.start = time.perf_counter()
    # Seconds since step 0: this process's, after those of the processes before a resume.
    self.origin = self.start - out.seconds_before()

  def add(self, metrics: dict):
    self.pending.append(metrics)

  def flush(self, step_number: int, *, checkpointed_step: int):
    """Writes the window's rows (steps up to `step_number`); a non-finite loss or gradient
    norm stops the run with `FloatingPointError` after its rows are written."""
    if not self.pending:
      return
    rows = jax.device_get(self.pending)
    now = time.perf_counter()
    elapsed = now - self.start
    # Throughput only where the examples per step are known (a full-graph step has none).
    timing = {} if self.examples_per_step is None else {
        "examples_per_sec": len(rows) * self.examples_per_step / max(elapsed, 1e-9)}
    timing[outputs.SECONDS] = now - self.origin
    rows = [{"step": step_number - len(rows) + 1 + i, **{k: float(v) for k, v in row.items()},
             **timing} for i, row in enumerate(rows)]
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
    if "examples_per_sec" in timing:
      postfix["ex_per_s"] = f"{timing['examples_per_sec']:.0f}"
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


def _save(manager, state: TrainState) -> None:
  """`checkpoint.save`, a full disk raised as `DiskFull` naming the step's directory."""
  try:
    checkpoint.save(manager, state)
  except Exception as error:
    if not is_disk_full(error):
      raise
    path = os.path.join(str(manager.directory), str(int(jax.device_get(state.step))))
    kept = f"checkpoints up to step {manager.latest_step() or 0} are kept"
    raise DiskFull.of(error, path, kept) from error


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
    evaluations: Sequence[StepEvaluation] = (),
    log_every: int = 10,
    examples_per_step: int | None = None,
    progress: bool = True,
    desc: str = "train",
) -> TrainState:
  """Runs `train_step` from the state's step (or the latest checkpoint) to `num_steps`.

  Files in `workdir`: `config.json` (checked on resume), `metrics.csv` (one row per step: `step`,
  the step's metrics, `examples_per_sec` when `examples_per_step` is given, and `seconds`, the
  wall seconds of training from step 0 at the flush that wrote the row, the seconds before a
  resume included: `outputs.training_seconds`), `eval.csv`
  (`eval_fn` results every `eval_every` steps and at the end), each of `evaluations`' CSV
  files (`StepEvaluation`: at its own steps), `checkpoints/` (orbax, every
  `checkpoint_every` steps and at the end), `tensorboard/` (the metrics and evaluations as
  TensorBoard scalars, when `tensorboardX` is installed); `outputs` writes all but the
  checkpoints.
  Resuming (`resume=True`) restores the latest checkpoint and asks `batches(step)` to continue
  the data where it stopped; with the step's `fold_in(key, step)` randomness the final
  parameters equal those of an uninterrupted run, and the restore prints one line,
  `resuming <desc> from step N (<workdir>)`. A checkpoint holds only work already on disk: the
  metrics rows and the evaluation of its step are written before it is saved.

  What stops a run:

  * A non-finite loss or gradient norm: `FloatingPointError` naming the step, the run and the
    last finite loss, before the step is checkpointed.
  * SIGTERM (a preempted job): the run saves a checkpoint at the next step boundary (the final
    one if that comes first) and raises `preemption.Preempted` (its `step`); a command line
    exits with status 143. The loop keeps one step in flight (it waits for step `k - 1` after
    dispatching step `k`), so the checkpoint waits for at most two steps' compute. The
    previous SIGTERM handler is restored when `train` returns or raises.
  * Ctrl-C (SIGINT, one process): the same at the next step boundary, then `KeyboardInterrupt`;
    a second Ctrl-C interrupts at once. The previous handler is restored likewise.
  * A full disk on a checkpoint, CSV, TensorBoard or `config.json` write: `files.DiskFull` (an
    `OSError`) naming the path; the earlier checkpoints, CSV rows and summaries stay whole.

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
    evaluations: other evaluations, each at its own steps into its own CSV (`StepEvaluation`).
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
  with outputs.Outputs(workdir, start=start, num_steps=num_steps, desc=desc, progress=progress,
                       files=[e.file for e in evaluations]) as out, Preemption() as preemption:
    window = _MetricsWindow(out, examples_per_step, run=f"{desc!r} ({workdir})")
    in_flight = None
    for step_number, host_batch in _numbered_batches(batches, start, num_steps):
      batch = sharding.shard_batch(host_batch, mesh, sharded=batch_sharded)
      state, metrics = train_step(state, batch, key)
      # One step in flight: the device stays busy, and the host never runs more than a step
      # ahead of it, so that a stop (SIGTERM, Ctrl-C) is honoured within about two steps'
      # compute, not after every step dispatched since the last fetch of the metrics.
      if in_flight is not None:
        jax.block_until_ready(in_flight)
      in_flight = metrics
      window.add(metrics)
      last = step_number == num_steps
      preempted = not last and preemption.reached(step_number)
      save = not last and (preempted or _due(step_number, checkpoint_every))
      # Rows and evaluation first: a checkpoint never holds a step whose outputs are missing.
      if _due(step_number, log_every) or last or save:
        window.flush(step_number, checkpointed_step=int(manager.latest_step() or 0))
      if _due(step_number, eval_every) and not last:
        out.evaluate(eval_fn, state, step_number)
      for evaluation in evaluations:
        if step_number in evaluation.steps and not last:
          out.evaluate(evaluation.fn, state, step_number, file=evaluation.file)
      if save:
        _save(manager, state)
      if preempted:
        raise preemption.stop(step_number, workdir)
    if start < num_steps or manager.latest_step() is None:
      out.evaluate(eval_fn, state, num_steps)
      for evaluation in evaluations:
        if num_steps in evaluation.steps:
          out.evaluate(evaluation.fn, state, num_steps, file=evaluation.file)
      _save(manager, state)
    if preemption.requested:  # during the last step: finished, but the job must still stop
      raise Preempted(num_steps, workdir)
  return state
