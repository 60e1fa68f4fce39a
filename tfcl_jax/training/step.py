"""The train-step builder: one `jax.jit` with explicit shardings over a mesh's `data` axis.

The user's loss decides what a step computes (SimCLR, GRACE, supervised); the builder adds the
gradient, the optimiser update, the gradient norm and the placement on devices.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

import jax
import optax
from jax.sharding import Mesh

from tfcl_jax.training import sharding
from tfcl_jax.training.state import TrainState

#: `loss_fn(params, model_state, batch, key, step) -> (loss, (new_model_state, metrics))`.
LossFn = Callable[[Any, Any, Any, jax.Array, jax.Array], tuple[jax.Array, tuple[Any, dict]]]


def make_train_step(
    loss_fn: LossFn,
    *,
    mesh: Mesh,
    batch_sharded: bool = True,
    donate: bool = True,
) -> Callable[[TrainState, Any, jax.Array], tuple[TrainState, dict[str, jax.Array]]]:
  """Compiles `step(state, batch, key) -> (new_state, metrics)` for `mesh`.

  `loss_fn(params, model_state, batch, key, step)` returns
  `(loss, (new_model_state, metrics))`: `params` is `state.params` (`{"model", "loss"}`),
  `key` is `fold_in(key, state.step)` (a resumed run draws the same randomness), `metrics` a dict
  of scalars. The step adds `loss`, `grad_norm` (global L2 norm of the gradient of the *model*
  parameters, ||dL/dW||) and the loss's parameters (`loss/t`, `loss/bias`).

  Placement: parameters, optimiser state and metrics are replicated; the batch's leading axis is
  split over `data` (`batch_sharded=True`) or the batch is replicated (a whole graph,
  full-batch training). Under `jit` the computation is that of one global batch, so BatchNorm
  statistics and the loss use the global batch: the result does not depend on the device count.
  `donate=True` reuses the old state's buffers (do not use the old state afterwards).

  Examples:
    A loss that is not SimCLR: least squares with a learnable scale, on one replicated batch.

    >>> import jax, jax.numpy as jnp, optax
    >>> from tfcl_jax.training import sharding, state, step
    >>> def loss_fn(params, model_state, batch, key, step_index):
    ...   prediction = batch["x"] @ params["model"]["w"] * params["loss"]["scale"]
    ...   loss = jnp.mean((prediction - batch["y"]) ** 2)
    ...   return loss, (model_state, {"mse": loss})
    >>> mesh = sharding.make_mesh(jax.devices()[:1])
    >>> s = state.create_train_state(model_params={"w": jnp.zeros(3)}, tx=optax.adam(0.1),
    ...                              loss_params={"scale": jnp.ones(())})
    >>> train_step = step.make_train_step(loss_fn, mesh=mesh, batch_sharded=False)
    >>> batch = {"x": jnp.eye(3), "y": jnp.array([1.0, 2.0, 3.0])}
    >>> for _ in range(100):
    ...   s, metrics = train_step(s, batch, jax.random.key(0))
    >>> bool(metrics["mse"] < 0.05), sorted(metrics)
    (True, ['grad_norm', 'loss', 'loss/scale', 'mse'])

  Args:
    loss_fn: see above; pure and traceable.
    mesh: a mesh with a `data` axis (`sharding.make_mesh`).
    batch_sharded: split the batch over `data` (True) or replicate it (False).
    donate: donate the input state's buffers.

  Returns:
    The jitted step. Pass batches placed by `sharding.shard_batch(batch, mesh,
    sharded=batch_sharded)` (host NumPy arrays also work on one host).
  """
  if not callable(loss_fn):
    raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}.")
  if sharding.DATA_AXIS not in mesh.axis_names:
    raise ValueError(f"mesh must have a {sharding.DATA_AXIS!r} axis, got {mesh.axis_names}.")

  def train_step(state: TrainState, batch: Any, key: jax.Array):
    step_key = jax.random.fold_in(key, state.step)

    def objective(params):  # under jit the step is an int32 array, never a Python int
      return loss_fn(params, state.model_state, batch, step_key, cast(jax.Array, state.step))

    (loss, (model_state, metrics)), grads = jax.value_and_grad(objective, has_aux=True)(
        state.params)
    new_state = state.apply_gradients(grads=grads, model_state=model_state)
    metrics = dict(metrics)
    metrics["loss"] = loss
    metrics["grad_norm"] = optax.tree.norm(grads["model"])
    for name, value in state.params["loss"].items():
      metrics[f"loss/{name}"] = value
    return new_state, metrics

  replicated = sharding.replicated(mesh)
  batch_placement = sharding.data_sharded(mesh) if batch_sharded else replicated
  jitted = jax.jit(
      train_step,
      in_shardings=(replicated, batch_placement, replicated),
      out_shardings=(replicated, replicated),
      donate_argnums=(0,) if donate else ())

  @functools.wraps(train_step)
  def placed_step(state: TrainState, batch: Any, key: jax.Array):
    # A fresh state (host step counter, single-device arrays) would compile a second program,
    # for an input placement that differs from the replicated states the step returns.
    if getattr(state.step, "sharding", None) != replicated:
      state = sharding.replicate(state, mesh)
    return jitted(state, batch, key)

  placed_step.jitted = jitted  # pyright: ignore[reportAttributeAccessIssue]  # a function attribute
  return placed_step
