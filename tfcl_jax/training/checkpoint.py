"""Orbax checkpoints of a `TrainState`: save every K steps and at the end, restore the latest.

Only the arrays are saved (params, optimiser state, model state, step); `apply_fn` and `tx` come
from the code, so a restored state is the given template with its arrays replaced.
"""

from __future__ import annotations

import os

import jax
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
  return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def save(manager: ocp.CheckpointManager, state: TrainState) -> int:
  """Saves `state` under its step (a no-op if that step is already saved); returns the step."""
  step = int(jax.device_get(state.step))
  if manager.latest_step() != step:
    manager.save(step, args=ocp.args.StandardSave(_arrays(state)), force=True)
    manager.wait_until_finished()
  return step


def restore_latest(manager: ocp.CheckpointManager, template: TrainState) -> TrainState | None:
  """The latest checkpoint restored into `template`'s structure and shardings, or None.

  Raises:
    ValueError: when the checkpoint's arrays do not fit `template` (a different model or
      optimiser), naming the directory.
  """
  step = manager.latest_step()
  if step is None:
    return None
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _arrays(template))
  try:
    arrays = manager.restore(step, args=ocp.args.StandardRestore(abstract))
  except (ValueError, KeyError, TypeError) as error:
    raise ValueError(
        f"checkpoint at step {step} in {manager.directory} does not match this model/optimiser: "
        f"{error}") from error
  return template.replace(**arrays)
