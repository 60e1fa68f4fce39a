"""Pretrained encoder weights for fine-tuning: load an orbax checkpoint into a model's variables.

Accepts a run of `tfcl_jax.training` (SimCLR pretraining) or a plain Flax variables checkpoint
(e.g. converted torchvision weights, `torchvision_resnet`); checks it against the model first.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from tfcl_jax.training import checkpoint as checkpoint_lib
from tfcl_jax.training import loop


class CheckpointMismatchError(ValueError):
  """The checkpoint's arrays do not fit the model: missing, unexpected or misshapen variables."""


def save_variables(path: str, variables: Any) -> str:
  """Saves Flax `variables` (`{"params": ..., "batch_stats": ...}`) as an orbax checkpoint.

  `path` must not exist yet; it is made absolute and returned.

  Examples:
    >>> import os, tempfile, numpy as np
    >>> from tfcl_jax.anomaly import weights
    >>> path = weights.save_variables(os.path.join(tempfile.mkdtemp(), "w"),
    ...                               {"params": {"Dense_0": {"kernel": np.ones((2, 3))}}})
    >>> os.path.isdir(path)
    True
  """
  path = os.path.abspath(path)
  if os.path.exists(path):
    raise ValueError(f"path {path!r} already exists; choose a new one (nothing was overwritten).")
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(path, jax.tree.map(np.asarray, variables))
  checkpointer.wait_until_finished()
  return path


def _resolve(path: str) -> str:
  """The orbax item directory of `path`: a run's workdir, its `checkpoints/`, or a saved item."""
  path = os.path.abspath(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"init_checkpoint {path!r} does not exist or is not a directory.")
  if os.path.isdir(os.path.join(path, loop.CHECKPOINT_DIR)):
    path = os.path.join(path, loop.CHECKPOINT_DIR)
  steps = [name for name in os.listdir(path) if name.isdigit()]
  if steps:
    step = checkpoint_lib.make_manager(path).latest_step()
    if step is None:
      raise FileNotFoundError(f"init_checkpoint {path!r} holds no finished checkpoint.")
    return os.path.join(path, str(step), "default")
  return path


def _variables_of(tree: dict, *, submodule: str | None) -> dict:
  """Flax variables from a restored tree: a `TrainState`'s arrays or plain variables."""
  if isinstance(tree.get("params"), dict) and "model" in tree["params"] and "opt_state" in tree:
    variables = {"params": tree["params"]["model"], **(tree.get("model_state") or {})}
  else:
    variables = dict(tree)
  if submodule is not None:
    variables = {collection: sub[submodule] for collection, sub in variables.items()
                 if isinstance(sub, dict) and submodule in sub}
  return variables


def _describe(tree) -> dict[str, tuple]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(path): tuple(np.shape(leaf)) for path, leaf in leaves}


def check_variables(variables: Any, template: Any, *, source: str = "checkpoint") -> None:
  """Raises `CheckpointMismatchError` unless `variables` has `template`'s paths and shapes.

  Examples:
    >>> import numpy as np
    >>> from tfcl_jax.anomaly import weights
    >>> weights.check_variables({"params": {"w": np.ones(3)}}, {"params": {"w": np.ones(4)}})
    Traceback (most recent call last):
    ...
    tfcl_jax.anomaly.weights.CheckpointMismatchError: checkpoint does not match the model: ...
  """
  have, want = _describe(variables), _describe(template)
  problems = []
  missing = [k for k in want if k not in have]
  unexpected = [k for k in have if k not in want]
  misshapen = [f"{k}: checkpoint {have[k]}, model {want[k]}" for k in want
               if k in have and have[k] != want[k]]
  for title, items in (("missing", missing), ("unexpected", unexpected),
                       ("shape mismatch", misshapen)):
    if items:
      shown = "; ".join(items[:5]) + (f"; ... ({len(items) - 5} more)" if len(items) > 5 else "")
      problems.append(f"{len(items)} {title}: {shown}")
  if problems:
    raise CheckpointMismatchError(f"{source} does not match the model: " + " | ".join(problems)
                                  + ". Check the backbone, width and dataset of the config.")


def load_variables(path: str, template: Any, *, submodule: str | None = None) -> dict:
  """Loads the variables of `path` that fit `template` (e.g. `jax.eval_shape(model.init, ...)`).

  `path` is one of: the workdir of a `tfcl_jax.training.train` run (its latest checkpoint), its
  `checkpoints/` directory, or a checkpoint written by `save_variables`. From a training run the
  model's `params` and `model_state` collections are taken; `submodule` selects one submodule of
  them (`"backbone"` takes the encoder of a `models.ContrastiveModel` and drops its head).

  Examples:
    >>> import os, tempfile, jax, jax.numpy as jnp, flax.linen as nn
    >>> from tfcl_jax.anomaly import weights
    >>> model = nn.Dense(3)
    >>> variables = model.init(jax.random.key(0), jnp.ones((1, 2)))
    >>> path = weights.save_variables(os.path.join(tempfile.mkdtemp(), "w"), variables)
    >>> template = jax.eval_shape(model.init, jax.random.key(1), jnp.ones((1, 2)))
    >>> loaded = weights.load_variables(path, template)
    >>> bool(jnp.all(loaded["params"]["kernel"] == variables["params"]["kernel"]))
    True
    >>> weights.load_variables(path, jax.eval_shape(nn.Dense(4).init, jax.random.key(1),
    ...                                             jnp.ones((1, 2))))
    Traceback (most recent call last):
    ...
    tfcl_jax.anomaly.weights.CheckpointMismatchError: ...2 shape mismatch: ['params']['bias']...

  Args:
    path: checkpoint directory (see above).
    template: the model's variables, or their shapes (`jax.ShapeDtypeStruct`).
    submodule: name of a submodule whose variables to take, or None.

  Returns:
    The variables with `template`'s structure, as arrays in `template`'s dtypes.

  Raises:
    FileNotFoundError: `path` is not a checkpoint directory.
    CheckpointMismatchError: the variables' names or shapes differ from `template` (all listed).
  """
  item = _resolve(path)
  try:
    tree = ocp.StandardCheckpointer().restore(item)
  except (ValueError, FileNotFoundError, KeyError) as error:
    raise FileNotFoundError(f"init_checkpoint {path!r} is not a readable orbax checkpoint: "
                            f"{error}") from error
  variables = _variables_of(tree, submodule=submodule)
  check_variables(variables, template, source=item)
  return jax.tree.map(lambda leaf, want: np.asarray(leaf, dtype=want.dtype),
                      _prune_to(variables, template), template)


def _prune_to(tree, template):
  """`tree` restricted to the keys of `template` (checked equal, apart from empty collections)."""
  if isinstance(template, dict):
    # Leaves were checked; only empty collections (`{}`) can be absent from `tree`.
    return {key: _prune_to(tree.get(key, {}), value) for key, value in template.items()}
  return tree
