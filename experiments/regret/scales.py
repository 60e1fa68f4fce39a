"""What each candidate's scale did over training, from the per-run columns of the committed CSVs.

A run records its scale in one of three ways: the retrieval sweeps write `scale_start` and the
scale after each epoch, `scale@1 .. scale@E`; the other sweeps write the learnt `final_t`, whose
scale is `min(exp(t), cap)` with the start and the cap of the candidate's spec
(`tfcl_jax.mappings.logit_scale`, `max_logit_scale`); a scale solved from the batch writes
`final_scale`, the last one, and its path over training where the sweep's run logs were traced
into `<table>_scales.csv` (`experiments.regret.traces`), which is preferred. Rows and candidates
with none of them are left out, and named.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

import numpy as np

from experiments.regret import traces as run_logs
from experiments.regret.rows import CANDIDATES, Row
from experiments.regret.runs import RESULTS, candidate_of, read_table

_EPOCH = re.compile(r"scale@(\d+)")


@dataclasses.dataclass(frozen=True)
class ScaleTrace:
  """A candidate's scale on a row, mean over `seeds` runs of `table`, at fractions of training
  (`progress`, 0 the start, 1 the end)."""
  row: Row
  candidate: str
  table: str
  seeds: int
  progress: tuple[float, ...]
  scale: tuple[float, ...]


def _finite(line: dict, column: str) -> float | None:
  value = line.get(column, "")
  if value in ("", None):
    return None
  value = float(value)
  return value if math.isfinite(value) else None


def _learnt(candidate: str, t: float) -> tuple[float, float]:
  """`(start, end)` of a learnt scale `min(exp(t), cap)` of the candidate's spec."""
  from tfcl_jax import mappings  # noqa: PLC0415

  mapping = mappings.from_spec(candidate)
  cap = mappings.max_logit_scale(mapping)
  return float(mappings.logit_scale(mapping)), min(math.exp(t), cap or math.inf)


def trajectory(line: dict, candidate: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
  """`(progress, scale)` of one run's line, or None when it records no scale."""
  epochs = sorted(int(m.group(1)) for m in map(_EPOCH.fullmatch, line) if m)
  per_epoch = [_finite(line, f"scale@{e}") for e in epochs]
  if epochs and all(v is not None for v in per_epoch):
    start = _finite(line, "scale_start")
    points = [(e / epochs[-1], v) for e, v in zip(epochs, per_epoch, strict=True)]
    points = ([(0.0, start)] if start is not None else []) + points
    return tuple(p for p, _ in points), tuple(v for _, v in points)
  t = _finite(line, "final_t")
  if t is not None:
    start, end = _learnt(candidate, t)
    return (0.0, 1.0), (start, end)
  final = _finite(line, "final_scale")
  return ((1.0,), (final,)) if final is not None else None


def traces(rows: Sequence[Row], results: str = RESULTS) -> list[ScaleTrace]:
  """Each (row, candidate) whose runs record a scale (a traced path first, `trajectory`
  otherwise): the first of the row's tables that does, over its first `row.seeds` seeds (a
  run's several lines, MSC's classes, give one trace). Rows that read the same runs (SimCLR on
  MNIST-1D, kNN and linear) give them once, for the first."""
  out = []
  cache: dict[str, list[dict] | None] = {}
  logged: dict[str, dict] = {}
  seen = set()
  for row in rows:
    for candidate in CANDIDATES:
      for table in row.tables():
        if (table, row.loss(candidate)) in seen:
          break
        if table not in cache:
          cache[table] = read_table(table, results)
          logged[table] = run_logs.read(table, results)
        by_seed = {}
        for line in cache[table] or ():
          if candidate_of(str(line["spec"]), row) == candidate:
            found = (logged[table].get((str(line["spec"]), int(line["seed"])))
                     or trajectory(line, candidate))
            if found is not None:
              by_seed.setdefault(int(line["seed"]), found)
        seeds = sorted(by_seed)[:row.seeds]
        shapes = {by_seed[s][0] for s in seeds}
        if len(shapes) == 1:
          progress = shapes.pop()
          mean = np.mean([by_seed[s][1] for s in seeds], axis=0)
          out.append(ScaleTrace(row, candidate, table, len(seeds), progress,
                                tuple(float(v) for v in mean)))
          seen.add((table, row.loss(candidate)))
          break
  return out
