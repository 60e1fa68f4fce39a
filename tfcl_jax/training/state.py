"""The train state: Flax Linen `TrainState` with the model's mutable state and the mapping's params.

`params = {"model": ..., "mapping": ...}` so one optimiser updates the network and a learnable
temperature (`mappings.learnable_temperature`, `{"t": ...}`) together, as the loss sees them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training import train_state


class TrainState(train_state.TrainState):
  """`flax.training.train_state.TrainState` plus `model_state` (e.g. `{"batch_stats": ...}`).

  Attributes:
    step: int32 scalar, the number of updates applied.
    params: `{"model": model params, "mapping": mapping params}` (the latter `{}` for fixed maps).
    model_state: non-trained model variables (BatchNorm statistics), `{}` when there are none.
    opt_state, tx, apply_fn: as in Flax.
  """

  model_state: Any = struct.field(default_factory=dict)


def create_train_state(
    *,
    model_params: Any,
    tx: optax.GradientTransformation,
    apply_fn: Callable[..., Any] | None = None,
    model_state: Any = None,
    mapping_params: dict[str, Any] | None = None,
) -> TrainState:
  """Builds a `TrainState` whose params hold the model's and the mapping's trainable values.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from tfcl_jax import mappings
    >>> from tfcl_jax.training import state
    >>> mapping = mappings.from_spec("learnable=0.1")
    >>> s = state.create_train_state(model_params={"w": jnp.ones(3)}, tx=optax.sgd(0.1),
    ...                              mapping_params=mapping.params)
    >>> sorted(s.params), round(float(s.params["mapping"]["t"]), 4)
    (['mapping', 'model'], 2.3026)

  Args:
    model_params: the model's trainable variables (`variables["params"]` for Linen).
    tx: the optax optimiser (see `optim.make_optimizer`).
    apply_fn: the model's apply function (kept for convenience; the step never calls it).
    model_state: other model collections, e.g. `{"batch_stats": ...}`; default `{}`.
    mapping_params: `mapping.params`; default `{}`.

  Returns:
    A `TrainState` at step 0.
  """
  params = {"model": model_params, "mapping": dict(mapping_params or {})}
  # Copies: the train step donates the state's buffers, which must not delete the caller's
  # arrays (the `variables` from `model.init`, the `Mapping` object's params).
  params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
  model_state = jax.tree.map(lambda x: jnp.array(x, copy=True), model_state or {})
  return TrainState.create(
      apply_fn=apply_fn or _no_apply, params=params, tx=tx,
      model_state=model_state)


def _no_apply(*args, **kwargs):
  raise NotImplementedError("create_train_state was given no apply_fn.")
