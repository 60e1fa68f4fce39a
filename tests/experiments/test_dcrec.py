"""`experiments.dcrec`: a small MovieLens-format file through the framework, and its errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

from experiments import dcrec as dcrec_experiment
from experiments.configs import dcrec_ml100k
from experiments.framework import plan
from tests.helpers.movielens_files import write_u_data as _write_u_data
from tfcl_jax.data import sequences


@pytest.fixture
def tiny_config(tmp_path):
  config = dcrec_ml100k.get_config(data_dir=_write_u_data(tmp_path / "data"))
  config.losses = "free"
  config.seeds = 1
  config.epochs = 2
  config.batch_size = 64
  config.max_length = 6
  config.hidden_dim = 8
  config.inner_size = 16
  config.num_layers = 1
  config.num_negatives = 10
  config.log_every = 1
  config.progress = False
  return config


def _run(config, workdir, **kwargs):
  """What `python -m experiments.dcrec` does: `check_config`, then `train_and_evaluate`."""
  dcrec_experiment.check_config(config)
  return dcrec_experiment.train_and_evaluate(config, workdir, **kwargs)


def test_run_writes_table6_and_a_rerun_trains_nothing(tiny_config, tmp_path, monkeypatch):
  workdir = str(tmp_path / "work")
  rows = _run(tiny_config, workdir, command="cmd")
  assert [row["spec"] for row in rows] == ["free"]
  for row in rows:
    hr = [row[f"hr@{k}"] for k in (1, 5, 10)]
    ndcg = [row[f"ndcg@{k}"] for k in (1, 5, 10)]
    assert 0.0 <= hr[0] <= hr[1] <= hr[2] <= 1.0
    assert row["ndcg@1"] == pytest.approx(row["hr@1"])  # one relevant item: the same at k = 1
    assert all(n <= h + 1e-9 for n, h in zip(ndcg, hr, strict=True))
    assert row["best_epoch"] in (1, 2) and row["steps"] == 2 * (24 * 9 // 64)
  with open(os.path.join(workdir, "results.md")) as f:
    markdown = f.read()
  assert "| HR@10 |" in markdown and "0.5191 (0.0008)" in markdown  # beside the paper's column
  # A finished sweep is read back, not retrained.
  monkeypatch.setattr(dcrec_experiment, "train_run", lambda *a, **k: pytest.fail("retrained"))
  again = _run(tiny_config, workdir, command="cmd")
  assert again == rows


def test_table6_pairs_free_against_each_loss_by_seed():
  rows = [{"spec": m, "seed": s, **{f"{n}@{k}": v + 0.01 * k for n in ("hr", "ndcg")
                                       for k in (1, 5, 10)}}
          for m, s, v in [("tau=0.8", 0, 0.10), ("free", 0, 0.13), ("tau=0.8", 1, 0.20),
                          ("free", 1, 0.21), ("tau=0.8", 2, 0.30)]]
  markdown = dcrec_experiment.table6(rows, ["tau=0.8", "free"], dataset="ml-100k",
                                     command="cmd", epochs=3)
  # HR@1 of τ = 0.8 over 3 seeds: mean 0.21, std 0.1; free minus τ = 0.8 on seeds 0 and 1 only.
  assert "| HR@1 | 0.2100 (0.1000) | 0.1800 (0.0566) | 0.1336 (0.0012) |" in markdown
  assert "| tau=0.8 | 2 | +0.0200 (0.0100) |" in markdown
  assert "2/2 |" in markdown


def test_test_metrics_come_from_the_best_validation_epoch():
  columns = {"step": np.array([10.0, 20.0, 30.0]), "valid_ndcg@10": np.array([0.3, 0.4, 0.4]),
             "test_ndcg@10": np.array([0.5, 0.2, 0.9])}
  best = dcrec_experiment.best_epoch(columns, steps_per_epoch=10)
  assert best["epoch"] == 2 and best["test_ndcg@10"] == 0.2  # earliest of the tied best


def test_epoch_batches_visit_each_example_once_per_epoch_and_resume_in_place(tmp_path):
  from tfcl_jax.data import movielens  # noqa: PLC0415

  split = sequences.build_sequences(movielens.read_ratings(_write_u_data(tmp_path))).train
  size = 32
  per_epoch = len(split) // size  # 216 examples (24 users x 9 prefixes): 6 full batches
  stream = list(dcrec_experiment.epoch_batches(split, batch_size=size, seed=3, start=0,
                                               num_steps=2 * per_epoch))
  # An example is (user, input length): distinct within an epoch.
  seen = {(int(u), int(n)) for b in stream[:per_epoch]
          for u, n in zip(b["users"], b["lengths"], strict=True)}
  assert per_epoch == 6 and len(seen) == per_epoch * size
  resumed = list(dcrec_experiment.epoch_batches(split, batch_size=size, seed=3,
                                                start=per_epoch + 1, num_steps=2 * per_epoch))
  for a, b in zip(stream[per_epoch + 1:], resumed, strict=True):
    for name in ("users", "inputs", "lengths", "targets"):
      np.testing.assert_array_equal(a[name], b[name])
  assert not np.array_equal(stream[0]["users"], stream[per_epoch]["users"])  # reshuffled


@pytest.mark.parametrize("field, value, message", [
    ("data_dir", "/nonexistent/movielens", "--fetch DIR"),
    ("num_negatives", 35, "config.num_negatives=35"),
    ("losses", "tua=0.8", "config.losses"),
    ("batch_size", 10_000, "config.batch_size=10000"),
    ("max_length", 0, "config.max_length"),
    ("top_k", 100, "config.top_k=100"),
])
def test_config_errors_name_the_field_before_training(tiny_config, tmp_path, field, value,
                                                      message):
  tiny_config[field] = value
  with pytest.raises(plan.ConfigError, match=message.replace(".", r"\.")):
    _run(tiny_config, str(tmp_path / "work"))
  assert not os.path.exists(tmp_path / "work" / "runs")
