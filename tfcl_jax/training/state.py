"""The train state: Flax Linen `TrainState` with the model's mutable state and the loss's params.

`params = {"model": ..., "loss": ...}` so one optimiser updates the network and the loss's
trainable scalars (`losses.Loss.params`: a learnable temperature's `t`, a sigmoid bias)
together, as the loss sees them.
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
    params: `{"model": model params, "loss": the loss's params}` (`{}` for a loss with none).
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
    loss_params: dict[str, Any] | None = None,
) -> TrainState:
  """Builds a `TrainState` whose params hold the model's and the loss's trainable values.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from tfcl_jax import losses
    >>> from tfcl_jax.training import state
    >>> loss = losses.from_spec("sigmoid/learnable=0.1/learn_b=siglip")
    >>> s = state.create_train_state(model_params={"w": jnp.ones(3)}, tx=optax.sgd(0.1),
    ...                              loss_params=loss.params)
    >>> sorted(s.params), round(float(s.params["loss"]["t"]), 4), float(s.params["loss"]["bias"])
    (['loss', 'model'], 2.3026, -10.0)

  Args:
    model_params: the model's trainable variables (`variables["params"]` for Linen).
    tx: the optax optimiser (see `optim.make_optimizer`).
    apply_fn: the model's apply function (kept for convenience; the step never calls it).
    model_state: other model collections, e.g. `{"batch_stats": ...}`; default `{}`.
    loss_params: the loss's trainable scalars, `losses.Loss.params` (or a `Mapping`'s
      `params`); default `{}`.

  Returns:
    A `TrainState` at step 0.
  """
  params = {"model": model_params, "loss": dict(loss_params or {})}
  # Copies: the train step donates the state's buffers, which must not delete the caller's
  # arrays (the `variables` from `model.init`, the `Loss`'s params).
  params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
  model_state = jax.tree.map(lambda x: jnp.array(x, copy=True), model_state or {})
  return TrainState.create(
      apply_fn=apply_fn or _no_apply, params=params, tx=tx,
      model_state=model_state)


def model_state(variables) -> dict:
  """A Flax model's variables other than its `params` (BatchNorm statistics, ...), the
  `model_state` of `create_train_state`; `{}` when there are none.

  Examples:
    >>> from tfcl_jax.training import state
    >>> state.model_state({"params": {"w": 1.0}, "batch_stats": {"mean": 0.0}})
    {'batch_stats': {'mean': 0.0}}
  """
  return {k: v for k, v in variables.items() if k != "params"}


def _no_apply(*args, **kwargs):
  raise NotImplementedError("create_train_state was given no apply_fn.")
