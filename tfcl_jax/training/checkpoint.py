"""Orbax checkpoints of a `TrainState`: save every K steps and at the end, restore the latest.

Only the arrays are saved (params, optimiser state, model state, step); `apply_fn` and `tx` come
from the code, so a restored state is the given template with its arrays replaced.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import warnings

import jax
import numpy as np
import orbax.checkpoint as ocp

from tfcl_jax.training.state import TrainState


def _arrays(state: TrainState) -> dict:
  return {
      "params": state.params, "opt_state": state.opt_state,
      "model_state": state.model_state, "step": state.step,
  }


def make_manager(directory: str, *, max_to_keep: int = 2) -> ocp.CheckpointManager:
  """A synchronous orbax `CheckpointManager` in `directory` (made absolute; created if missing).

  Examples:
    >>> import tempfile
    >>> from tfcl_jax.training import checkpoint
    >>> checkpoint.make_manager(tempfile.mkdtemp()).latest_step() is None
    True
  """
  # Synchronous saves: the loop's "saved at step k" is then true when the line is written, and a
  # run killed right after a save can resume from it.
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True)
  return ocp.CheckpointManager(os.path.abspath(directory), options=options,
                               item_handlers=ocp.StandardCheckpointHandler())


def save(manager: ocp.CheckpointManager, state: TrainState) -> int:
  """Saves `state` under its step (a no-op if that step is already saved); returns the step."""
  step = int(jax.device_get(state.step))
  if manager.latest_step() != step:
    manager.save(step, args=ocp.args.StandardSave(_arrays(state)), force=True)
    manager.wait_until_finished()
  return step


def _shapes(tree) -> list[tuple]:
  """The sorted shapes of a tree's arrays: a model's fingerprint, whatever the tree's container
  types (orbax reads tuples back as lists) and the step's integer type."""
  return sorted(tuple(np.shape(leaf)) for leaf in jax.tree.leaves(tree))


class _DropLateLoopCallbacks:
  """An unraisable-exception hook that drops one report and passes every other to `hook`: a
  callback that reached an asyncio event loop after the loop closed ("Event loop is closed").

  Orbax restores a checkpoint in an event loop of its own; when one read fails, it closes the
  loop while tensorstore still runs the other reads, and each of those reports the closed loop
  from a tensorstore thread when it ends or is collected, at any later time. The failure itself
  is reported once, as a warning, so these reports are only noise.
  """

  def __init__(self, hook):
    self.hook = hook

  def __call__(self, unraisable):
    if not _is_late_loop_callback(unraisable):
      self.hook(unraisable)


def _is_late_loop_callback(unraisable) -> bool:
  if unraisable.exc_type is not RuntimeError or str(unraisable.exc_value) != "Event loop is closed":
    return False
  frames, trace = [], unraisable.exc_traceback
  while trace is not None:
    frames.append(trace.tb_frame.f_code.co_name)
    trace = trace.tb_next
  return "call_soon_threadsafe" in frames


@contextlib.contextmanager
def _quiet_failed_reads():
  """Silences what orbax's reads of a damaged checkpoint leave behind besides their error:
  asyncio's "exception never retrieved" records, "coroutine ... was never awaited" warnings and
  tensorstore's late "Event loop is closed" reports (`_DropLateLoopCallbacks`).

  Yields a list; a caller appends to it when a read failed. The late reports may come after the
  block, so the hook stays in place after a failure and is taken out otherwise.
  """
  logger = logging.getLogger("asyncio")
  level, hook, failures = logger.level, sys.unraisablehook, []
  ours = None if isinstance(hook, _DropLateLoopCallbacks) else _DropLateLoopCallbacks(hook)
  if ours is not None:
    sys.unraisablehook = ours
  logger.setLevel(logging.CRITICAL)
  try:
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", r"coroutine '.*' was never awaited", RuntimeWarning)
      try:
        yield failures
      finally:
        if failures:  # the failed reads' tasks are reported when collected: collect them here
          gc.collect()
  finally:
    logger.setLevel(level)
    if ours is not None and not failures and sys.unraisablehook is ours:
      sys.unraisablehook = hook


def _fits(manager: ocp.CheckpointManager, step: int, template: TrainState) -> bool | None:
  """Whether the recorded arrays of `step` have `template`'s shapes (None: unreadable metadata)."""
  try:
    shapes = _shapes(getattr(manager.item_metadata(step), "tree", None))
  except Exception:  # noqa: BLE001  # any failure to read the metadata is a damaged checkpoint
    return None
  return None if not shapes else shapes == _shapes(_arrays(template))


def restore_latest_good(manager: ocp.CheckpointManager,
                        template: TrainState) -> tuple[TrainState | None, list[int]]:
  """The newest checkpoint that restores, and the newer steps that did not (newest first).

  A step whose files are missing, truncated or unreadable is passed over for the one before it:
  a job killed while writing, or a disk that lost a file, costs the steps since the previous
  checkpoint, not the run. Returns `(None, bad_steps)` when no checkpoint restores. The reads
  that orbax abandons when one read fails leave no tracebacks or warnings behind: the caller
  reports the damage once.

  Raises:
    ValueError: when the newest readable checkpoint's arrays do not fit `template` (a different
      model or optimiser), naming the directory; nothing is passed over then.

  Examples:
    >>> import os, tempfile, jax.numpy as jnp, optax
    >>> from tfcl_jax.training import checkpoint, state
    >>> manager = checkpoint.make_manager(tempfile.mkdtemp())
    >>> s = state.create_train_state(model_params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1))
    >>> for step in (1, 2):
    ...   _ = checkpoint.save(manager, s.replace(step=step))
    >>> os.remove(os.path.join(str(manager.directory), "2", "default", "_METADATA"))
    >>> restored, bad = checkpoint.restore_latest_good(manager, s)
    >>> int(restored.step), bad
    (1, [2])
  """
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _arrays(template))
  bad = []
  with _quiet_failed_reads() as failures:
    for step in sorted(manager.all_steps(), reverse=True):
      fits = _fits(manager, step, template)
      if fits is None:
        failures.append(step)
      if fits is False:
        raise ValueError(
            f"checkpoint at step {step} in {manager.directory} does not match this "
            f"model/optimiser (its arrays' shapes differ from the state's).")
      try:
        arrays = manager.restore(step, args=ocp.args.StandardRestore(abstract))
      except Exception:  # noqa: BLE001  # orbax and tensorstore raise many types for a bad file
        bad.append(step)
        failures.append(step)
        continue
      return template.replace(**arrays), bad
  return None, bad


def set_aside(manager: ocp.CheckpointManager, steps: list[int]) -> list[str]:
  """Renames the step directories `steps` to `<step>.bad` (kept for inspection, ignored by orbax)
  so that a resumed run saves those steps afresh; returns the new paths. Process 0 renames, the
  others wait for it."""
  directory = str(manager.directory)
  moved = []
  for step in steps:
    source, target = os.path.join(directory, str(step)), os.path.join(directory, f"{step}.bad")
    suffix = 0
    while os.path.exists(target):
      suffix += 1
      target = os.path.join(directory, f"{step}.bad{suffix}")
    if jax.process_index() == 0 and os.path.exists(source):
      os.rename(source, target)
    moved.append(target)
  if steps and jax.process_count() > 1:
    from jax.experimental import multihost_utils  # noqa: PLC0415

    multihost_utils.sync_global_devices("tfcl_jax.checkpoint.set_aside")
  manager.reload()
  return moved


def restore_latest(manager: ocp.CheckpointManager, template: TrainState) -> TrainState | None:
  """The latest checkpoint that restores, in `template`'s structure and shardings, or None.

  A damaged newer checkpoint is passed over with a warning naming it (`restore_latest_good`).

  Raises:
    ValueError: when the checkpoint's arrays do not fit `template` (a different model or
      optimiser), naming the directory.
  """
  restored, bad = restore_latest_good(manager, template)
  if bad:
    using = "none is usable" if restored is None else f"using step {int(restored.step)}"
    warnings.warn(f"checkpoints {', '.join(map(str, bad))} in {manager.directory} cannot be "
                  f"read; {using}.", stacklevel=2)
  return restored
