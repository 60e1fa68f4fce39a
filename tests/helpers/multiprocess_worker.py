"""One process of a multi-process JAX job on CPU, launched by tests/processes/test_multiprocess.py.

Usage:
  python tests/helpers/multiprocess_worker.py TASK PROCESS_ID NUM_PROCESSES PORT OUT_DIR [STEPS]

Each process has 4 CPU devices; `jax.distributed.initialize` joins them over 127.0.0.1 with
gloo collectives, so the mesh spans 4 x NUM_PROCESSES devices. Tasks:

* `losses`: the sharded losses and their gradients on global arrays; process 0 writes
  `OUT_DIR/losses.npz`.
* `train`: SimCLR steps on digits through `tfcl_jax.training.train`, each process loading only
  its shard (`data.make_loader(shard_index=process_index, shard_count=NUM_PROCESSES)`); resumes
  from `OUT_DIR/run` when it holds a checkpoint; every process writes the final parameters and
  the batches it read to `OUT_DIR/train_<PROCESS_ID>.npz`.
* `preempt`: `train` to STEPS, process 0 sending itself SIGTERM as it draws the batch of step
  2; every process writes the step `training.preemption.Preempted` reports to
  `OUT_DIR/preempted_<PROCESS_ID>.txt`.
* `crash`: process 1 dies after the first collective; process 0 keeps calling collectives
  and must fail, not hang.
"""

from __future__ import annotations

import os
import sys

import jax

from tests.helpers import xla_flags

BATCH, STEPS = 32, 4


def losses_task(out_dir: str) -> None:
  import numpy as np  # noqa: PLC0415
  from jax.experimental import multihost_utils  # noqa: PLC0415
  from jax.sharding import NamedSharding, PartitionSpec  # noqa: PLC0415

  from tfcl_jax import losses, mappings  # noqa: PLC0415

  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  global_views = reference_views()
  placed = NamedSharding(mesh, PartitionSpec("data"))
  z1, z2 = (jax.make_array_from_callback(v.shape, placed, lambda index, v=v: v[index])
            for v in global_views)
  results = {}
  for name, loss_on_mesh, kwargs in loss_cases(losses, mappings):
    for strategy in ("all_gather", "ring"):
      fn = jax.jit(jax.value_and_grad(
          lambda a, b, f=loss_on_mesh, kw=kwargs, s=strategy: f(a, b, mesh=mesh, strategy=s,
                                                                 **kw), argnums=(0, 1)))
      value, grads = fn(z1, z2)
      grads = multihost_utils.process_allgather(grads, tiled=True)
      results[f"{name}/{strategy}/value"] = np.asarray(value)
      results[f"{name}/{strategy}/grad1"] = np.asarray(grads[0])
      results[f"{name}/{strategy}/grad2"] = np.asarray(grads[1])
  if jax.process_index() == 0:
    np.savez(os.path.join(out_dir, "losses.npz"), **results)


def reference_views():
  """The global `[32, 8]` views every process builds identically (NumPy, fixed seed)."""
  import numpy as np  # noqa: PLC0415

  rng = np.random.default_rng(0)
  z1 = rng.standard_normal((32, 8)).astype(np.float32)
  return z1, (z1 + 0.5 * rng.standard_normal((32, 8))).astype(np.float32)


def loss_cases(losses, mappings):
  """(name, loss on mesh, kwargs): the cases the test compares with one process."""
  return [
      ("info_nce_all", losses.info_nce_on_mesh,
       dict(negatives="all", mapping=mappings.temperature_free())),
      ("info_nce_cross", losses.info_nce_on_mesh,
       dict(negatives="cross", mapping=mappings.temperature(0.2))),
      ("two_tower", losses.info_nce_on_mesh,
       dict(negatives="cross", symmetric=True, mapping=mappings.temperature_free())),
      ("sigmoid", losses.sigmoid_loss_on_mesh,
       dict(negatives="cross", bias=-2.0, mapping=mappings.temperature(0.5))),
  ]


def _noise_views(key, images):
  images = images.astype(jax.numpy.float32) / 255.0
  key1, key2 = jax.random.split(key)
  return (images + 0.1 * jax.random.normal(key1, images.shape),
          images + 0.1 * jax.random.normal(key2, images.shape))


def simclr_parts():
  """Model, loss, optimiser and initial state of the small SimCLR run (the same everywhere)."""
  import flax.linen as nn  # noqa: PLC0415
  import optax  # noqa: PLC0415

  from tfcl_jax import mappings, models, training  # noqa: PLC0415
  from tfcl_jax.objectives import simclr  # noqa: PLC0415

  class Flat(nn.Module):
    """A one-layer backbone: compiling it on 8 devices takes a second, not a conv's twenty."""

    @nn.compact
    def __call__(self, x, *, train: bool):
      del train
      return nn.relu(nn.Dense(16)(x.reshape(x.shape[0], -1)))

  model = models.ContrastiveModel(Flat(), models.ProjectionHead(hidden_dim=8, out_dim=8))
  loss_fn = simclr.make_simclr_loss(model, loss=mappings.temperature_free(),
                                    augment=_noise_views)  # cheap to compile; tests the mechanics
  variables = model.init(jax.random.key(0), jax.numpy.zeros((2, 8, 8, 1)), train=False)
  state = training.create_train_state(
      model_params=variables["params"], model_state={"batch_stats": variables["batch_stats"]},
      tx=optax.sgd(1e-3))  # small steps: float-order differences stay small
  return loss_fn, state


def host_batches(shard_index: int, shard_count: int, start: int):
  """This host's digits batches: `BATCH / shard_count` images of its shard per step."""
  from tfcl_jax import data  # noqa: PLC0415

  loader = data.make_loader("digits", "train", batch_size=BATCH // shard_count, seed=0,
                            num_epochs=None, shard_index=shard_index, shard_count=shard_count,
                            start_step=start)
  for step, batch in enumerate(loader, start):
    if step >= STEPS:
      return
    yield {"image": batch["image"]}


def train_task(process_id: int, num_processes: int, out_dir: str, steps: int,
               sigterm_at: int | None = None) -> None:
  import signal  # noqa: PLC0415
  import time  # noqa: PLC0415

  import numpy as np  # noqa: PLC0415

  from tfcl_jax import training  # noqa: PLC0415

  loss_fn, state = simclr_parts()
  mesh = training.make_mesh()
  seen = []

  def batches(start):
    for index, batch in enumerate(host_batches(process_id, num_processes, start), start):
      if index == sigterm_at and process_id == 0:
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler preempting one host
        # Its peer waits for this process in the step's collectives meanwhile; the pause lets
        # the notice reach the coordination service on a loaded machine before step 3 ends.
        time.sleep(2.0)
      seen.append(batch["image"])
      yield batch

  try:
    state = training.train(
        state, train_step=training.make_train_step(loss_fn, mesh=mesh), batches=batches,
        num_steps=steps, workdir=os.path.join(out_dir, "run"), key=jax.random.key(1),
        mesh=mesh, resume=True, checkpoint_every=2, progress=False, log_every=1)
  except training.preemption.Preempted as preempted:
    with open(os.path.join(out_dir, f"preempted_{process_id}.txt"), "w") as f:
      f.write(str(preempted.step))
    return
  params = state.params["model"]  # replicated: every process holds all of it
  assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(params))
  flat = {"/".join(str(k.key) for k in path): np.asarray(leaf.addressable_data(0))
          for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  np.savez(os.path.join(out_dir, f"train_{process_id}.npz"), step=int(state.step),
           seen=np.stack(seen) if seen else np.zeros((0,)), **flat)


def crash_task(process_id: int) -> None:
  import jax.numpy as jnp  # noqa: PLC0415
  from jax.experimental import multihost_utils  # noqa: PLC0415

  multihost_utils.sync_global_devices("started")
  if process_id == 1:
    os._exit(3)  # dies without a goodbye to the coordinator
  for _ in range(1000):  # must raise: its peer is gone
    multihost_utils.process_allgather(jnp.ones(4))


def main() -> None:
  # Before the first device query (importing this module from the tests must not touch them).
  # 4 devices per process; other flags (the tests' compiler settings) pass through.
  os.environ["XLA_FLAGS"] = xla_flags.with_host_devices(4)
  os.environ["JAX_PLATFORMS"] = "cpu"
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  task, process_id, num_processes, port, out_dir = sys.argv[1:6]
  process_id, num_processes = int(process_id), int(num_processes)
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=num_processes,
                             process_id=process_id, initialization_timeout=60,
                             heartbeat_timeout_seconds=10, shutdown_timeout_seconds=10)
  if task == "losses":
    losses_task(out_dir)
  elif task == "train":
    train_task(process_id, num_processes, out_dir, int(sys.argv[6]))
  elif task == "preempt":
    train_task(process_id, num_processes, out_dir, STEPS, sigterm_at=1)
  elif task == "crash":
    crash_task(process_id)
  else:
    raise SystemExit(f"unknown task {task!r}")
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
