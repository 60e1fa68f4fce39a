"""Two JAX processes x 4 CPU devices on 127.0.0.1 (gloo): losses, training, resume, failure.

Each test launches `tests/helpers/multiprocess_worker.py` twice (process 0 hosts the coordinator),
bounds both in time, and compares what they wrote with this process's single-process result.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tests.helpers import multiprocess_worker as worker
from tfcl_jax import losses, mappings, training

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(task: str, out_dir, *extra: str, timeout: float = 240) -> list[tuple[int, str]]:
  """Runs both processes of `task`; returns (exit code, output) per process, killing on timeout."""
  port = str(_free_port())
  env = {**os.environ, "PYTHONPATH": ROOT}  # the worker sets its own device count
  procs = [subprocess.Popen(
      [sys.executable, os.path.join(ROOT, "tests", "helpers", "multiprocess_worker.py"), task,
       str(i), "2", port, str(out_dir), *extra], env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True) for i in range(2)]
  deadline = time.monotonic() + timeout
  results = []
  for proc in procs:
    try:
      out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      pytest.fail(f"{task}: a process was still running after {timeout} s (hang)")
    results.append((proc.returncode, out))
  return results


def _check_ok(results):
  for i, (code, out) in enumerate(results):
    assert code == 0, f"process {i} exited {code}:\n{out[-3000:]}"


def test_losses_across_two_processes_equal_one_process(tmp_path):
  _check_ok(_launch("losses", tmp_path))
  got = np.load(tmp_path / "losses.npz")
  z1, z2 = worker.reference_views()
  for name, _, kwargs in worker.loss_cases(losses, mappings):
    single = losses.info_nce if name != "sigmoid" else losses.sigmoid_loss
    value, grads = jax.value_and_grad(lambda a, b, f=single, kw=kwargs: f(a, b, **kw),
                                      argnums=(0, 1))(z1, z2)
    for strategy in ("all_gather", "ring"):
      key = f"{name}/{strategy}"
      np.testing.assert_allclose(got[f"{key}/value"], value, atol=1e-5, err_msg=key)
      np.testing.assert_allclose(got[f"{key}/grad1"], grads[0], atol=1e-5, err_msg=key)
      np.testing.assert_allclose(got[f"{key}/grad2"], grads[1], atol=1e-5, err_msg=key)


def _single_process_training(steps: int):
  """The same SimCLR steps in this process on 8 devices, the global batch being both shards."""
  loss_fn, state = worker.simclr_parts()
  mesh = training.make_mesh(jax.devices()[:8])
  shards = [list(worker.host_batches(i, 2, 0)) for i in range(2)]
  batches = [{"image": np.concatenate([s0["image"], s1["image"]])}
             for s0, s1 in zip(*shards, strict=True)]
  import tempfile  # noqa: PLC0415

  state = training.train(
      state, train_step=training.make_train_step(loss_fn, mesh=mesh),
      batches=lambda start: iter(batches[start:steps]), num_steps=steps,
      workdir=tempfile.mkdtemp(), key=jax.random.key(1), mesh=mesh, progress=False)
  return shards, jax.device_get(state.params["model"])


def test_training_across_two_processes_equals_one_process_and_resumes_after_sigterm(tmp_path):
  shards, expected = _single_process_training(worker.STEPS)
  flat = {"/".join(str(k.key) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(expected)[0]}
  # Two processes; SIGTERM reaches process 0 alone as it draws the batch of step 2. JAX's
  # preemption sync picks the step after the furthest one the processes had reported (3, or 2
  # when process 1 had not yet reported step 2): both save that step and stop there.
  _check_ok(_launch("preempt", tmp_path))
  stopped = [(tmp_path / f"preempted_{i}.txt").read_text() for i in range(2)]
  assert stopped in (["2", "2"], ["3", "3"]), stopped
  stop = int(stopped[0])
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == sorted({"2", str(stop)})
  _check_ok(_launch("train", tmp_path, str(worker.STEPS)))
  for i in range(2):
    got = np.load(tmp_path / f"train_{i}.npz")
    assert int(got["step"]) == worker.STEPS
    for name, leaf in flat.items():
      np.testing.assert_allclose(got[name], leaf, atol=1e-5, rtol=1e-5, err_msg=name)
    # Each process read only its own shard: the resumed run's steps.
    own = np.stack([b["image"] for b in shards[i][stop:]])
    np.testing.assert_array_equal(got["seen"], own)
  # One writer: metrics and checkpoints once, from process 0.
  with open(tmp_path / "run" / training.outputs.METRICS_FILE) as f:
    steps = [line.split(",")[0] for line in f.read().splitlines()[1:]]
  assert steps == ["1", "2", "3", "4"]
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == sorted({str(stop), "4"})


def test_a_dead_process_ends_the_other_with_an_error(tmp_path):
  start = time.monotonic()
  (code0, out0), (code1, _) = _launch("crash", tmp_path, timeout=120)
  assert code1 == 3
  assert code0 != 0, out0[-2000:]
  assert time.monotonic() - start < 120


def test_distributed_flag_without_a_cluster_is_a_one_line_error(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_"))}
  result = subprocess.run(
      [sys.executable, "-m", "experiments.simclr", "--config=experiments/configs/simclr_digits.py",
       f"--workdir={tmp_path}", "--distributed"], cwd=ROOT, env=env, capture_output=True,
      text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().startswith("error: --distributed:")
  assert "--coordinator_address" in result.stderr and "Traceback" not in result.stderr
