"""Temperature annealing schedules: optax-style `step -> tau` functions.

Each takes its hyperparameters positionally or by keyword, as optax's do
(`schedules.cosine(0.5, 0.1, 1000)`), and returns a jittable `schedule(step)`. Use one inside `jit`
as `mappings.temperature(schedule(step))`, or as an annealed mapping bound to the train state's
step, `mappings.from_spec("anneal=cosine:0.5:0.1:1000").bind(step=step)`. A step below 0 counts as
0, as in optax's schedules (`Mapping.bind` refuses a concrete negative or a float step).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from tfcl_jax import _checks

#: A temperature for each training step, `schedule(step) -> tau`.
Schedule = Callable[[jax.typing.ArrayLike], jax.Array]


def _step(step) -> jax.Array:
  return jnp.maximum(jnp.asarray(step, dtype=jnp.float32), 0.0)


def logarithmic(tau0: float, tau_min: float = 1e-3) -> Schedule:
  r"""Logarithmic cooling of simulated annealing: tau(t) = tau0 / log(t + 2).

  The classical schedule under which Langevin dynamics finds the global
  optimum asymptotically (see the annealing summary in `shared/papers`). At
  step 0 it gives tau0 / log 2 ~= 1.44 tau0; it never reaches zero but is
  floored at `tau_min` to keep logits finite in any precision.

  Examples:
    >>> from tfcl_jax import schedules
    >>> schedule = schedules.logarithmic(0.5)   # or logarithmic(tau0=0.5)
    >>> round(float(schedule(0)), 4)
    0.7213

  Args:
    tau0: scale of the schedule, > 0.
    tau_min: floor, > 0.

  Returns:
    A function `step -> tau` (float32 scalar), jittable.
  """
  _checks.positive_scalar(tau0, name="tau0")
  _checks.positive_scalar(tau_min, name="tau_min")

  def schedule(step):
    return jnp.maximum(tau0 / jnp.log(_step(step) + 2.0), tau_min)

  return schedule


def _interpolating(kind: str, tau_start: float, tau_end: float, steps: int) -> Schedule:
  _checks.positive_scalar(tau_start, name="tau_start")
  _checks.positive_scalar(tau_end, name="tau_end")
  _checks.positive_int(steps, name="steps")

  def schedule(step):
    fraction = jnp.clip(_step(step) / steps, 0.0, 1.0)
    if kind == "linear":
      return tau_start + (tau_end - tau_start) * fraction
    if kind == "exponential":
      # Geometric interpolation: constant ratio per step, so log tau is linear.
      return tau_start * (tau_end / tau_start) ** fraction
    # cosine: optax.cosine_decay_schedule shape between tau_start and tau_end.
    return tau_end + 0.5 * (tau_start - tau_end) * (1.0 + jnp.cos(jnp.pi * fraction))

  return schedule


def linear(tau_start: float, tau_end: float, steps: int) -> Schedule:
  r"""Linear annealing: tau(t) = tau_start + (tau_end - tau_start) min(t / steps, 1).

  Examples:
    >>> from tfcl_jax import schedules
    >>> schedule = schedules.linear(tau_start=1.0, tau_end=0.1, steps=10)
    >>> [round(float(schedule(t)), 2) for t in (0, 5, 10, 20)]
    [1.0, 0.55, 0.1, 0.1]
  """
  return _interpolating("linear", tau_start, tau_end, steps)


def exponential(tau_start: float, tau_end: float, steps: int) -> Schedule:
  r"""Exponential annealing: tau(t) = tau_start (tau_end / tau_start)^min(t / steps, 1).

  Examples:
    >>> from tfcl_jax import schedules
    >>> schedule = schedules.exponential(tau_start=1.0, tau_end=0.01, steps=10)
    >>> round(float(schedule(5)), 4)
    0.1
  """
  return _interpolating("exponential", tau_start, tau_end, steps)


def cosine(tau_start: float, tau_end: float, steps: int) -> Schedule:
  r"""Cosine annealing: tau(t) = tau_end + (tau_start - tau_end)(1 + cos(pi min(t/steps, 1))) / 2.

  Kukleva et al. (ICLR 2023) schedule temperature this way between a maximum
  and a minimum; here it runs once from `tau_start` to `tau_end`.

  Examples:
    >>> from tfcl_jax import schedules
    >>> schedule = schedules.cosine(0.5, 0.1, 100)   # tau_start, tau_end, steps
    >>> round(float(schedule(50)), 4)
    0.3
  """
  return _interpolating("cosine", tau_start, tau_end, steps)


#: The schedules by the names an annealed mapping's spec uses (`anneal=log`, ...).
SCHEDULES = {
    "log": logarithmic,
    "linear": linear,
    "exp": exponential,
    "cosine": cosine,
}
