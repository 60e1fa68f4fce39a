"""Label-free scores of every run (`tfcl_jax.evaluation.label_free`) on held-out data, its
labels unused, at 10%, 25% and 50% of training and at its end: what `docs/regret.md`'s round 3
selects τ by.

An experiment says what its held-out representation is (`HeldOut`, `sweep.Trainable.held_out`);
`sweep.train_run` scores it at `steps(num_steps)` into the run's `label_free.csv` and adds the
scores to the run's result row (`columns`): `label_free/<score>` at the end, and
`label_free/<score>@10%`, `@25%`, `@50%` during training.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from tfcl_jax import training
from tfcl_jax.evaluation import label_free
from tfcl_jax.training import outputs

#: Fractions of training at which the scores are read; 1 is the end of the run.
FRACTIONS = (0.1, 0.25, 0.5, 1.0)
FILE = "label_free.csv"  #: the scores at each of the steps, in the run's folder
PREFIX = "label_free/"  #: the result row's columns of the scores
#: Held-out rows scored (a fixed subset where there are more): the cost stays small.
MAX_ROWS = 2048
#: LiDAR's classes (samples) and the views of each drawn from the experiment's augmentation.
LIDAR_SAMPLES = 512
LIDAR_VIEWS = 8
#: Every run's views are drawn with this key: runs differ by their model, not by their views.
VIEW_SEED = 0


@dataclasses.dataclass(frozen=True)
class HeldOut:
  """A run's held-out representation, its labels unused.

  Attributes:
    embeddings: `[N, D]` the representation the row's metric reads (RankMe, α-ReQ, uniformity).
    first: `[M, D']` each held-out sample's first view (alignment, view retrieval).
    second: `[M, D']` its second view.
    views: `[n, q, D]` `q` views of each of `n` samples drawn from the experiment's own
      augmentation (LiDAR), or None where the views do not come from an augmentation.
  """

  embeddings: Any
  first: Any
  second: Any
  views: Any = None


def steps(num_steps: int) -> dict[float, int]:
  """`{fraction: step}`: the first step by which each of `FRACTIONS` of `num_steps` is done
  (several fractions of a short run may share a step).

  Examples:
    >>> from experiments.framework import held_out
    >>> held_out.steps(30)
    {0.1: 3, 0.25: 8, 0.5: 15, 1.0: 30}
  """
  if num_steps < 1:
    raise ValueError(f"num_steps must be >= 1, got {num_steps}.")
  return {fraction: max(1, math.ceil(fraction * num_steps - 1e-9)) for fraction in FRACTIONS}


def subset(num_rows: int, size: int = MAX_ROWS) -> np.ndarray:
  """The held-out rows scored: all of them up to `size`, else `size` rows drawn without
  replacement with `VIEW_SEED` (the same rows for every run), in increasing order."""
  if num_rows <= size:
    return np.arange(num_rows)
  return np.sort(np.random.default_rng(VIEW_SEED).choice(num_rows, size, replace=False))


_scores = jax.jit(label_free.scores)


def score(held: HeldOut) -> dict[str, float]:
  """Every score of `label_free.scores` of one `HeldOut`, as floats."""
  values = _scores(held.embeddings, held.first, held.second, views=held.views)
  return {name: float(value) for name, value in jax.device_get(values).items()}


def evaluation(held_out: Callable[[Any], HeldOut], num_steps: int) -> training.StepEvaluation:
  """The run's `training.StepEvaluation`: `score(held_out(state))` at `steps(num_steps)` into
  `FILE`."""
  return training.StepEvaluation(FILE, lambda state: score(held_out(state)),
                                 steps(num_steps).values())


def column(name: str, fraction: float) -> str:
  """The result row's column of score `name` at `fraction` of training.

  Examples:
    >>> from experiments.framework import held_out
    >>> held_out.column("rankme", 0.25), held_out.column("rankme", 1.0)
    ('label_free/rankme@25%', 'label_free/rankme')
  """
  return PREFIX + name + ("" if fraction == 1.0 else f"@{100 * fraction:g}%")


def columns(folder: str, num_steps: int) -> dict[str, float]:
  """The result row's columns from the run's `FILE` in `folder`: each score at each fraction
  of `steps(num_steps)` (a step missing from the file, e.g. one before a resume of a run begun
  without the scores, is NaN); `{}` when the run has no such file."""
  rows = outputs.read_csv(os.path.join(folder, FILE))
  if not rows:
    return {}
  names = [name for name in rows if name != "step"]
  out = {}
  for fraction, step in steps(num_steps).items():
    at = np.flatnonzero(rows["step"] == step)
    for name in names:
      out[column(name, fraction)] = float(rows[name][at[-1]]) if len(at) else math.nan
  return out
