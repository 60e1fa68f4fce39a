r"""Time per GRACE epoch on CiteSeer (full batch, one jitted step), and where it goes.

Prints, side by side in one process: the full training step (two views, GCN, projection,
`info_nce(negatives="all")`, Adam) with the loss's tiles as the experiment uses them and with
one dense `[2N, 2N]` tile, the loss alone (fwd+bwd on fixed projections, both ways), the GCN
alone, and the floor of the loss (the `[2N, D] x [D, 2N]` similarity matmul fwd+bwd); wall and
process-CPU seconds (CPU / cores approximates the wall time on an idle machine), and the
projected time of a 1000-epoch run.

Run: python -m benchmarks.grace_bench [--epochs 20] [--mapping free] [--dataset citeseer]
  [--block_size 512] [--data_dir DIR]
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import optax

from experiments.configs import grace_citeseer
from experiments.grace import train as grace
from tfcl_jax import losses, mappings, training
from tfcl_jax.augment import graph as graph_augment
from tfcl_jax.models import gcn
from tfcl_jax.objectives import grace as grace_objective


def _time(fn, *args, repeats: int) -> tuple[float, float]:
  """(wall, process CPU) seconds per call of a compiled `fn`, after one warm-up call."""
  jax.block_until_ready(fn(*args))
  wall, cpu = time.perf_counter(), time.process_time()
  for _ in range(repeats):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - wall) / repeats, (time.process_time() - cpu) / repeats


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--epochs", type=int, default=20, help="timed epochs")
  parser.add_argument("--mapping", default="free")
  parser.add_argument("--dataset", default="citeseer", choices=("citeseer", "cora"))
  parser.add_argument("--block_size", type=int, default=None,
                      help="tile side of the loss (default: the config's; None is automatic)")
  parser.add_argument("--data_dir", default=None,
                      help="folder of the raw Planetoid files (default: the config's)")
  args = parser.parse_args()

  config = grace_citeseer.get_config(args.dataset)
  if args.data_dir:
    config.data_dir = args.data_dir
  block_size = args.block_size or config.block_size
  graph, batch = grace.load_graph(config)
  mapping = mappings.from_spec(args.mapping)
  model = gcn.GRACE(hidden_dims=(config.hidden_dim,) * config.num_layers,
                    projection_hidden_dim=config.projection_hidden_dim)
  full = gcn.gcn_normalize(batch.edge_index, num_nodes=graph.num_nodes)
  params = {"model": model.init(jax.random.key(0), batch.features, full)["params"],
            "loss": dict(mapping.params)}
  def step_fn(block):
    loss_fn = grace_objective.make_grace_loss(model, mapping, edge_rate=config.edge_rate,
                                 feature_rate=config.feature_rate, block_size=block)
    return training.make_train_step(loss_fn, mesh=mesh, batch_sharded=False, donate=False)

  # The experiment's step: the library's jitted train step on one replicated full batch.
  mesh = training.make_mesh(jax.devices()[:1])
  state = training.create_train_state(model_params=params["model"],
                                      tx=optax.adam(config.learning_rate),
                                      loss_params=params["loss"])
  placed = training.sharding.shard_batch(batch, mesh, sharded=False)
  # Placed as the loop's states are (a fresh state would be copied to the mesh every call).
  state = jax.device_put(state, training.sharding.replicated(mesh))

  h1, h2 = jax.random.normal(jax.random.key(2), (2, graph.num_nodes, config.hidden_dim))
  held = mapping.bind(params=mapping.params)   # a learnable mapping at its initial params

  def loss_only(block):
    return jax.jit(jax.grad(lambda a, b: losses.info_nce(
        a, b, mapping=held, negatives="all", block_size=block), argnums=(0, 1)))

  dense = 2 * graph.num_nodes  # one tile holds the whole [2N, 2N] matrix
  tiled_step, dense_step = step_fn(block_size), step_fn(dense)
  tiles = "automatic" if block_size is None else block_size
  both = jnp.concatenate([h1, h2])
  floor = jax.jit(jax.grad(lambda u: jnp.sum(u @ u.T)))

  def gcn_view(params, key):
    view = graph_augment.grace_view(key, batch.features, batch.edge_index.shape[1])
    prop = gcn.gcn_normalize(batch.edge_index, num_nodes=graph.num_nodes,
                             edge_weight=view.edge_weight)
    return jnp.sum(model.apply({"params": params["model"]}, view.features, prop)[1])

  gcn_grad = jax.jit(jax.grad(gcn_view))

  rows = [
      (f"train step, tiles {tiles} (the run's)",
       _time(lambda: tiled_step(state, placed, jax.random.key(1))[1]["loss"],
             repeats=args.epochs)),
      ("train step, dense logits",
       _time(lambda: dense_step(state, placed, jax.random.key(1))[1]["loss"],
             repeats=args.epochs)),
      (f"loss alone, tiles {tiles}, fwd+bwd",
       _time(loss_only(block_size), h1, h2, repeats=args.epochs)),
      ("loss alone, dense, fwd+bwd", _time(loss_only(dense), h1, h2, repeats=args.epochs)),
      ("GCN + head, one view, fwd+bwd", _time(gcn_grad, params, jax.random.key(3),
                                              repeats=args.epochs)),
      ("floor: [2N,D]x[D,2N] matmul fwd+bwd", _time(floor, both, repeats=args.epochs)),
  ]
  cores = os.cpu_count() or 1
  step_wall, step_cpu = rows[0][1]
  print(f"GRACE on {graph.name} (N={graph.num_nodes}, E={batch.edge_index.shape[1]}), "
        f"mapping {mapping.spec}, {args.epochs} timed epochs, {cores} cores, "
        f"{jax.devices()[0].platform}")
  print(f"{'':44s} {'wall s':>9s} {'cpu s':>9s} {'/ step':>7s}")
  for name, (wall, cpu) in rows:
    print(f"{name:44s} {wall:9.4f} {cpu:9.4f} {wall / step_wall:7.2f}")
  print(f"time per epoch: {step_wall:.4f} s wall, {step_cpu:.4f} s CPU")
  print(f"1000-epoch run: {1000 * step_wall:.0f} s wall now; "
        f"{1000 * step_cpu / cores:.0f} s if this process had all {cores} cores (CPU / cores)")


if __name__ == "__main__":
  main()
