"""GRACE glue (`experiments.grace`): the loss wiring, the jitted training, the results files."""

from __future__ import annotations

import csv
import itertools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import grace
from experiments.configs import grace_citeseer
from experiments.framework import held_out, plan, tables
from experiments.grace import probe
from experiments.grace import train as grace_train
from tfcl_jax import mappings, training
from tfcl_jax.augment import graph as graph_augment
from tfcl_jax.data import planetoid
from tfcl_jax.models import gcn
from tfcl_jax.objectives import grace as grace_objective


def _tiny_graph(n=40, f=20, classes=3, seed=0) -> planetoid.PlanetoidGraph:
  rng = np.random.default_rng(seed)
  labels = (np.arange(n) % classes).astype(np.int32)
  features = ((rng.random((n, f)) < 0.2) + np.eye(classes, f)[labels]).astype(np.float32)
  upper = np.triu(rng.random((n, n)) < 0.1, 1)
  source, target = np.nonzero(upper | upper.T)
  mask = np.zeros(n, bool)
  return planetoid.PlanetoidGraph("citeseer", planetoid.normalize_features(features), labels,
                                  np.stack([source, target]).astype(np.int32), mask, mask, mask)


def _batch(graph):
  return grace_objective.GraphBatch(gcn.sparse_features(graph.features),
                                    jnp.asarray(graph.edge_index))


def _pygcl_infonce(h1, h2, tau):
  """PyGCL DualBranchContrast(InfoNCE(tau), 'L2L', intraview_negs=True), written in NumPy."""

  def one_side(anchor, other):
    a = anchor / np.linalg.norm(anchor, axis=1, keepdims=True)
    o = other / np.linalg.norm(other, axis=1, keepdims=True)
    sample = np.concatenate([o, a])
    sim = a @ sample.T / tau
    n = len(a)
    pos = np.concatenate([np.eye(n), np.zeros((n, n))], axis=1)
    neg = np.concatenate([1 - np.eye(n), 1 - np.eye(n)], axis=1)
    log_prob = sim - np.log((np.exp(sim) * (pos + neg)).sum(axis=1, keepdims=True))
    return -((log_prob * pos).sum(axis=1) / pos.sum(axis=1)).mean()

  return 0.5 * (one_side(h1, h2) + one_side(h2, h1))


@pytest.mark.parametrize("block_size", [None, 16])  # automatic; tiles of 16 (80 = 5 x 16 rows)
def test_loss_is_pygcl_grace_loss_on_the_two_views(block_size):
  graph = _tiny_graph()
  batch = _batch(graph)
  model = gcn.GRACE(hidden_dims=(8, 8), projection_hidden_dim=8)
  full = gcn.gcn_normalize(batch.edge_index, num_nodes=40)
  params = {"model": model.init(jax.random.key(0), batch.features, full)["params"], "loss": {}}
  loss_fn = grace_objective.make_grace_loss(model, mappings.temperature(0.2), edge_rate=0.3,
                                            feature_rate=0.3, block_size=block_size)
  key = jax.random.key(7)
  loss, _ = jax.jit(loss_fn)(params, {}, batch, key, 0)

  @jax.jit
  def projection(view_key):
    view = graph_augment.grace_view(view_key, batch.features, batch.edge_index.shape[1])
    prop = gcn.gcn_normalize(batch.edge_index, num_nodes=40, edge_weight=view.edge_weight)
    return model.apply({"params": params["model"]}, view.features, prop)[1]

  projections = [np.asarray(projection(k), np.float64) for k in jax.random.split(key)]
  np.testing.assert_allclose(loss, _pygcl_infonce(*projections, tau=0.2), rtol=1e-5)


def test_library_training_of_grace_matches_stepwise(tmp_path):
  """GRACE through `tfcl_jax.training` (sparse graph batch, learnable t) = plain Adam steps."""
  graph = _tiny_graph(seed=1)
  batch = _batch(graph)
  model = gcn.GRACE(hidden_dims=(8, 8), projection_hidden_dim=8)
  mapping = mappings.from_spec("learnable=0.5")
  full = gcn.gcn_normalize(batch.edge_index, num_nodes=40)
  params = {"model": model.init(jax.random.key(0), batch.features, full)["params"],
            "loss": dict(mapping.params)}
  loss_fn = grace_objective.make_grace_loss(model, mapping, edge_rate=0.3, feature_rate=0.3)
  tx = optax.adam(0.01)
  key = jax.random.key(3)
  mesh = training.make_mesh(jax.devices()[:1])
  state = training.create_train_state(model_params=params["model"], tx=tx,
                                      loss_params=params["loss"])
  state = training.train(
      state, train_step=training.make_train_step(loss_fn, mesh=mesh, batch_sharded=False),
      batches=lambda start: itertools.repeat(batch, 2 - start), num_steps=2,
      workdir=str(tmp_path), key=key, mesh=mesh, batch_sharded=False, progress=False)
  # The same steps by hand: keys fold_in(key, step), one Adam over model and mapping params.
  manual, opt_state = params, tx.init(params)
  value_and_grad = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
  for step in range(2):
    (_, _), grads = value_and_grad(manual, {}, batch, jax.random.fold_in(key, step), step)
    updates, opt_state = tx.update(grads, opt_state, manual)
    manual = optax.apply_updates(manual, updates)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               jax.device_get(state.params), manual)
  assert float(state.params["loss"]["t"]) != float(params["loss"]["t"])


@pytest.fixture()
def tiny_config(monkeypatch):
  graph = _tiny_graph(seed=2)
  monkeypatch.setattr(grace_train, "load_graph", lambda config: (graph, _batch(graph)))
  config = grace_citeseer.get_config()
  config.update(dict(losses=" tau=0.5", seeds=1, epochs=2, probe_epochs=20, hidden_dim=8,
                     projection_hidden_dim=8, train_fraction=0.2, val_fraction=0.2,
                     progress=False))
  return config


def _run(config, workdir, **kwargs):
  """What `python -m experiments.grace` does: `check_config`, then `train_and_evaluate`."""
  grace.check_config(config)
  return grace.train_and_evaluate(config, workdir, **kwargs)


def test_run_writes_results_and_resumes(tiny_config, tmp_path, monkeypatch):
  _run(tiny_config, str(tmp_path), command="cmd")
  with open(tmp_path / "results.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert [(r["spec"], r["seed"]) for r in rows] == [("tau=0.5", "0")]
  assert all(0.0 <= float(r["f1_micro"]) <= 1.0 for r in rows)
  markdown = (tmp_path / "results.md").read_text()
  assert "| tau=0.5 | 1 |" in markdown and "67.33 (3.02)" in markdown  # the paper's column
  assert os.path.getsize(tmp_path / "f1_micro.png") > 0
  assert os.path.exists(tmp_path / "runs" / "tau_0.5" / "seed0" / "result.json")
  # The label-free scores at 10%, 25%, 50% (all step 1 of 2) and the end, LiDAR among them.
  with open(tmp_path / "runs" / "tau_0.5" / "seed0" / held_out.FILE, newline="") as f:
    scored = list(csv.DictReader(f))
  assert [r["step"] for r in scored] == ["1", "2"] and "lidar" in scored[0]
  for name in ("rankme", "lidar", "view_top1"):
    assert [rows[0][held_out.column(name, f)] for f in held_out.FRACTIONS] == [
        scored[0][name]] * 3 + [scored[1][name]]
  with monkeypatch.context() as patch:
    patch.setattr(grace_train, "train_run", lambda *a, **k: pytest.fail("retrained"))
    _run(tiny_config, str(tmp_path))  # nothing left to do
  with open(tmp_path / "results.csv", newline="") as f:
    assert len(list(csv.DictReader(f))) == 1
  # A second seed and a second loss join the same workdir; another epochs is refused, and so
  # is any rerun with resume=False.
  tiny_config.update(dict(seeds=2, losses="tau=0.5,free"))
  results = _run(tiny_config, str(tmp_path))
  assert [(r["spec"], r["seed"]) for r in results] == [
      ("tau=0.5", 0), ("free", 0), ("tau=0.5", 1), ("free", 1)]
  assert results[0]["f1_micro"] == float(rows[0]["f1_micro"])  # read back, not retrained
  assert "| free | 2 |" in (tmp_path / "results.md").read_text()
  refused = tiny_config.copy_and_resolve_references()
  refused.resume = False
  with pytest.raises(plan.ConfigError, match="already holds results"):
    _run(refused, str(tmp_path))
  tiny_config.epochs = 3
  with pytest.raises(plan.ConfigError, match="epochs: recorded 2, now 3"):
    _run(tiny_config, str(tmp_path))


def test_held_out_set_reads_the_encoder_on_the_graph_and_on_grace_views(tiny_config):
  graph = _tiny_graph(seed=2)
  batch = _batch(graph)
  loss = grace_train.parse_spec("tau=0.5", graph.num_nodes)
  model, state, full = grace_train.build(tiny_config, graph, batch, loss, jax.random.key(0))
  held = grace_train.held_out_set(tiny_config, model, batch, full)(state)
  clean = model.apply({"params": state.params["model"]}, batch.features, full,
                      method=gcn.GRACE.embed)
  np.testing.assert_allclose(held.embeddings, clean, rtol=1e-5)  # 40 nodes: every one
  assert held.views.shape == (40, held_out.LIDAR_VIEWS, 8)
  np.testing.assert_array_equal(held.first, held.views[:, 0])
  np.testing.assert_array_equal(held.second, held.views[:, 1])
  assert not np.allclose(held.first, clean) and not np.allclose(held.first, held.second)
  again = grace_train.held_out_set(tiny_config, model, batch, full)(state)
  np.testing.assert_array_equal(again.views, held.views)  # the same views for every run


def test_probe_restores_each_encoder_and_scores_other_splits(tiny_config, tmp_path):
  tiny_config.update(dict(seeds=2, losses="tau=0.5,free"))
  results = _run(tiny_config, str(tmp_path))
  rows = probe.evaluate(str(tmp_path), val_fractions=[0.2, 0.7], draws=2, command="cmd")
  assert len(rows) == 4 * 2 * 2
  # Draw 0 under the workdir's own split is the sweep's evaluation of the restored encoder.
  recorded = {(r["spec"], r["seed"]): r["f1_micro"] for r in results}
  for row in rows:
    if row["val_fraction"] == 0.2 and row["draw"] == 0:
      assert row["f1_micro"] == recorded[row["spec"], row["seed"]]
  # 40 nodes: 8 train, 28 validation, 4 test; F1-micro of 4 single-label nodes is k / 4.
  other = [r for r in rows if r["val_fraction"] == 0.7]
  assert {r["test_nodes"] for r in other} == {4}
  for row in other:
    assert 4 * row["f1_micro"] == pytest.approx(round(4 * row["f1_micro"]), abs=1e-6)
  markdown = (tmp_path / "probe_splits.md").read_text()
  assert "## Split 20 / 70 / 10 % (4 test nodes)" in markdown
  assert "largest |difference| 0 F1-micro" in markdown and "| tau=0.5 | 2 |" in markdown
  with open(tmp_path / "probe_splits.csv", newline="") as f:
    assert len(list(csv.DictReader(f))) == len(rows)
  with pytest.raises(ValueError, match="--draws"):
    probe.evaluate(str(tmp_path), val_fractions=[0.7], draws=0)
  with pytest.raises(ValueError, match="no results.csv"):
    probe.evaluate(str(tmp_path / "runs"), val_fractions=[0.7], draws=1)
  # A workdir whose config.json names a field otherwise is refused, by the probe and the sweep.
  recorded_config = json.loads((tmp_path / "config.json").read_text())
  recorded_config["train_ratio"] = recorded_config.pop("train_fraction")
  (tmp_path / "config.json").write_text(json.dumps(recorded_config))
  with pytest.raises(ValueError, match="records no train_fraction"):
    probe.evaluate(str(tmp_path), val_fractions=[0.7], draws=1)
  with pytest.raises(plan.ConfigError, match="train_fraction: recorded None, now 0.2"):
    _run(tiny_config, str(tmp_path))


def test_probe_refuses_a_results_csv_without_the_spec_column(tmp_path):
  (tmp_path / "results.csv").write_text("dataset,loss,seed,f1_micro\ncora,free,0,0.8\n")
  with pytest.raises(plan.ConfigError, match="results.csv lacks the columns spec"):
    probe.finished_runs(str(tmp_path))


def test_bad_spec_fails_before_training(tiny_config, tmp_path):
  tiny_config.losses = "free,tau=-1"
  with pytest.raises(plan.ConfigError, match="tau"):
    _run(tiny_config, str(tmp_path))
  assert not (tmp_path / "results.csv").exists()


def test_paired_differences_match_a_hand_computation():
  scores = {"free": [0.70, 0.68, 0.66], "tau=0.1": [0.60, 0.61, 0.55], "tau=1": [0.69]}
  rows = [{"spec": m, "seed": str(seed), "f1_micro": str(v)}
          for m, values in scores.items() for seed, v in enumerate(values)]
  table = tables.paired_differences(rows, ["tau=0.1", "free", "tau=1"], metric="f1_micro")
  assert [row["spec"] for row in table] == ["tau=0.1", "tau=1"]
  first = table[0]
  diffs = 100 * (np.array(scores["free"]) - np.array(scores["tau=0.1"]))  # 10, 7, 11 points
  assert first["seeds"] == 3 and first["wins"] == 3
  np.testing.assert_allclose(first["mean"], diffs.mean())
  np.testing.assert_allclose(first["sem"], diffs.std(ddof=1) / np.sqrt(3))
  # Paired t = mean / sem with 2 degrees of freedom: two-sided p = 1 - t / sqrt(t^2 + 2).
  t = diffs.mean() / (diffs.std(ddof=1) / np.sqrt(3))
  np.testing.assert_allclose(first["p_value"], 1 - t / np.sqrt(t * t + 2), rtol=1e-6)
  assert table[1]["seeds"] == 1 and np.isnan(table[1]["p_value"])  # one shared seed: no test


def _siglip_all(h1, h2, t, b):
  """Sigmoid loss with negatives 'all' in NumPy: each of 2N rows against the other 2N - 1."""
  u = np.concatenate([h1, h2])
  u = u / np.linalg.norm(u, axis=1, keepdims=True)
  n = len(h1)
  logits = np.exp(t) * (u @ u.T) + b
  labels = -np.ones_like(logits)
  labels[np.arange(2 * n), (np.arange(2 * n) + n) % (2 * n)] = 1.0
  terms = np.logaddexp(0.0, -labels * logits)  # -log sigmoid(l z)
  np.fill_diagonal(terms, 0.0)
  return terms.sum(axis=1).mean()


def test_sigmoid_spec_trains_bias_and_t_and_equals_numpy():
  """`sigmoid/learnable=0.1/learn_b=siglip` on GRACE's views = SigLIP's formula in NumPy; the
  train state carries t and b and both get gradients."""
  graph = _tiny_graph(seed=4)
  batch = _batch(graph)
  model = gcn.GRACE(hidden_dims=(8, 8), projection_hidden_dim=8)
  objective = grace_train.parse_spec("sigmoid/learnable=0.1/learn_b=siglip", graph.num_nodes)
  assert sorted(objective.params) == ["bias", "t"]
  full = gcn.gcn_normalize(batch.edge_index, num_nodes=40)
  params = {"model": model.init(jax.random.key(0), batch.features, full)["params"],
            "loss": {"t": jnp.float32(1.5), "bias": jnp.float32(-3.0)}}
  loss_fn = grace_objective.make_grace_loss(model, objective, edge_rate=0.3, feature_rate=0.3,
                                            block_size=16)
  key = jax.random.key(5)
  (loss, _), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, {}, batch, key, 0)

  @jax.jit
  def projection(view_key):
    view = graph_augment.grace_view(view_key, batch.features, batch.edge_index.shape[1])
    prop = gcn.gcn_normalize(batch.edge_index, num_nodes=40, edge_weight=view.edge_weight)
    return model.apply({"params": params["model"]}, view.features, prop)[1]

  h1, h2 = (np.asarray(projection(k), np.float64) for k in jax.random.split(key))
  np.testing.assert_allclose(loss, _siglip_all(h1, h2, 1.5, -3.0), rtol=1e-5)
  # dL/db by central differences of the NumPy loss.
  eps = 1e-4
  fd = (_siglip_all(h1, h2, 1.5, -3.0 + eps) - _siglip_all(h1, h2, 1.5, -3.0 - eps)) / (2 * eps)
  np.testing.assert_allclose(grads["loss"]["bias"], fd, rtol=1e-4)
  assert float(grads["loss"]["t"]) != 0.0


@pytest.mark.parametrize("field, value, message", [
    ("losses", "", "config.losses must list at least one item"),
    ("losses", "free,tua=0.1", "config.losses: Invalid loss spec 'tua=0.1'"),
    ("seeds", 0, "config.seeds"),
    ("data_dir", "/nonexistent/planetoid", "config.data_dir: .*kimiyoung/planetoid"),
])
def test_config_errors_name_the_field_before_training(tmp_path, field, value, message):
  config = grace_citeseer.get_config()
  if field != "data_dir":  # named whether the data is there or not
    config.data_dir = str(tmp_path / "absent")
  config[field] = value
  with pytest.raises(plan.ConfigError, match=message):
    _run(config, str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()


def test_command_line_error_is_one_line_and_exit_2(tmp_path):
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  result = subprocess.run(
      [sys.executable, "-m", "experiments.grace", "--config=experiments/configs/grace_citeseer.py",
       f"--workdir={tmp_path}", "--config.losses=tua=0.1"], cwd=root, capture_output=True,
      text=True, timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.startswith("error: config.losses: Invalid loss spec 'tua=0.1'")
  assert "Traceback" not in result.stderr
