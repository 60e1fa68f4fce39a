"""optax optimisers by name: SGD + momentum (the paper's recipe), LARS, AdamW, Adam; cosine LR.

Weight decay applies to the model's parameters only, never to the loss's (a learnable
temperature, a sigmoid bias).
"""

from __future__ import annotations

import jax
import optax

#: The optimizers `make_optimizer` builds, by name.
OPTIMIZERS = ("sgd", "lars", "adamw", "adam", "adagrad")
#: The learning-rate schedules `learning_rate_schedule` builds, by name.
SCHEDULES = ("cosine", "constant")


def learning_rate_schedule(
    *, learning_rate: float, total_steps: int, warmup_steps: int = 0, schedule: str = "cosine"
) -> optax.Schedule:
  """Linear warm-up for `warmup_steps`, then cosine annealing to 0 at `total_steps` (or constant).

  Examples:
    >>> from tfcl_jax.training import optim
    >>> lr = optim.learning_rate_schedule(learning_rate=0.06, total_steps=100)
    >>> round(float(lr(0)), 6), float(lr(100))
    (0.06, 0.0)
  """
  if schedule not in SCHEDULES:
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}.")
  if not learning_rate > 0:
    raise ValueError(f"learning_rate must be > 0, got {learning_rate!r}.")
  if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
    raise ValueError(
        f"need total_steps >= 1 and 0 <= warmup_steps <= total_steps, got total_steps="
        f"{total_steps}, warmup_steps={warmup_steps}.")
  if schedule == "constant":
    main = optax.constant_schedule(learning_rate)
  else:
    main = optax.cosine_decay_schedule(learning_rate, max(total_steps - warmup_steps, 1))
  if warmup_steps == 0:
    return main
  warmup = optax.linear_schedule(0.0, learning_rate, warmup_steps)
  return optax.join_schedules([warmup, main], [warmup_steps])


def model_mask(params):
  """True for leaves under `params["model"]`: what weight decay and LARS trust ratios touch."""
  return {name: jax.tree.map(lambda _, decay=(name == "model"): decay, sub)
          for name, sub in params.items()}


def make_optimizer(
    *,
    name: str = "sgd",
    learning_rate: float,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: str = "cosine",
    momentum: float = 0.9,
    weight_decay: float = 0.0,
) -> optax.GradientTransformation:
  """An optax optimiser for `TrainState.params = {"model": ..., "loss": ...}`.

  * `sgd`: SGD with (heavy-ball) momentum, L2 weight decay added to the
    gradient (as `torch.optim.SGD(weight_decay=...)`): the paper's recipe, Section 5.1.
  * `lars`: `optax.lars` (trust ratios on model parameters only).
  * `adamw`: `optax.adamw` (decoupled weight decay).
  * `adam`: `optax.adam` with L2 weight decay added to the gradient, as
    `torch.optim.Adam(weight_decay=...)` (GRACE's optimiser).
  * `adagrad`: `optax.adagrad` with Keras's defaults (initial accumulator 0.1, eps 1e-7), the
    optimiser of TensorFlow Recommenders' retrieval tutorial; L2 weight decay as `adam`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.training import optim
    >>> tx = optim.make_optimizer(name="sgd", learning_rate=0.06, total_steps=10,
    ...                           weight_decay=5e-4)
    >>> params = {"model": {"w": jnp.ones(2)}, "loss": {"t": jnp.zeros(())}}
    >>> _ = tx.init(params)

  Args:
    name: one of `OPTIMIZERS`.
    learning_rate: peak learning rate.
    total_steps: length of the cosine schedule.
    warmup_steps: linear warm-up steps.
    schedule: `"cosine"` or `"constant"`.
    momentum: momentum of SGD and LARS.
    weight_decay: L2 coefficient on the model's parameters.

  Returns:
    An `optax.GradientTransformation`.
  """
  if name not in OPTIMIZERS:
    raise ValueError(f"optimizer name must be one of {OPTIMIZERS}, got {name!r}.")
  if weight_decay < 0:
    raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}.")
  lr = learning_rate_schedule(
      learning_rate=learning_rate, total_steps=total_steps, warmup_steps=warmup_steps,
      schedule=schedule)
  if name == "sgd":
    return optax.chain(
        optax.add_decayed_weights(weight_decay, mask=model_mask),
        optax.sgd(lr, momentum=momentum or None))
  if name == "lars":
    return optax.lars(
        lr, weight_decay=weight_decay, weight_decay_mask=model_mask,
        trust_ratio_mask=model_mask, momentum=momentum)
  if name == "adamw":
    return optax.adamw(lr, weight_decay=weight_decay, mask=model_mask)
  if name == "adagrad":
    inner = optax.adagrad(lr, initial_accumulator_value=0.1, eps=1e-7)
  else:
    inner = optax.adam(lr)
  return optax.chain(optax.add_decayed_weights(weight_decay, mask=model_mask), inner)
