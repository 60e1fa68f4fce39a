"""A solved scale's path over training, from a sweep's run logs, for the figure of the scales.

Sweeps other than retrieval record a solved scale in their table only at the end
(`final_scale`); each run's `metrics.csv` logs it at every logged step (`loss/scale`). This
module reads those logs from a sweep's workdir and writes `results/<table>_scales.csv`: per run
spec and seed, the scale at the fractions 0, 0.05, …, 1 of training (interpolated linearly in
the step between logged steps; a spec and seed with several runs, MSC's normal classes, gives
their mean). `experiments.regret.scales` draws a row's trajectory from that file where it
exists.

    python -m experiments.regret.traces --table regret2_msc_digits --workdir runs/regret2/msc_digits

A sweep still running keeps, beside its finished runs' `result.json` in
`experiments/results/unfinished/NAME`, their logs cut to what a trace reads (`--cut_into`).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
from collections.abc import Sequence

import numpy as np

from experiments.regret.runs import RESULTS

#: Fractions of training at which a trace is sampled.
PROGRESS = tuple(round(k / 20, 2) for k in range(21))
COLUMN = "loss/scale"
SUFFIX = "_scales"


def _run_log(folder: str) -> tuple[str, int, np.ndarray, np.ndarray] | None:
  """`(spec, seed, steps, scales)` of the run in `folder`, or None where it has no finished
  result or no finite logged scale."""
  result, log = os.path.join(folder, "result.json"), os.path.join(folder, "metrics.csv")
  if not (os.path.exists(result) and os.path.exists(log)):
    return None
  with open(result) as f:
    outcome = json.load(f)
  with open(log, newline="") as f:
    lines = [line for line in csv.DictReader(f)
             if line.get(COLUMN) not in (None, "") and math.isfinite(float(line[COLUMN]))]
  if not lines:
    return None
  steps = np.array([float(line["step"]) for line in lines])
  order = np.argsort(steps, kind="stable")
  return (str(outcome["spec"]), int(outcome["seed"]), steps[order],
          np.array([float(lines[i][COLUMN]) for i in order]))


def sample(steps: np.ndarray, scales: np.ndarray) -> np.ndarray:
  """The scale at each of `PROGRESS`, the fraction of the last logged step (the first logged
  value before the first step logged)."""
  return np.interp(np.asarray(PROGRESS) * steps[-1], steps, scales)


def kept_steps(steps: np.ndarray) -> np.ndarray:
  """The indices of the logged `steps` that `sample` reads: the first, and the two logged steps
  around each sampled one, so that a log cut to them samples as the whole log does."""
  at = np.asarray(PROGRESS) * steps[-1]
  right = np.clip(np.searchsorted(steps, at), 0, len(steps) - 1)
  return np.unique(np.concatenate([[0], right, np.maximum(right - 1, 0)]))


def cut(workdir: str, dest: str) -> int:
  """Copies, for every finished run under `workdir/runs` that logs a scale, its `result.json`
  and its `metrics.csv` cut to `step` and `loss/scale` at `kept_steps` into the same folder
  under `dest` (what a sweep kept to resume elsewhere needs for its traces). Returns the number
  of runs cut."""
  count = 0
  for folder, _, files in sorted(os.walk(os.path.join(workdir, "runs"))):
    found = _run_log(folder) if "result.json" in files else None
    if found is None:
      continue
    _, _, steps, scales = found
    out = os.path.join(dest, os.path.relpath(folder, workdir))
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(os.path.join(folder, "result.json"), os.path.join(out, "result.json"))
    with open(os.path.join(out, "metrics.csv"), "w", newline="") as f:
      lines = csv.writer(f)
      lines.writerow(("step", COLUMN))
      for i in kept_steps(steps):
        lines.writerow((f"{steps[i]:g}", repr(float(scales[i]))))
    count += 1
  return count


def read_workdir(workdir: str) -> dict[tuple[str, int], np.ndarray]:
  """`(spec, seed) -> scale at PROGRESS` for every finished run under `workdir/runs` that logs a
  scale, the mean over a spec and seed's runs."""
  runs: dict[tuple[str, int], list[np.ndarray]] = {}
  for folder, _, files in sorted(os.walk(os.path.join(workdir, "runs"))):
    if "result.json" in files:
      found = _run_log(folder)
      if found is not None:
        spec, seed, steps, scales = found
        runs.setdefault((spec, seed), []).append(sample(steps, scales))
  return {key: np.mean(values, axis=0) for key, values in sorted(runs.items())}


def write(table: str, traced: dict[tuple[str, int], np.ndarray], results: str = RESULTS) -> str:
  """`results/<table>_scales.csv`: one line per spec, seed and fraction of training."""
  if not traced:
    raise ValueError(f"no run under the workdir logs `{COLUMN}` for table {table!r}")
  path = os.path.join(results, table + SUFFIX + ".csv")
  with open(path, "w", newline="") as f:
    out = csv.writer(f)
    out.writerow(("spec", "seed", "progress", "scale"))
    for (spec, seed), scales in traced.items():
      for progress, scale in zip(PROGRESS, scales, strict=True):
        out.writerow((spec, seed, progress, f"{float(scale):.6g}"))
  return path


def read(table: str, results: str = RESULTS) -> dict[tuple[str, int], tuple[tuple[float, ...],
                                                                             tuple[float, ...]]]:
  """`(spec, seed) -> (progress, scale)` of `results/<table>_scales.csv` ({} without one)."""
  path = os.path.join(results, table + SUFFIX + ".csv")
  if not os.path.exists(path):
    return {}
  points: dict[tuple[str, int], list[tuple[float, float]]] = {}
  with open(path, newline="") as f:
    for line in csv.DictReader(f):
      key = (line["spec"], int(line["seed"]))
      points.setdefault(key, []).append((float(line["progress"]), float(line["scale"])))
  return {key: (tuple(p for p, _ in sorted(v)), tuple(s for _, s in sorted(v)))
          for key, v in points.items()}


def main(argv: Sequence[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--table", help="the committed table the runs belong to")
  parser.add_argument("--workdir", required=True, help="the sweep's workdir")
  parser.add_argument("--results", default=RESULTS)
  parser.add_argument("--cut_into", help="instead: write the runs' logs cut to what a trace "
                      "reads into this folder (`experiments/results/unfinished/NAME`)")
  args = parser.parse_args(argv)
  if args.cut_into:
    print(f"cut {cut(args.workdir, args.cut_into)} run logs into {args.cut_into}")
    return args.cut_into
  if not args.table:
    raise ValueError("--table: the committed table the runs belong to is required")
  if not os.path.exists(os.path.join(args.results, args.table + ".csv")):
    raise ValueError(f"--table: {args.table}.csv is not in {args.results}")
  path = write(args.table, read_workdir(args.workdir), args.results)
  print(f"wrote {path}")
  return path


if __name__ == "__main__":
  main()
