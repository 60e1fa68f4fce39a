"""Faults a training job meets, against `tfcl_jax.training.train`: an interrupt during an
evaluation, SIGTERM, a damaged checkpoint, a full disk, a non-finite loss or gradient.

Each test trains a least-squares model for a few steps on one device (milliseconds a step) and
compares what the faulted run leaves on disk with an uninterrupted run's.
"""

from __future__ import annotations

import errno
import functools
import gc
import glob
import json
import os
import signal
import struct
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.helpers.marks import widest
from tfcl_jax.training import checkpoint, files, loop, outputs, preemption, sharding, state, step

NUM_STEPS = 6


class _Interrupted(Exception):
  pass


def _loss_fn(params, model_state, batch, key, step_index):
  del key, step_index
  residual = batch["x"] @ params["model"]["w"] - batch["y"]
  return jnp.mean(residual ** 2), (model_state, {})


@functools.cache
def _mesh_and_step():
  mesh = sharding.make_mesh(jax.devices()[:1])
  return mesh, step.make_train_step(_loss_fn, mesh=mesh, batch_sharded=False)


def _batch(index: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(index)
  return {"x": rng.normal(size=(4, 3)).astype(np.float32),
          "y": rng.normal(size=4).astype(np.float32)}


def _eval_fn(s):
  return {"w0": float(s.params["model"]["w"][0])}


def _run(workdir, *, resume=False, batch=_batch, eval_fn=_eval_fn, on_step=None, **kwargs):
  """`train` for `NUM_STEPS` steps; `on_step(index)` runs as the batch of step `index + 1` is
  drawn (to send a signal); checkpoint and evaluation every 2 steps, metrics every step."""
  mesh, train_step = _mesh_and_step()

  def batches(start):
    for index in range(start, NUM_STEPS):
      if on_step is not None:
        on_step(index)
      yield batch(index)

  fresh = state.create_train_state(model_params={"w": jnp.zeros(3)}, tx=optax.sgd(0.1))
  options = dict(checkpoint_every=2, eval_every=2, log_every=1, progress=False)
  return loop.train(fresh, train_step=train_step, batches=batches, num_steps=NUM_STEPS,
                    workdir=str(workdir), key=jax.random.key(0), mesh=mesh, resume=resume,
                    eval_fn=eval_fn, desc="least squares", **{**options, **kwargs})


def _text(path) -> str:
  with open(path) as f:
    return f.read()


def _params(s):
  return jax.device_get(s.params)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted run: its final parameters and its workdir."""
  workdir = tmp_path_factory.mktemp("reference")
  return _params(_run(workdir)), workdir


def test_interrupt_during_evaluation_loses_no_eval_row(tmp_path, reference):
  """Interrupted inside the evaluation of step 4, where a checkpoint is also due: the
  checkpoint of step 4 must not exist yet, so the resumed run evaluates step 4 again."""

  def failing_eval(s):
    if int(s.step) == 4:
      raise _Interrupted
    return _eval_fn(s)

  with pytest.raises(_Interrupted):
    _run(tmp_path, eval_fn=failing_eval)
  assert checkpoint.make_manager(str(tmp_path / loop.CHECKPOINT_DIR)).latest_step() == 2
  resumed = _run(tmp_path, resume=True)
  assert _text(tmp_path / outputs.EVAL_FILE) == _text(reference[1] / outputs.EVAL_FILE)
  np.testing.assert_array_equal(outputs.read_csv(str(tmp_path / outputs.EVAL_FILE))["step"],
                                [2, 4, 6])
  chex.assert_trees_all_equal(_params(resumed), reference[0])


def test_resume_prints_one_line_naming_the_run_and_step(tmp_path, capsys):
  with pytest.raises(_Interrupted):
    _run(tmp_path, on_step=lambda index: index == 3 and _raise(_Interrupted()))
  capsys.readouterr()
  _run(tmp_path, resume=True)
  lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resuming")]
  assert lines == [f"resuming least squares from step 2 ({tmp_path})"]


def _raise(error):
  raise error


def test_sigterm_checkpoints_at_the_next_step_and_resume_is_bit_identical(tmp_path, reference):
  received = []
  previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
  try:
    # SIGTERM while the batch of step 3 is drawn: step 3 finishes, is saved, and the run stops.
    with pytest.raises(preemption.Preempted, match="checkpoint saved at step 3") as stopped:
      _run(tmp_path, on_step=lambda index: index == 2 and os.kill(os.getpid(), signal.SIGTERM))
    assert stopped.value.step == 3 and not received  # the loop's handler took it
    os.kill(os.getpid(), signal.SIGTERM)  # the previous handler is back
    assert received == [signal.SIGTERM]
  finally:
    signal.signal(signal.SIGTERM, previous)
  assert checkpoint.make_manager(str(tmp_path / loop.CHECKPOINT_DIR)).latest_step() == 3
  np.testing.assert_array_equal(outputs.read_csv(str(tmp_path / outputs.METRICS_FILE))["step"],
                                [1, 2, 3])
  resumed = _run(tmp_path, resume=True)
  chex.assert_trees_all_equal(_params(resumed), reference[0])  # bit-identical on CPU
  assert _text(tmp_path / outputs.EVAL_FILE) == _text(reference[1] / outputs.EVAL_FILE)


def test_sigterm_during_the_last_step_stops_after_the_final_checkpoint(tmp_path, reference):
  previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
  try:
    with pytest.raises(preemption.Preempted, match=f"checkpoint saved at step {NUM_STEPS}"):
      _run(tmp_path, on_step=lambda index: index == NUM_STEPS - 1 and os.kill(os.getpid(),
                                                                              signal.SIGTERM))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGTERM, previous)
  manager = checkpoint.make_manager(str(tmp_path / loop.CHECKPOINT_DIR))
  assert manager.latest_step() == NUM_STEPS
  assert _text(tmp_path / outputs.EVAL_FILE) == _text(reference[1] / outputs.EVAL_FILE)


def test_ctrl_c_checkpoints_at_the_next_step_and_a_second_one_interrupts_at_once(
    tmp_path, reference):
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own
  try:
    # Ctrl-C while the batch of step 3 is drawn: step 3 finishes and is saved, then it stops.
    with pytest.raises(KeyboardInterrupt, match="checkpoint saved at step 3"):
      _run(tmp_path, on_step=lambda index: index == 2 and os.kill(os.getpid(), signal.SIGINT))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert checkpoint.make_manager(str(tmp_path / loop.CHECKPOINT_DIR)).latest_step() == 3
    resumed = _run(tmp_path, resume=True)
    chex.assert_trees_all_equal(_params(resumed), reference[0])
    # Two in a row: the second interrupts inside the step, before its checkpoint.
    again = tmp_path / "again"
    with pytest.raises(KeyboardInterrupt, match="^$"):
      _run(again, on_step=lambda index: index == 2 and _sigint_twice())
    assert checkpoint.make_manager(str(again / loop.CHECKPOINT_DIR)).latest_step() == 2
  finally:
    signal.signal(signal.SIGINT, previous)


def _sigint_twice():
  """Two Ctrl-C in a row. The handlers run here, with the garbage collector off: one run inside
  a gc callback (JAX registers one) would raise there, where the KeyboardInterrupt is lost as
  an unraisable exception."""
  gc.disable()
  try:
    for _ in range(2):
      os.kill(os.getpid(), signal.SIGINT)
  finally:
    gc.enable()


def _truncate_metadata(step_dir):
  for path in glob.glob(os.path.join(step_dir, "*", "_METADATA")):
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)  # a write cut short


def _truncate_data(step_dir):
  paths = glob.glob(os.path.join(step_dir, "*", "d", "*"))  # the arrays' values and zarr headers
  assert paths
  for path in paths:
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)


def _noise(capfd) -> list[str]:
  """Lines on stdout/stderr that are neither the run's own lines nor its warnings."""
  gc.collect()  # abandoned reads report when they are collected
  return [line for line in "".join(capfd.readouterr()).splitlines()
          if any(text in line for text in ("Traceback", "Event loop is closed", "never awaited",
                                           "never retrieved", "destroyed but it is pending"))]


@pytest.fixture
def unraisable_to_stderr(monkeypatch):
  """Python's own report of an exception no caller can catch (on stderr, as outside pytest,
  whose hook would turn it into a warning of a later test)."""
  monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)


@pytest.mark.parametrize("damage", widest(_truncate_metadata, _truncate_data,
                                          quick=(_truncate_data,)))
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(
    tmp_path, reference, damage, capfd, unraisable_to_stderr):
  with pytest.raises(_Interrupted):
    _run(tmp_path, on_step=lambda index: index == 4 and _raise(_Interrupted()))
  checkpoints = tmp_path / loop.CHECKPOINT_DIR
  assert sorted(os.listdir(checkpoints)) == ["2", "4"]
  damage(checkpoints / "4")
  capfd.readouterr()
  template = state.create_train_state(model_params={"w": jnp.zeros(3)}, tx=optax.sgd(0.1))
  for _ in range(3):  # orbax abandons the other reads of a failed restore: each try can report
    restored, bad = checkpoint.restore_latest_good(
        checkpoint.make_manager(str(checkpoints)), template)
    assert int(restored.step) == 2 and bad == [4]
  with pytest.warns(UserWarning, match=r"checkpoint 4 in .* cannot be read.*from step 2"):
    resumed = _run(tmp_path, resume=True)
  assert _noise(capfd) == []  # the warning is the one report of the damage
  chex.assert_trees_all_equal(_params(resumed), reference[0])
  assert sorted(os.listdir(checkpoints)) == ["4", "4.bad", "6"]  # 4 saved afresh, 2 rotated out
  assert _text(tmp_path / outputs.EVAL_FILE) == _text(reference[1] / outputs.EVAL_FILE)


def test_no_readable_checkpoint_restarts_from_step_zero(tmp_path, reference, capfd,
                                                       unraisable_to_stderr):
  with pytest.raises(_Interrupted):
    _run(tmp_path, on_step=lambda index: index == 4 and _raise(_Interrupted()))
  _truncate_metadata(tmp_path / loop.CHECKPOINT_DIR / "4")
  _truncate_data(tmp_path / loop.CHECKPOINT_DIR / "2")
  capfd.readouterr()
  with pytest.warns(UserWarning, match=r"checkpoints 4, 2 in .* cannot be read.*from step 0"):
    resumed = _run(tmp_path, resume=True)
  assert _noise(capfd) == []
  chex.assert_trees_all_equal(_params(resumed), reference[0])
  assert _text(tmp_path / outputs.METRICS_FILE).count("\n") == NUM_STEPS + 1


class _FullDiskFile:
  """An append that writes half its text, then finds the disk full."""

  def __init__(self, file, path):
    self.file, self.path = file, path

  def write(self, text):
    self.file.write(text[:len(text) // 2])
    self.file.flush()
    raise OSError(errno.ENOSPC, "No space left on device", self.path)

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.file.close()


def test_full_disk_on_a_csv_append_keeps_the_earlier_rows(tmp_path, monkeypatch):
  def full_after_step_3(path, mode="r", *args, **kwargs):
    file = open(path, mode, *args, **kwargs)
    if mode == "a" and str(path).endswith(outputs.METRICS_FILE) and _text(path).count("\n") > 3:
      return _FullDiskFile(file, path)
    return file

  monkeypatch.setattr(outputs, "open", full_after_step_3, raising=False)
  with pytest.raises(files.DiskFull) as stopped:
    _run(tmp_path)
  metrics_path = str(tmp_path / outputs.METRICS_FILE)
  assert str(stopped.value) == (f"no space left to write {metrics_path} (No space left on "
                                f"device); the rows before are kept. Free space and rerun to "
                                f"resume.")
  assert isinstance(stopped.value, OSError) and stopped.value.errno == errno.ENOSPC
  assert stopped.value.filename == metrics_path
  np.testing.assert_array_equal(outputs.read_csv(metrics_path)["step"], [1, 2, 3])
  assert _text(metrics_path).endswith("\n")  # no half row
  monkeypatch.undo()
  restored = checkpoint.restore_latest(
      checkpoint.make_manager(str(tmp_path / loop.CHECKPOINT_DIR)),
      state.create_train_state(model_params={"w": jnp.zeros(3)}, tx=optax.sgd(0.1)))
  assert restored is not None and int(restored.step) == 2


def test_full_disk_on_a_checkpoint_keeps_the_earlier_checkpoints(tmp_path, monkeypatch):
  save = checkpoint.ocp.CheckpointManager.save

  def full_at_step_4(self, step_number, *args, **kwargs):
    if step_number == 4:
      raise ValueError("tensorstore: Error writing: [Errno 28] No space left on device")
    return save(self, step_number, *args, **kwargs)

  monkeypatch.setattr(checkpoint.ocp.CheckpointManager, "save", full_at_step_4)
  with pytest.raises(files.DiskFull,
                     match=r"write .*checkpoints/4 \(No space .*\); checkpoints up to step 2 are"):
    _run(tmp_path)
  monkeypatch.undo()
  manager = checkpoint.make_manager(str(tmp_path / loop.CHECKPOINT_DIR))
  assert manager.all_steps() == [2]
  restored = checkpoint.restore_latest(
      manager, state.create_train_state(model_params={"w": jnp.zeros(3)}, tx=optax.sgd(0.1)))
  assert restored is not None and int(restored.step) == 2
  np.testing.assert_array_equal(outputs.read_csv(str(tmp_path / outputs.METRICS_FILE))["step"],
                                [1, 2, 3, 4])
  np.testing.assert_array_equal(outputs.read_csv(str(tmp_path / outputs.EVAL_FILE))["step"], [2, 4])


def test_non_finite_loss_names_the_step_the_run_and_the_last_finite_loss(tmp_path):
  def nan_at_step_3(index):
    batch = _batch(index)
    if index == 2:
      batch["y"][0] = np.nan
    return batch

  with pytest.raises(FloatingPointError) as stopped:
    _run(tmp_path, batch=nan_at_step_3)
  losses = outputs.read_csv(str(tmp_path / outputs.METRICS_FILE))["loss"]
  assert str(stopped.value) == (
      f"non-finite loss and grad_norm at step 3 of 'least squares' ({tmp_path}) (last finite "
      f"loss {losses[1]:.6g} at step 2; metrics.csv has the rows); the run was not "
      f"checkpointed past step 2.")
  assert checkpoint.make_manager(str(tmp_path / loop.CHECKPOINT_DIR)).all_steps() == [2]


def test_non_finite_gradient_with_a_finite_loss_stops_the_run(tmp_path):
  mesh = sharding.make_mesh(jax.devices()[:1])

  def loss_fn(params, model_state, batch, key, step_index):
    # |w - c| has a finite value and, at w = c, a NaN gradient (0/0 in the norm's derivative).
    return jnp.linalg.norm(params["model"]["w"] - batch["c"]), (model_state, {})

  batches = [{"c": np.ones(2, np.float32)}, {"c": np.zeros(2, np.float32)}]
  s = state.create_train_state(model_params={"w": jnp.zeros(2)}, tx=optax.sgd(0.0))
  with pytest.raises(FloatingPointError, match=r"non-finite grad_norm at step 2 of 'train'"):
    loop.train(s, train_step=step.make_train_step(loss_fn, mesh=mesh, batch_sharded=False),
               batches=lambda start: iter(batches[start:]), num_steps=2, workdir=str(tmp_path),
               key=jax.random.key(0), mesh=mesh, batch_sharded=False, progress=False)
  np.testing.assert_array_equal(outputs.read_csv(str(tmp_path / outputs.METRICS_FILE))["loss"],
                                [np.sqrt(np.float32(2.0)), 0.0])


def test_config_json_is_written_whole_and_a_cut_one_is_written_again(tmp_path, monkeypatch):
  loop.prepare_workdir(str(tmp_path), {"lr": 0.1}, resume=False)
  path = tmp_path / loop.CONFIG_FILE
  before = _text(path)

  def dump_half(obj, f, **kwargs):  # a write cut short by a kill or a full disk
    f.write("{")
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(json, "dump", dump_half)
  with pytest.raises(files.DiskFull) as stopped:
    loop.prepare_workdir(str(tmp_path), {"lr": 0.1}, resume=True)
  assert stopped.value.filename == str(path)
  monkeypatch.undo()
  assert _text(path) == before  # the recorded config is intact, nothing else left
  assert sorted(os.listdir(tmp_path)) == [loop.CONFIG_FILE]
  path.write_text('{"lr": 0.')  # as a write that was not whole (a copy cut short) leaves it
  with pytest.warns(UserWarning, match="cannot be read; it is written again"):
    loop.prepare_workdir(str(tmp_path), {"lr": 0.1}, resume=True)
  assert json.loads(_text(path)) == {"lr": 0.1}


def _stand_in_events(**fields) -> bytes:
  """An event as one JSON line: what `train` hands TensorBoard, readable without tensorboardX."""
  return (json.dumps(fields, sort_keys=True) + "\n").encode()


def _events_file(workdir) -> str:
  [path] = glob.glob(os.path.join(workdir, outputs.TENSORBOARD_DIR, "events.out.tfevents.*"))
  return path


def _scalars(events, tag) -> list[tuple[int, float]]:
  return [(event["step"], event["value"]) for event in events if event.get("tag") == tag]


def test_tensorboard_holds_the_rows_of_the_csv_files(tmp_path, monkeypatch):
  monkeypatch.setattr(outputs, "_event_encoder", lambda: _stand_in_events)
  _run(tmp_path)
  with open(_events_file(tmp_path), "rb") as f:
    events = [json.loads(line) for line in f]
  assert events[0] == {"file_version": "brain.Event:2"}
  metrics = outputs.read_csv(str(tmp_path / outputs.METRICS_FILE))
  evals = outputs.read_csv(str(tmp_path / outputs.EVAL_FILE))
  assert _scalars(events, "train/loss") == list(zip(metrics["step"], metrics["loss"], strict=True))
  assert _scalars(events, "eval/w0") == list(zip(evals["step"], evals["w0"], strict=True))


class _FillingFile:
  """A binary file whose disk fills at the first event of step `full_at`: that write puts half
  the event on disk, then raises ENOSPC."""

  def __init__(self, file, full_at):
    self.file, self.full_at = file, full_at

  def write(self, data):
    if json.loads(data).get("step", 0) >= self.full_at:
      self.file.write(data[:len(data) // 2])
      self.file.flush()
      raise OSError(errno.ENOSPC, "No space left on device")
    return self.file.write(data)

  def __getattr__(self, name):  # flush, tell, close
    return getattr(self.file, name)


def test_full_disk_on_tensorboard_keeps_the_earlier_summaries(tmp_path, monkeypatch, reference):
  def full_at_step_4(path, mode="r", *args, **kwargs):
    file = open(path, mode, *args, **kwargs)
    return _FillingFile(file, full_at=4) if mode == "xb" else file

  monkeypatch.setattr(outputs, "_event_encoder", lambda: _stand_in_events)
  monkeypatch.setattr(outputs, "_FLUSH_SECONDS", 0)  # every window is flushed, as after 2 minutes
  monkeypatch.setattr(outputs, "open", full_at_step_4, raising=False)
  with pytest.raises(files.DiskFull, match="summaries up to its last flush are kept") as stopped:
    _run(tmp_path)
  events_path = _events_file(tmp_path)
  assert stopped.value.filename == events_path and stopped.value.errno == errno.ENOSPC
  with open(events_path, "rb") as f:
    events = [json.loads(line) for line in f]  # whole events only: the half one is cut off
  assert [step for step, _ in _scalars(events, "train/loss")] == [1, 2, 3]
  assert [step for step, _ in _scalars(events, "eval/w0")] == [2]
  np.testing.assert_array_equal(outputs.read_csv(str(tmp_path / outputs.METRICS_FILE))["step"],
                                [1, 2, 3, 4])
  monkeypatch.undo()
  resumed = _run(tmp_path, resume=True)  # space again: the run continues from step 2
  chex.assert_trees_all_equal(_params(resumed), reference[0])


def _tf_records(path) -> list[bytes]:
  """The records of a TFRecord file, each length and record checked against its masked CRC-32C
  (TensorFlow's record format, transcribed from its specification)."""
  crc32c = pytest.importorskip("tensorboardX.crc32c").crc32c

  def masked(data):
    crc = crc32c(data) & 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

  records = []
  with open(path, "rb") as f:
    while header := f.read(12):
      length, length_crc = struct.unpack("<QI", header)
      data, (data_crc,) = f.read(length), struct.unpack("<I", f.read(4))
      assert (length_crc, data_crc) == (masked(header[:8]), masked(data))
      records.append(data)
  return records


def test_tensorboard_events_read_like_those_of_tensorboardx_summary_writer(tmp_path):
  tensorboardx = pytest.importorskip("tensorboardX")
  from tensorboardX.proto.event_pb2 import Event

  def scalars(path):
    events = [Event.FromString(record) for record in _tf_records(path)]
    assert events[0].file_version == "brain.Event:2"
    return [(event.step, value.tag, value.simple_value)
            for event in events[1:] for value in event.summary.value]

  _run(tmp_path / "run")
  ours = scalars(_events_file(tmp_path / "run"))
  writer = tensorboardx.SummaryWriter(str(tmp_path / "theirs"))
  for step_number, tag, value in ours:
    writer.add_scalar(tag, value, step_number)
  writer.close()
  [theirs] = glob.glob(str(tmp_path / "theirs" / "events.out.tfevents.*"))
  assert scalars(theirs) == ours
  metrics = outputs.read_csv(str(tmp_path / "run" / outputs.METRICS_FILE))
  np.testing.assert_allclose([value for _, tag, value in ours if tag == "train/loss"],
                             metrics["loss"], rtol=1e-6)
