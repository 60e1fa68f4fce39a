"""A resumable sweep of runs: each finished run leaves `result.json` in its directory."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence

import jax
import tqdm.auto as tqdm

RESULT_FILE = "result.json"


def run_all(runs: Sequence, train: Callable[[object], dict], *, workdir: str, resume: bool,
            progress: bool, desc: str,
            on_result: Callable[[list[dict]], None] | None = None) -> list[dict]:
  """Calls `train(run)` for every run; with `resume`, reads back runs that already finished.

  Only process 0 writes; `on_result(results)` is called there after each newly trained run.
  """
  results = []
  for run in tqdm.tqdm(runs, desc=desc, disable=not progress):
    result_path = os.path.join(run.directory(workdir), RESULT_FILE)
    if resume and os.path.exists(result_path):
      with open(result_path) as f:
        results.append(json.load(f))
      continue
    result = train(run)
    results.append(result)
    if jax.process_index() == 0:
      with open(result_path, "w") as f:
        json.dump(result, f, indent=2)
      if on_result is not None:
        on_result(results)
  return results
