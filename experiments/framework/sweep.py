"""A sweep: every planned run trained once, finished runs read back, the tables rewritten as runs
end.

- `run_all`: a finished run leaves `result.json` in its folder and is never recomputed; an
  interrupted run continues from its last step checkpoint (`tfcl_jax.training.train`); the
  tables are rewritten after every finished run, so an interrupted sweep leaves the finished
  part of its table on disk;
- every `result.json` is written whole or not at all; one that does not parse (a damaged
  disk) is not finished and the run is redone, with a one-line notice; the result of a
  `plan.Run` names the run's spec in its `spec` column, and one that does not is refused
  (`result_of`);
- `train_arguments`: what one run passes to `tfcl_jax.training.train`, the same for every
  experiment (its folder, its recorded config, `resume`, `progress`, its label);
- `train_run`: one run trained the same way for every experiment that builds it as a
  `Trainable` (its loss from its spec, its keys, the mesh, `tfcl_jax.training.train`) and its
  result row's common columns (`spec`, `seed`, `final_loss`, `final_<param>`,
  `train_seconds`);
- `finished_runs`: a finished workdir read back (what `experiments.grace.probe` probes);
- `study`: a study's `train_and_evaluate` (no runs: its tables computed in one go) under the
  same workdir rules as a sweep: its lock held throughout, its config recorded and checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from experiments.framework import held_out as held_outs
from experiments.framework import plan
from experiments.framework import workdir as workdirs
from tfcl_jax import training
from tfcl_jax.training import files
from tfcl_jax.training import outputs as run_outputs

RESULT_FILE = "result.json"
_NOTICES: set = set()  # result files already noticed in this process


def read_result(path: str) -> dict | None:
  """The result row in the `result.json` at `path`, or None: no such file, or one that does
  not parse as a JSON object (then a one-line notice on stderr: the run is not finished)."""
  try:
    with open(path) as f:
      result = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as error:
    result = error
  if isinstance(result, dict):
    return result
  if path not in _NOTICES:
    _NOTICES.add(path)
    detail = result if isinstance(result, Exception) else f"a {type(result).__name__}"
    print(f"note: {path} does not hold a result ({detail}); the run is redone", file=sys.stderr)
  return None


def result_of(run, path: str) -> dict | None:
  """`read_result(path)` of `run`'s `result.json`.

  Raises:
    plan.ConfigError: `run` is a `plan.Run` and the result does not hold its spec in the
      `spec` column, naming the file and the columns it has.
  """
  result = read_result(path)
  if (result is not None and isinstance(run, plan.Run)
      and result.get("spec") != run.spec):
    raise plan.ConfigError(
        f"{path} is no result of run {run.spec!r} seed {run.seed}: expected the column "
        f"'spec' = {run.spec!r}, found the columns {', '.join(map(str, result))}. Delete the "
        "file to train the run again, or use a new workdir.")
  return result


def finished(run: plan.Run, workdir: str) -> bool:
  """Whether `run` left a `result.json` that parses in `workdir` (`result_of`)."""
  return result_of(run, os.path.join(run.directory(workdir), RESULT_FILE)) is not None


def finished_runs(workdir: str, *, axes: Sequence[str] = ()) -> list[tuple[plan.Run, dict]]:
  """Every finished run of `workdir` (its folder holds `result.json`), with its result row,
  in folder order; `axes`: the experiment's axis names."""
  found = []
  for folder in sorted(workdirs.run_folders(workdir)):
    run = workdirs.run_of(folder, axes)
    result = result_of(run, os.path.join(folder, RESULT_FILE)) if run is not None else None
    if result is not None:
      found.append((run, result))
  return found


def train_arguments(config, run: plan.Run, workdir: str, *,
                    plan_fields: Sequence[str] = ()) -> dict[str, Any]:
  """The keyword arguments of `tfcl_jax.training.train` that every run passes alike: its
  folder (`workdir`), its recorded config (`plan.recorded` with the run's identity),
  `resume` and `progress` (`plan.resume`, `plan.progress`) and its label (`desc`)."""
  return {"workdir": run.directory(workdir), "desc": run.label(),
          "config": {**plan.recorded(config, plan_fields=plan_fields), **run.record()},
          "resume": plan.resume(config), "progress": plan.progress(config)}


@dataclasses.dataclass(frozen=True)
class Trained:
  """What a trained run left: its final train state, the columns of its `metrics.csv` and
  `eval.csv` (`tfcl_jax.training.outputs.read_csv`: float arrays, `{}` when absent) and its
  training seconds (the parts before a resume included)."""

  state: Any
  metrics: dict[str, np.ndarray]
  evaluations: dict[str, np.ndarray]
  seconds: float

  @property
  def final_loss(self) -> float:
    """The last logged training loss (NaN when none was logged)."""
    history = self.metrics.get("loss")
    return float(history[-1]) if history is not None and len(history) else float("nan")


@dataclasses.dataclass(frozen=True)
class Trainable:
  """One run as its experiment builds it, for `train_run`: the initial train state, the train
  step, `batches(first_step)` (the batches after `first_step`), the step count, any other
  keyword of `tfcl_jax.training.train` (`checkpoint_every`, `eval_every`, `eval_fn`,
  `examples_per_step`, `batch_sharded`), `result(trained) -> {column: value}`, the
  experiment's own columns of the run's row, and `held_out(state) -> held_out.HeldOut`, its
  held-out representation for the label-free scores (`experiments.framework.held_out`; None:
  none scored)."""

  state: Any
  train_step: Any
  batches: Callable[[int], Iterable]
  num_steps: int
  result: Callable[[Trained], dict]
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  held_out: Callable[[Any], held_outs.HeldOut] | None = None


def train_run(config, run: plan.Run, workdir: str, *, num_candidates: int,
              build: Callable[..., Trainable], keys: int = 3, mesh=None,
              plan_fields: Sequence[str] = ()) -> dict:
  """Trains `run` as every sweep does, and returns its result row.

  The run's loss is the one its plan parsed, built for the candidates per anchor of the
  experiment's batch (`run.loss.build(num_candidates)`, `losses.num_candidates`); its seed
  splits into `keys`
  keys (initialisation, training, then evaluation ones), or with `keys=1` is itself the one
  key, the training key (a run with nothing else to draw: MSC fine-tunes a pretrained
  encoder and scores deterministically); `mesh` (default: one over the first
  `config.num_devices` devices) is the sweep's when it compiles its steps once.
  `build(loss, run_keys, mesh) -> Trainable` makes the rest; `tfcl_jax.training.train` trains
  it in the run's folder (`train_arguments` with the experiment's `plan_fields`, logging every
  `config.log_every` steps, resuming from its last checkpoint), scoring `Trainable.held_out`
  at 10%, 25% and 50% of its steps and at the end (`held_out.evaluation`).

  Returns:
    `spec` (the run's loss spec), `seed`, `final_loss`, `final_<name>` for each of the loss's
    trained values (`final_t`, `final_bias`), `final_scale` (the last logged scale a
    batch-scaled mapping solved, `loss/scale`), `train_seconds`, the columns of
    `Trainable.result` and the label-free scores (`held_out.columns`).
  """
  if run.loss is None:
    raise ValueError(f"run {run.spec!r} carries no parsed loss: plan.plan makes the runs of "
                     "the losses of a config.")
  loss = run.loss.build(num_candidates)
  if keys < 1:
    raise ValueError(f"keys must be >= 1, got {keys}.")
  seed_key = jax.random.key(run.seed)
  run_keys = (seed_key,) if keys == 1 else tuple(jax.random.split(seed_key, keys))
  train_key = seed_key if keys == 1 else run_keys[1]
  if mesh is None:
    mesh = training.make_mesh(jax.devices()[:config.num_devices])
  trainable = build(loss, run_keys, mesh)
  evaluations = ([] if trainable.held_out is None else
                 [held_outs.evaluation(trainable.held_out, trainable.num_steps)])
  state = training.train(
      trainable.state, train_step=trainable.train_step, batches=trainable.batches,
      num_steps=trainable.num_steps, key=train_key, mesh=mesh, log_every=config.log_every,
      evaluations=evaluations, **trainable.options,
      **train_arguments(config, run, workdir, plan_fields=plan_fields))
  folder = run.directory(workdir)
  trained = Trained(state, run_outputs.read_csv(os.path.join(folder, run_outputs.METRICS_FILE)),
                    run_outputs.read_csv(os.path.join(folder, run_outputs.EVAL_FILE)),
                    run_outputs.training_seconds(folder))
  learnt = {f"final_{name}": float(np.asarray(value))
            for name, value in state.params["loss"].items()}
  solved = trained.metrics.get("loss/scale")  # a scale the loss solved from each batch
  if solved is not None and len(solved):
    learnt["final_scale"] = float(solved[-1])
  return {"spec": run.spec, "seed": run.seed, "final_loss": trained.final_loss, **learnt,
          "train_seconds": round(trained.seconds, 2), **trainable.result(trained),
          **held_outs.columns(folder, trainable.num_steps)}


def run_all(runs: Sequence, train: Callable[[Any], dict], *, workdir: str,
            write_tables: Callable[[list[dict]], None] | None = None, progress: bool = True,
            desc: str = "runs") -> list[dict]:
  """Calls `train(run)` for every run without a `result.json` (`result_of`); reads the others
  back.

  After each newly finished run, process 0 writes its `result.json` (whole or not at all) and
  calls `write_tables(results so far)`; it calls it once more at the end, so a sweep with
  nothing left to train still rewrites its tables. Returns the results in `runs` order.
  """
  paths = [os.path.join(run.directory(workdir), RESULT_FILE) for run in runs]
  done = [result_of(run, path) for run, path in zip(runs, paths, strict=True)]
  if progress and jax.process_index() == 0:  # one line here, then one bar per run (the loop's)
    count = sum(result is not None for result in done)
    print(f"{desc}: {len(runs)} planned, {count} finished, {len(runs) - count} to train",
          flush=True)
  results = []
  for index, (run, path, result) in enumerate(zip(runs, paths, done, strict=True)):
    if result is not None:
      results.append(result)
      continue
    result = train(run)
    results.append(result)
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with files.atomic_open(path) as f:
        json.dump(result, f, indent=2)
      if write_tables is not None and index < len(runs) - 1:  # the last one is written below
        write_tables(results)
  if write_tables is not None and results and jax.process_index() == 0:
    write_tables(results)
  return results


@contextlib.contextmanager
def prepared(config, workdir: str, *, plan_fields: Sequence[str] = (),
             outputs: Sequence[str] = ()) -> Iterator[None]:
  """Within it, `workdir` is checked against `config` and holds its lock (`workdir.prepare`);
  the lock is released on the way out unless it was held before."""
  with workdirs.lock_scope(workdir):
    workdirs.prepare(workdir, config, plan_fields=plan_fields, outputs=outputs)
    yield


def sweep(config, workdir: str, *, runs: Sequence[plan.Run], train_run: Callable[[plan.Run], dict],
          write_tables: Callable[[list[dict]], None] | None = None,
          plan_fields: Sequence[str] = (), outputs: Sequence[str] = (),
          desc: str = "runs") -> list[dict]:
  """An experiment's whole sweep: `run_all` of `runs` (progress as `config.progress` says)
  within `prepared(config, workdir)`."""
  with prepared(config, workdir, plan_fields=plan_fields, outputs=outputs):
    return run_all(runs, train_run, workdir=workdir, write_tables=write_tables,
                   progress=plan.progress(config), desc=desc)


def study(train_and_evaluate: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
  """A study's `train_and_evaluate(config, workdir)` run within `prepared(config, workdir)`:
  one study at a time per workdir, and a workdir made with another config refused."""

  @functools.wraps(train_and_evaluate)
  def run(config, workdir: str):
    with prepared(config, workdir):
      return train_and_evaluate(config, workdir)

  return run
