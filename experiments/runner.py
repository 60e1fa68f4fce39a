"""The one runner of every experiment: plan the runs of a sweep, resume them, write the tables.

An experiment is a config, a list of runs (frozen dataclasses with a `directory(workdir)`), a
`train(run) -> dict` and a table. The rules are the same for all of them:

- a finished run leaves `result.json` in its directory and is never recomputed;
- an interrupted run continues from its last step checkpoint (`tfcl_jax.training.train`);
- a workdir made with another config is refused before anything runs (`prepare`), naming the
  differing fields; the fields that only choose which runs exist (mappings, seeds, ...) may
  change, so a sweep grows by rerunning it with more seeds;
- the tables are rewritten after every finished run, so an interrupted sweep leaves the
  finished part of its table on disk.
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Callable, Sequence

import jax

from tfcl_jax.training import loop

RESULT_FILE = "result.json"


def split_list(text, *, name: str) -> list[str]:
  """The items of a comma list config field (`"tau=0.1, free"`), at least one.

  Raises:
    ValueError: the list is empty; names `config.<name>`.
  """
  items = [item.strip() for item in str(text).split(",") if item.strip()]
  if not items:
    raise ValueError(f"config.{name} must list at least one item, got {text!r}.")
  return items


def loss_specs(config, *, example: str) -> list[str]:
  """The canonical loss specs (`tfcl_jax.losses.from_spec`) of `config.mappings`, each once,
  in order.

  Raises:
    ValueError: an empty list or a malformed spec; the message names `config.mappings` and
      shows `example` (e.g. `"free,tau=0.5"`).
  """
  from tfcl_jax import losses  # noqa: PLC0415

  try:
    return list(dict.fromkeys(losses.from_spec(spec, num_candidates=2).spec
                              for spec in split_list(config.mappings, name="mappings")))
  except ValueError as error:
    message = str(error)
    if message.startswith("config."):
      raise
    raise ValueError(f"config.mappings: {message} (e.g. --config.mappings={example})"
                     ) from error


def check_positive_ints(config, *fields: str) -> None:
  """Each `config.<field>` is an int >= 1.

  Raises:
    ValueError, TypeError: naming the first field that is not.
  """
  for field in fields:
    value = config[field]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      raise TypeError(f"config.{field} must be an int >= 1, got {value!r}.")
    if value < 1:
      raise ValueError(f"config.{field} must be an int >= 1, got {value!r}.")


def prepare(workdir: str, config, *, plan_fields: Sequence[str] = (),
            ignored: Sequence[str] = ("resume", "progress"), outputs: Sequence[str] = ()) -> None:
  """Checks `workdir` against `config` before anything runs, and records `config` there.

  `plan_fields` choose which runs exist and `ignored` change nothing in a run; neither is
  compared. With `config.resume = False` (where the config has that field), a workdir that
  already holds any of `outputs`, `results.csv` or `runs` is refused.

  Raises:
    ValueError: the workdir cannot be written, was made with another config, or holds results
      and `config.resume` is False.
  """
  record = {k: v for k, v in config.to_dict().items()
            if k not in set(plan_fields) | set(ignored)}
  resume = bool(config.get("resume", True))
  if not resume:
    existing = [name for name in ("results.csv", "runs", *outputs)
                if os.path.exists(os.path.join(workdir, name))]
    if existing:
      raise ValueError(f"workdir {workdir!r} already holds results ({', '.join(existing)}); pass "
                       "--config.resume=True (the default) or choose a new workdir. Nothing was "
                       "overwritten.")
  loop.prepare_workdir(workdir, record, resume=resume)


def finished(run, workdir: str) -> bool:
  """Whether `run` left its `result.json` in `workdir`."""
  return os.path.exists(os.path.join(run.directory(workdir), RESULT_FILE))


def run_all(runs: Sequence, train: Callable[[object], dict], *, workdir: str,
            write_tables: Callable[[list[dict]], None] | None = None, progress: bool = True,
            desc: str = "runs") -> list[dict]:
  """Calls `train(run)` for every run without a `result.json`; reads the others back.

  After each newly finished run, process 0 writes its `result.json` and calls
  `write_tables(results so far)`; it calls it once more at the end, so a sweep with nothing
  left to train still rewrites its tables. Returns the results in `runs` order.
  """
  if progress:
    import tqdm.auto as tqdm  # noqa: PLC0415  (lazy: tqdm is an optional dependency)

    iterator = tqdm.tqdm(runs, desc=desc)
  else:
    iterator = runs
  results = []
  for index, run in enumerate(iterator):
    path = os.path.join(run.directory(workdir), RESULT_FILE)
    if os.path.exists(path):
      with open(path) as f:
        results.append(json.load(f))
      continue
    result = train(run)
    results.append(result)
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w") as f:
        json.dump(result, f, indent=2)
      if write_tables is not None and index < len(runs) - 1:  # the last one is written below
        write_tables(results)
  if write_tables is not None and results and jax.process_index() == 0:
    write_tables(results)
  return results
