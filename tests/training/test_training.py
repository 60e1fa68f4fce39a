"""Tests of the training stack: sharded step, resume, learnable temperature, bad input."""

from __future__ import annotations

import csv
import functools
import json
import os

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfcl_jax import mappings, models
from tfcl_jax.objectives import simclr
from tfcl_jax.training import loop, optim, outputs, sharding, state, step

BATCH = 16


def _noise_views(key, images):
  """A stand-in augmentation: two noisy copies (the test must not depend on tfcl_jax.augment)."""
  images = images.astype(jnp.float32) / 255.0
  key1, key2 = jax.random.split(key)
  return (images + 0.1 * jax.random.normal(key1, images.shape),
          images + 0.1 * jax.random.normal(key2, images.shape))


def _images(n=BATCH, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (n, 8, 8, 1), dtype=np.uint8)


class _Flat(nn.Module):
  @nn.compact
  def __call__(self, x, *, train: bool):
    del train
    return nn.relu(nn.Dense(16)(x.reshape(x.shape[0], -1)))


@functools.cache
def _setup(mapping_spec="learnable=0.2", total_steps=8):
  """Model, state factory, loss and per-mesh-size compiled steps, built once per test session."""
  # A one-layer backbone with BatchNorm in the head: the stack is what is under test, and a
  # conv backbone would spend most of the test compiling for the 8-device mesh.
  model = models.ContrastiveModel(_Flat(), models.ProjectionHead(hidden_dim=8, out_dim=8))
  mapping = mappings.from_spec(mapping_spec)
  variables = jax.jit(lambda: model.init(jax.random.key(0), jnp.zeros((2, 8, 8, 1)),
                                         train=False))()
  tx = optim.make_optimizer(name="sgd", learning_rate=0.1, total_steps=total_steps,
                            weight_decay=5e-4)

  def fresh_state():
    return state.create_train_state(
        model_params=variables["params"], model_state={"batch_stats": variables["batch_stats"]},
        loss_params=mapping.params, tx=tx)

  loss_fn = simclr.make_simclr_loss(model, loss=mapping, augment=_noise_views)
  return fresh_state, loss_fn


@functools.cache
def _train_step(num_devices, total_steps=8):
  """One compiled step per mesh size, shared by the tests (compiling dominates their time)."""
  mesh = sharding.make_mesh(jax.devices()[:num_devices])
  return mesh, step.make_train_step(_setup(total_steps=total_steps)[1], mesh=mesh)


def test_sharded_step_equals_single_device_step():
  assert jax.device_count() >= 8, "conftest.py sets 8 host devices"
  fresh_state, _ = _setup()
  results = []
  for num_devices in (8, 1):
    mesh, train_step = _train_step(num_devices)
    s = jax.device_put(fresh_state(), sharding.replicated(mesh))
    for index in range(2):
      batch = sharding.shard_batch({"image": _images(seed=index)}, mesh)
      s, metrics = train_step(s, batch, jax.random.key(3))
    results.append((jax.device_get(s.params), jax.device_get(s.model_state), metrics))
  (params8, stats8, metrics8), (params1, stats1, metrics1) = results
  chex.assert_trees_all_close(params8, params1, atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_close(stats8, stats1, atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_close(metrics8, metrics1, atol=1e-5, rtol=1e-5)
  # The 8-device run really was sharded: the batch lives on 8 devices.
  mesh8 = sharding.make_mesh(jax.devices()[:8])
  placed = sharding.shard_batch({"image": _images()}, mesh8)["image"]
  assert len(placed.sharding.device_set) == 8


def test_replicated_batch_step_matches_plain_optax():
  """Full-batch mode (a whole graph): the step equals a hand-written optax update."""
  mesh = sharding.make_mesh(jax.devices()[:8])
  x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)  # 5 rows: not divisible
  y = np.arange(5, dtype=np.float32)

  def loss_fn(params, model_state, batch, key, step_index):
    return jnp.mean((batch["x"] @ params["model"]["w"] - batch["y"]) ** 2), (model_state, {})

  tx = optax.adam(0.01)
  s = state.create_train_state(model_params={"w": jnp.zeros(3)}, tx=tx)
  train_step = step.make_train_step(loss_fn, mesh=mesh, batch_sharded=False)
  w, opt_state = np.zeros(3, np.float32), tx.init({"model": {"w": jnp.zeros(3)}, "loss": {}})
  for _ in range(3):
    s, metrics = train_step(s, sharding.shard_batch({"x": x, "y": y}, mesh, sharded=False),
                            jax.random.key(0))
    grad = 2 * x.T @ (x @ w - y) / len(y)  # NumPy gradient of the mean squared error
    updates, opt_state = tx.update({"model": {"w": grad}, "loss": {}}, opt_state)
    w = w + np.asarray(updates["model"]["w"])
  np.testing.assert_allclose(s.params["model"]["w"], w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["grad_norm"], np.linalg.norm(grad), rtol=1e-5)


def test_learnable_temperature_receives_gradient_and_changes():
  fresh_state, _ = _setup()
  s = fresh_state()
  mesh, train_step = _train_step(1)
  t_before = float(s.params["loss"]["t"])
  batch = sharding.shard_batch({"image": _images()}, mesh)  # placed as in the sharded test
  s, metrics = train_step(s, batch, jax.random.key(0))
  # First SGD step, no weight decay on t: t moves by -lr * dL/dt (lr = 0.1 at step 0).
  assert abs(float(s.params["loss"]["t"]) - t_before) > 1e-6
  assert float(metrics["loss/t"]) == pytest.approx(t_before)
  # The fresh (unplaced) state above and the step's own output share one compiled program.
  compiled = train_step.jitted._cache_size()
  train_step(s, batch, jax.random.key(0))
  assert train_step.jitted._cache_size() == compiled


@pytest.mark.parametrize("name,expected_w_update", [("sgd", -0.5), ("adam", -1.0)])
def test_weight_decay_spares_the_loss_parameters(name, expected_w_update):
  """L2 decay 0.5 * w with zero loss gradient: SGD moves w by -lr * 0.5, Adam's first step by
  -lr (its normalised step); a learnable temperature `t` gets no decay and does not move."""
  tx = optim.make_optimizer(name=name, learning_rate=1.0, total_steps=1, momentum=0.0,
                            weight_decay=0.5, schedule="constant")
  params = {"model": {"w": jnp.ones(())}, "loss": {"t": jnp.ones(())}}
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero, tx.init(params), params)
  assert float(updates["model"]["w"]) == pytest.approx(expected_w_update, rel=1e-4)
  assert float(updates["loss"]["t"]) == 0.0


def test_adagrad_is_keras_adagrad():
  """Two steps against Keras's update: `acc = 0.1 + sum g^2`, `w -= lr g / sqrt(acc + 1e-7)`."""
  tx = optim.make_optimizer(name="adagrad", learning_rate=0.1, total_steps=2,
                            schedule="constant")
  params = {"model": {"w": jnp.array([1.0, -2.0])}, "loss": {}}
  opt_state = tx.init(params)
  w, acc = np.array([1.0, -2.0]), np.full(2, 0.1)
  for grad in (np.array([0.5, -3.0]), np.array([2.0, 0.25])):
    updates, opt_state = tx.update({"model": {"w": jnp.asarray(grad)}, "loss": {}},
                                   opt_state, params)
    params = optax.apply_updates(params, updates)
    acc = acc + grad ** 2
    w = w - 0.1 * grad / np.sqrt(acc + 1e-7)
  np.testing.assert_allclose(params["model"]["w"], w, rtol=1e-6)


class _Interrupted(Exception):
  pass


def _run(workdir, *, resume=False, stop_after=None, num_steps=8, evaluations=()):
  fresh_state, _ = _setup(total_steps=num_steps)
  mesh, train_step = _train_step(8, total_steps=num_steps)
  all_images = _images(n=BATCH * num_steps, seed=7)

  def batches(start):
    for index in range(start, num_steps):
      if stop_after is not None and index == stop_after:
        raise _Interrupted
      yield {"image": all_images[index * BATCH:(index + 1) * BATCH]}

  return loop.train(
      fresh_state(), train_step=train_step, batches=batches,
      num_steps=num_steps, workdir=str(workdir), key=jax.random.key(11), mesh=mesh,
      config={"loss": "learnable=0.2", "steps": num_steps}, resume=resume,
      checkpoint_every=3, log_every=2, progress=False, evaluations=evaluations)


def test_resume_equals_uninterrupted_run(tmp_path):
  reference = _run(tmp_path / "a")
  with pytest.raises(_Interrupted):
    _run(tmp_path / "b", stop_after=5)
  rows_before = outputs.read_csv(str(tmp_path / "b" / outputs.METRICS_FILE))
  assert rows_before["step"].max() == 4  # logged every 2 steps; steps 5 was never fetched
  resumed = _run(tmp_path / "b", resume=True)
  assert int(resumed.step) == 8
  chex.assert_trees_all_close(jax.device_get(resumed.params), jax.device_get(reference.params),
                              atol=1e-6, rtol=1e-6)
  chex.assert_trees_all_close(jax.device_get(resumed.model_state),
                              jax.device_get(reference.model_state), atol=1e-6, rtol=1e-6)
  rows = outputs.read_csv(str(tmp_path / "b" / outputs.METRICS_FILE))
  np.testing.assert_array_equal(rows["step"], np.arange(1, 9))  # no duplicated or lost rows
  uninterrupted = outputs.read_csv(str(tmp_path / "a" / outputs.METRICS_FILE))
  np.testing.assert_allclose(rows["loss"], uninterrupted["loss"], rtol=1e-5)


def _set_column(path, column, value):
  """Rewrites `column` of every row of the CSV at `path` to `value`, or drops it (None)."""
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  fields = [k for k in rows[0] if value is not None or k != column]
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fields, extrasaction="ignore")
    writer.writeheader()
    writer.writerows([{**row, column: value} for row in rows])


def test_training_seconds_add_the_seconds_before_a_resume(tmp_path):
  with pytest.raises(_Interrupted):
    _run(tmp_path / "b", stop_after=5)
  metrics = tmp_path / "b" / outputs.METRICS_FILE
  first = outputs.read_csv(str(metrics))[outputs.SECONDS]
  assert np.all(first > 0) and np.all(np.diff(first) >= 0)
  _set_column(metrics, outputs.SECONDS, "1000.0")  # as if the first part had taken 1000 s
  _run(tmp_path / "b", resume=True)  # resumes from the checkpoint of step 3
  seconds = outputs.read_csv(str(metrics))[outputs.SECONDS]
  np.testing.assert_array_equal(seconds[:3], 1000.0)  # the rows through step 3 are kept
  assert np.all(seconds[3:] > 1000.0) and np.all(np.diff(seconds) >= 0)
  assert outputs.training_seconds(str(tmp_path / "b")) == seconds[-1]
  # A run begun without the column: the seconds before its resume are unknown, not 0.
  with pytest.raises(_Interrupted):
    _run(tmp_path / "c", stop_after=5)
  _set_column(tmp_path / "c" / outputs.METRICS_FILE, outputs.SECONDS, None)
  _run(tmp_path / "c", resume=True)
  assert np.isnan(outputs.training_seconds(str(tmp_path / "c")))
  assert np.isnan(outputs.training_seconds(str(tmp_path / "none")))


def test_existing_run_is_not_overwritten_and_resume_checks_config(tmp_path):
  _run(tmp_path, num_steps=8)
  snapshot = {name: open(tmp_path / name).read() for name in ("config.json", "metrics.csv")}
  with pytest.raises(ValueError, match="already holds a run"):
    _run(tmp_path, num_steps=8)
  with pytest.raises(ValueError, match="config differs.*steps: recorded 8, now 3"):
    _run(tmp_path, num_steps=3, resume=True)
  assert snapshot == {name: open(tmp_path / name).read() for name in snapshot}
  assert json.load(open(tmp_path / "config.json"))["steps"] == 8


def test_unwritable_workdir_raises_before_training(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  with pytest.raises(ValueError, match="cannot be written"):
    loop.prepare_workdir(str(blocker / "run"), {}, resume=False)
  assert blocker.read_text() == "not a directory"


def test_batch_not_divisible_by_device_count_raises():
  mesh = sharding.make_mesh(jax.devices()[:8])
  with pytest.raises(ValueError, match="batch_size = 12 must be a positive multiple.*8"):
    sharding.check_batch_size(12, mesh)
  with pytest.raises(ValueError, match="divisible by the 8 local devices"):
    sharding.shard_batch({"image": np.zeros((12, 2))}, mesh)


def test_non_finite_loss_stops_the_run(tmp_path):
  mesh = sharding.make_mesh(jax.devices()[:1])

  def loss_fn(params, model_state, batch, key, step_index):
    return jnp.log(params["model"]["w"] - 1.0), (model_state, {})  # log(-1) = NaN

  s = state.create_train_state(model_params={"w": jnp.zeros(())}, tx=optax.sgd(0.1))
  with pytest.raises(FloatingPointError, match="non-finite loss at step 1"):
    loop.train(s, train_step=step.make_train_step(loss_fn, mesh=mesh, batch_sharded=False),
               batches=lambda start: iter([{}] * 3), num_steps=3, workdir=str(tmp_path),
               key=jax.random.key(0), mesh=mesh, batch_sharded=False, progress=False)
  assert not os.listdir(tmp_path / loop.CHECKPOINT_DIR)


def test_read_csv_reads_an_empty_cell_as_nan(tmp_path):
  # A run resumed by a version that no longer logs a column leaves that cell empty.
  path = tmp_path / outputs.METRICS_FILE
  path.write_text("step,loss,examples_per_sec\n1,0.5,100\n2,0.25,\n")
  columns = outputs.read_csv(str(path))
  np.testing.assert_array_equal(columns["loss"], [0.5, 0.25])
  np.testing.assert_array_equal(columns["examples_per_sec"], [100.0, np.nan])


def test_the_host_keeps_one_step_in_flight(tmp_path):
  # A stop request (SIGTERM) is honoured at a step boundary, but the checkpoint then waits for
  # every step the host has dispatched: dispatching step k, the loop must have waited for step
  # k - 2 (step k - 1 runs meanwhile), not run ahead to the next fetch of the metrics.
  weights = jnp.eye(128) * 0.5

  @jax.jit
  def compiled(train_state, batch, key):
    del key
    x = jax.lax.fori_loop(0, 50, lambda _, x: jnp.tanh(x @ weights), batch["x"])
    return train_state.replace(step=train_state.step + 1), {"loss": jnp.sum(x)}

  outputs_so_far, ready_at_dispatch = [], []

  def train_step(train_state, batch, key):
    # At the dispatch of step k: was step k - 2 finished?
    if len(outputs_so_far) >= 2:
      ready_at_dispatch.append(outputs_so_far[-2]["loss"].is_ready())
    out = compiled(train_state, batch, key)
    outputs_so_far.append(out[1])
    return out

  def batches(start):
    for _ in range(start, 12):
      yield {"x": np.ones((128, 128), np.float32)}

  train_state = state.create_train_state(model_params={"w": jnp.zeros(())}, tx=optax.sgd(0.1))
  compiled(train_state, {"x": np.ones((128, 128), np.float32)}, None)  # compiled before timing
  loop.train(train_state, train_step=train_step, batches=batches, num_steps=12,
             workdir=str(tmp_path / "run"), key=jax.random.key(0),
             mesh=sharding.make_mesh(jax.devices()[:1]), config={}, log_every=100,
             checkpoint_every=100, progress=False)
  assert len(ready_at_dispatch) == 10 and all(ready_at_dispatch), ready_at_dispatch


def test_step_evaluations_are_written_at_their_steps_and_redone_after_a_resume(tmp_path):
  calls = []

  def score(train_state):
    calls.append(int(train_state.step))
    return {"step_seen": float(train_state.step)}

  evaluations = [loop.StepEvaluation("scores.csv", score, {1, 4, 8})]
  with pytest.raises(_Interrupted):
    _run(tmp_path, stop_after=5, evaluations=evaluations)
  assert calls == [1, 4]
  _run(tmp_path, resume=True, evaluations=evaluations)  # from the checkpoint of step 3
  assert calls == [1, 4, 4, 8]  # step 4's row is redone, step 1's kept
  rows = outputs.read_csv(str(tmp_path / "scores.csv"))
  np.testing.assert_array_equal(rows["step"], [1, 4, 8])
  np.testing.assert_array_equal(rows["step_seen"], [1, 4, 8])  # each after its own step
  assert not os.path.exists(tmp_path / outputs.EVAL_FILE)  # no eval_fn: no eval.csv
  with pytest.raises(ValueError, match="StepEvaluation.file must be a CSV file name"):
    loop.StepEvaluation(outputs.EVAL_FILE, score, {1})
