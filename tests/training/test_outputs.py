"""`training.outputs`: TensorBoard gets each row's finite values, the CSV every value."""

from __future__ import annotations

import glob
import json
import logging
import math
import os

import pytest

from tfcl_jax.training import outputs


def _stand_in_events(**fields) -> bytes:
  """An event as one JSON line, readable without tensorboardX."""
  return (json.dumps(fields, sort_keys=True) + "\n").encode()


def test_a_nan_column_stays_in_the_csv_and_out_of_tensorboard(tmp_path, monkeypatch, caplog):
  monkeypatch.setattr(outputs, "_event_encoder", lambda: _stand_in_events)
  rows = [{"step": 10, "top@100": 0.25, "scale": math.nan},
          {"step": 20, "top@100": 0.5, "scale": math.inf}]
  with caplog.at_level(logging.WARNING), outputs.Outputs(
      str(tmp_path), start=0, num_steps=20, desc="run", progress=False) as out:
    out.evals.write(rows)
    out.scalars("eval", rows)
  [path] = glob.glob(os.path.join(tmp_path, outputs.TENSORBOARD_DIR, "events.out.tfevents.*"))
  with open(path, "rb") as f:
    events = [json.loads(line) for line in f][1:]
  assert sorted((e["tag"], e["step"], e["value"]) for e in events) == [
      ("eval/step", 10, 10), ("eval/step", 20, 20), ("eval/top@100", 10, 0.25),
      ("eval/top@100", 20, 0.5)]
  evals = outputs.read_csv(str(tmp_path / outputs.EVAL_FILE))
  assert math.isnan(evals["scale"][0]) and math.isinf(evals["scale"][1])
  assert not caplog.records


def test_tensorboardx_sees_no_nan(tmp_path, caplog):
  """With tensorboardX's own encoder (which warns at every NaN it is given), a NaN column gives no
  warning."""
  pytest.importorskip("tensorboardX")
  with caplog.at_level(logging.WARNING), outputs.Outputs(
      str(tmp_path), start=0, num_steps=1, desc="run", progress=False) as out:
    out.scalars("eval", [{"step": 1, "loss": 0.5, "scale": math.nan}])
  assert not [r for r in caplog.records if "NaN" in r.getMessage()]
