"""`experiments.simclr`: checks before training, an end-to-end run, resuming, growing a sweep."""

from __future__ import annotations

import csv
import os

import jax
import numpy as np
import pytest

from experiments import simclr as experiment
from experiments.configs import simclr_digits
from experiments.framework import held_out, plan, pretraining
from experiments.simclr import report
from tfcl_jax.training import sharding


def tiny_config(**overrides):
  config = simclr_digits.get_config()
  config.update(dict(losses="learnable=0.2", seeds=2, epochs=1, batch_size=128, width=4,
                     projection_hidden_dim=8, projection_dim=8, probe_epochs=20,
                     eval_every_epochs=0, knn_k=20, num_devices=2, progress=False))
  config.update(overrides)
  return config


def run(config, workdir, **kwargs):
  """What `python -m experiments.simclr` does: `check_config`, then `train_and_evaluate`."""
  experiment.check_config(config)
  return experiment.train_and_evaluate(config, workdir, **kwargs)


@pytest.fixture(scope="module")
def mesh8():
  return sharding.make_mesh(jax.devices()[:8])


@pytest.mark.parametrize("overrides,message", [
    ({"losses": "tau=0.1,warm"}, "'warm' is not a mapping spec"),
    ({"losses": "tau=-1"}, "tau must be a finite number > 0"),
    ({"dataset": "mnist"}, "Unknown dataset 'mnist'"),
    ({"mode": "grid"}, "config.mode must be one of"),
    ({"backbone": "vgg"}, "backbone must be one of"),
    ({"lr_scaling": "sqrt"}, "config.lr_scaling must be one of"),
    ({"n_batch_sizes": "64,x", "mode": "n_sensitivity"}, "config.n_batch_sizes must list ints"),
])
def test_bad_config_raises_before_anything_is_written(tmp_path, overrides, message):
  with pytest.raises(plan.ConfigError, match=message):
    experiment.check_config(tiny_config(**overrides))
  workdir = tmp_path / "run"
  with pytest.raises(plan.ConfigError, match=message):
    run(tiny_config(num_devices=8, **overrides), str(workdir))
  assert not workdir.exists()


@pytest.mark.parametrize("overrides,message", [
    ({"batch_size": 100}, "config.batch_size = 100 must be a positive multiple.*8"),
    ({"mode": "n_sensitivity", "n_batch_sizes": "64,100"}, "= 100 must be a positive multiple"),
])
def test_what_the_devices_decide_is_checked_before_anything_is_written(tmp_path, mesh8,
                                                                       overrides, message):
  config = tiny_config(num_devices=8, **overrides)
  experiment.check_config(config)  # no data, no devices: nothing to refuse
  with pytest.raises(plan.ConfigError, match=message):
    pretraining.check_data(config, pretraining.plan_runs(config), mesh8)
  workdir = tmp_path / "run"
  with pytest.raises(plan.ConfigError, match=message):
    experiment.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


def test_unwritable_workdir_raises(tmp_path):
  (tmp_path / "file").write_text("x")
  with pytest.raises(plan.ConfigError, match="cannot be written"):
    run(tiny_config(), str(tmp_path / "file" / "run"))


def test_run_writes_results_and_resume_is_checked(tmp_path):
  workdir = str(tmp_path)
  results = run(tiny_config(), workdir)
  assert [r["seed"] for r in results] == [0, 1]
  with open(os.path.join(workdir, "results.csv")) as f:
    rows = list(csv.DictReader(f))
  assert {"spec", "seed", "knn_top1", "linear_top1", "final_t"} <= set(rows[0])
  assert all(0.0 <= float(row["knn_top1"]) <= 1.0 for row in rows)
  assert rows[0]["spec"] == "learnable=0.2"
  table = open(os.path.join(workdir, "results.md")).read()
  assert "| learnable=0.2 |" in table and "± " in table
  # The label-free scores of the test split at 10%, 25%, 50% and the end of training.
  steps = held_out.steps(results[0]["steps"])
  scores = ("alignment", "alpha_req", "lidar", "rankme", "uniformity", "view_top1")
  for seed, row in enumerate(rows):
    run_dir = os.path.join(workdir, "runs", "learnable_0.2", "batch_size_128", f"seed{seed}")
    with open(os.path.join(run_dir, held_out.FILE)) as f:
      scored = list(csv.DictReader(f))
    assert [int(r["step"]) for r in scored] == sorted(set(steps.values()))
    assert sorted(scored[0]) == sorted(["step", *scores])
    by_step = {int(r["step"]): r for r in scored}
    for fraction, step in steps.items():
      for name in scores:
        assert row[held_out.column(name, fraction)] == by_step[step][name]
    assert 1.0 <= float(row["label_free/rankme"]) <= 16.0  # width 4: 16 backbone features
  for name in ("accuracy.png", "curves.png", "geometry.png"):
    assert os.path.getsize(os.path.join(workdir, name)) > 0
  before = open(os.path.join(workdir, "results.csv")).read()
  with pytest.raises(plan.ConfigError, match="already holds"):
    run(tiny_config(resume=False), workdir)
  with pytest.raises(plan.ConfigError, match="config differs.*epochs: recorded 1, now 2"):
    run(tiny_config(epochs=2, resume=True), workdir)
  assert open(os.path.join(workdir, "results.csv")).read() == before
  # Resuming a finished sweep trains nothing and reproduces the results.
  resumed = run(tiny_config(resume=True), workdir)
  assert resumed == results
  # More seeds: the finished runs are read back, only the new seed trains.
  grown = run(tiny_config(seeds=3), workdir)
  assert grown[:2] == results and grown[2]["seed"] == 2
  assert len(open(os.path.join(workdir, "results.csv")).read().splitlines()) == 4


@pytest.mark.heavy  # a second whole run of the experiment, on other data: CI's heavy step
def test_mnist1d_signals_run_through_the_same_experiment(tmp_path):
  from experiments.configs import simclr_mnist1d  # noqa: PLC0415

  config = simclr_mnist1d.get_config()
  config.update(dict(losses="free", seeds=1, epochs=1, width=4, projection_hidden_dim=8,
                     projection_dim=8, probe_epochs=20, eval_every_epochs=0, num_devices=2,
                     progress=False, data_dir=str(tmp_path / "data")))
  (result,) = run(config, str(tmp_path / "run"))
  assert result["steps"] == 15  # 4000 signals, batch 256
  assert 0.1 < result["knn_top1"] <= 1.0  # above chance after one epoch
  assert "kNN: k = 50" in (tmp_path / "run" / "results.md").read_text()


def test_table2_pairs_free_against_each_loss_by_seed():
  from scipy import stats  # noqa: PLC0415

  free = [0.80, 0.75, 0.90, 0.70]
  tau = [0.78, 0.72, 0.87, 0.67]  # a seed effect much larger than the loss effect
  results = ([{"spec": "tau=0.1", "seed": s, "knn_top1": v, "linear_top1": 0.9}
              for s, v in enumerate(tau)]
             + [{"spec": "free", "seed": s, "knn_top1": v, "linear_top1": 0.9}
                for s, v in enumerate(free)])
  table = report.table2(results, knn_k=7)
  differences = 100 * (np.array(free) - np.array(tau))
  p_value = stats.ttest_rel(free, tau).pvalue
  sem = differences.std(ddof=1) / np.sqrt(4)
  row = next(line for line in table.splitlines() if line.startswith("| tau=0.1 |"))
  assert (f"| {differences.mean():+.2f} ({sem:.2f}), p = {p_value:.2g}, 4/4 | 4 |"
          in row), row
  # Welch's unpaired test would call this noise; the paired one does not.
  assert stats.ttest_ind(free, tau, equal_var=False).pvalue > 0.5 > 0.05 > p_value
  assert "kNN: k = 7" in table
  assert f"paired by seed, t-test p = {p_value:.3g} (beyond seed noise at 5%)" in table


def test_training_table_reads_each_runs_curve(tmp_path):
  """Means over seeds at evenly spread evaluation steps, and free − loss paired by seed at
  the first and the last, recomputed here with NumPy and SciPy from the same curves (the
  `knn_top1@<step>` columns of the results)."""
  from scipy import stats  # noqa: PLC0415

  rng = np.random.default_rng(0)
  steps = np.arange(25, 25 * 11, 25)  # ten evaluations
  curves = {(spec, seed): rng.uniform(0.5, 0.9, len(steps))
            for spec in ("tau=0.1", "free") for seed in range(3)}
  results = [{"spec": spec, "seed": seed, "knn_top1": float(curve[-1]),
              **{f"knn_top1@{s}": float(v) for s, v in zip(steps, curve, strict=True)}}
             for (spec, seed), curve in curves.items()]
  table = report.training_table(results, columns=4)
  header = next(line for line in table.splitlines() if line.startswith("| loss |"))
  assert "| step 25 | step 100 | step 175 | step 250 |" in header  # indices 0, 3, 6, 9
  row = next(line for line in table.splitlines() if line.startswith("| tau=0.1 |"))
  cells = [cell.strip() for cell in row.strip("|").split("|")]
  for cell, index in zip(cells[1:5], (0, 3, 6, 9), strict=True):
    expected = 100 * np.mean([curves[("tau=0.1", seed)][index] for seed in range(3)])
    assert cell == f"{expected:.2f}"
  for cell, index in zip(cells[5:], (0, 9), strict=True):
    free = [curves[("free", seed)][index] for seed in range(3)]
    tau = [curves[("tau=0.1", seed)][index] for seed in range(3)]
    difference = 100 * (np.array(free) - np.array(tau))
    assert cell.startswith(f"{difference.mean():+.2f} (")
    assert f"p = {stats.ttest_rel(free, tau).pvalue:.2g}, {np.sum(difference > 0)}/3" in cell
  # Fewer than two shared evaluations (or none logged): no table.
  assert report.training_table(results[:1], columns=4) != ""
  short = [{k: v for k, v in row.items() if not k.startswith("knn_top1@") or k == "knn_top1@25"}
           for row in results]
  assert report.training_table(short) == ""
  assert report.training_table([{"spec": "free", "knn_top1": 0.5}]) == ""
  # The curves travel in results.csv: the table is rebuilt from it.
  from experiments.framework import tables  # noqa: PLC0415

  tables.write_results(str(tmp_path), results, markdown="")
  assert report.training_table(
      tables.typed(tables.read_csv(str(tmp_path / "results.csv"))), columns=4) == table
