"""GRACE's runs: PyGCL's recipe on a Planetoid graph, one (loss, seed) at a time; the sweep.

PyGCL's GRACE recipe: 2-layer GCN (32, ReLU), projection fc-ELU-fc (32), two views with
EdgeRemoving(0.3) + FeatureMasking(0.3), InfoNCE with intra- and inter-view negatives
(`info_nce(negatives="all")`), full-batch Adam lr 0.01 for 1000 epochs; then PyGCL's
LREvaluator on the frozen embeddings (`evaluation.logistic.lr_evaluate`).
"""

from __future__ import annotations

import functools
import itertools

import jax

from experiments.framework import held_out, lowering, plan, sweep, tables
from experiments.grace import report
from tfcl_jax import losses, training
from tfcl_jax.data import planetoid
from tfcl_jax.evaluation import logistic
from tfcl_jax.models import gcn
from tfcl_jax.objectives import grace as grace_objective


def parse_spec(spec: str, num_nodes: int) -> losses.Loss:
  """`losses.from_spec` for GRACE's loss: every node's two views, `negatives="all"`."""
  return losses.from_spec(spec, num_candidates=losses.num_candidates(num_nodes, negatives="all"))


def load_graph(config) -> tuple[planetoid.PlanetoidGraph, grace_objective.GraphBatch]:
  graph = planetoid.load_planetoid(config.dataset, root=config.data_dir)
  batch = grace_objective.GraphBatch(gcn.sparse_features(graph.features),
                                     jax.numpy.asarray(graph.edge_index))
  return graph, batch


def run_keys(seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The run's (initialisation, training, evaluation) keys: a seed fixes all three
  (`sweep.train_run` splits them alike)."""
  return tuple(jax.random.split(jax.random.key(seed), 3))


def build(config, graph: planetoid.PlanetoidGraph, batch: grace_objective.GraphBatch,
          loss: losses.Loss, key: jax.Array
          ) -> tuple[gcn.GRACE, training.TrainState, gcn.Propagation]:
  """The run's model, initial train state (the model initialised with `key`) and full-graph
  propagation."""
  model = gcn.GRACE(hidden_dims=(config.hidden_dim,) * config.num_layers,
                    projection_hidden_dim=config.projection_hidden_dim)
  full = gcn.gcn_normalize(batch.edge_index, num_nodes=graph.num_nodes)
  state = training.create_train_state(
      model_params=model.init(key, batch.features, full)["params"],
      tx=training.make_optimizer(name="adam", learning_rate=config.learning_rate,
                                 total_steps=config.epochs, schedule="constant"),
      apply_fn=model.apply, loss_params=loss.params)
  return model, state, full


def make_train_step(config, model: gcn.GRACE, loss: losses.Loss, mesh):
  """GRACE's full-batch train step: the whole graph is one replicated batch."""
  loss_fn = grace_objective.make_grace_loss(model, loss, edge_rate=config.edge_rate,
                                            feature_rate=config.feature_rate,
                                            block_size=config.block_size)
  return training.make_train_step(loss_fn, mesh=mesh, batch_sharded=False)


def abstract_step(config, mesh, *, spec: str = "free"):
  """The full-graph step with abstract `(state, batch, key)` (`framework.lowering`) on
  `config`'s Planetoid graph (read from `config.data_dir`: its sizes and edges)."""
  graph, batch = load_graph(config)
  loss = parse_spec(spec, graph.num_nodes)
  model, initial, _ = build(config, graph, batch, loss, jax.random.key(0))
  train_step = make_train_step(config, model, loss, mesh)
  return train_step.jitted, (lowering.shapes(initial), lowering.shapes(batch), lowering.key())


def held_out_set(config, model: gcn.GRACE, batch: grace_objective.GraphBatch,
                 full: gcn.Propagation):
  """`state -> held_out.HeldOut` of a run: the encoder's embeddings (those the probe reads) of
  a fixed subset of the nodes (`held_out.subset`), their labels unused, on the whole graph and
  on `held_out.LIDAR_VIEWS` GRACE views of it (the run's own augmentation, drawn with
  `held_out.VIEW_SEED`): the first two views are the pair, LiDAR reads every view of the
  first `held_out.LIDAR_SAMPLES` nodes."""
  nodes = held_out.subset(batch.features.shape[0])
  keys = list(jax.random.split(jax.random.key(held_out.VIEW_SEED), held_out.LIDAR_VIEWS))

  @jax.jit
  def embed(params, batch, full):
    clean = model.apply({"params": params}, batch.features, full, method=gcn.GRACE.embed)
    views = [grace_objective.encode_view(model, params, batch, key, edge_rate=config.edge_rate,
                                         feature_rate=config.feature_rate)[0][nodes]
             for key in keys]
    return clean[nodes], jax.numpy.stack(views, axis=1)

  def held(train_state) -> held_out.HeldOut:
    clean, views = embed(train_state.params["model"], batch, full)
    return held_out.HeldOut(clean, views[:, 0], views[:, 1], views[:held_out.LIDAR_SAMPLES])

  return held


def train_run(config, graph: planetoid.PlanetoidGraph, batch: grace_objective.GraphBatch,
              run: plan.Run, *, workdir: str) -> dict:
  """Trains GRACE for `run` (`sweep.train_run`), evaluates it; returns its results row.

  The run's `metrics.csv` and checkpoints go to `run.directory(workdir)`; a killed run
  resumes from its last checkpoint.
  """

  def trainable(loss, keys, mesh) -> sweep.Trainable:
    model, state, full = build(config, graph, batch, loss, keys[0])
    # Full batch: the whole graph is one replicated batch; more devices would only repeat it.
    replicated = training.sharding.shard_batch(batch, mesh, sharded=False)

    def result(trained: sweep.Trained) -> dict:
      embeddings = model.apply({"params": trained.state.params["model"]}, replicated.features,
                               full, method=gcn.GRACE.embed)
      scores = logistic.lr_evaluate(
          embeddings, graph.labels, key=keys[2], num_classes=graph.num_classes,
          train_fraction=config.train_fraction, val_fraction=config.val_fraction,
          epochs=config.probe_epochs, learning_rate=config.probe_learning_rate,
          eval_every_epochs=config.probe_eval_every_epochs)
      return {"dataset": graph.name, "f1_micro": scores["f1_micro"],
              "f1_macro": scores["f1_macro"], "val_f1_micro": scores["val_f1_micro"],
              "probe_best_epoch": scores["best_epoch"], "epochs": config.epochs}

    return sweep.Trainable(
        state, make_train_step(config, model, loss, mesh),
        batches=lambda first: itertools.repeat(replicated, config.epochs - first),
        num_steps=config.epochs, result=result,
        options={"batch_sharded": False, "checkpoint_every": config.checkpoint_every},
        held_out=held_out_set(config, model, replicated, full))

  return sweep.train_run(config, run, workdir, build=trainable,
                         num_candidates=losses.num_candidates(graph.num_nodes, negatives="all"))


def plan_runs(config) -> list[plan.Run]:
  """The (spec, seed) runs, seed-major (an interrupted sweep has as many seeds per spec).

  Raises:
    ConfigError: an empty or malformed `config.losses`, or seeds below 1.
  """
  return plan.plan(config, order=("seed", "spec"), example=report.EXAMPLE)


def check_config(config) -> None:
  """Every check of `config` that needs no data: the loss specs, each field's type and range.

  Raises:
    ConfigError: naming the first bad field.
  """
  plan.check_fields(
      config, positive=("epochs", "num_layers", "hidden_dim", "projection_hidden_dim",
                        "num_devices", "checkpoint_every", "log_every", "probe_epochs",
                        "probe_eval_every_epochs"),
      non_negative=("seed_offset",), positive_numbers=("learning_rate", "probe_learning_rate"),
      fractions=("edge_rate", "feature_rate"))
  if str(config.dataset).lower() not in planetoid.DATASETS:
    raise plan.ConfigError(f"config.dataset must be one of "
                           f"{', '.join(sorted(planetoid.DATASETS))}, got {config.dataset!r}.")
  if config.block_size is not None:
    plan.check_fields(config, positive=("block_size",))
  for field in ("train_fraction", "val_fraction"):
    if not 0 < config[field] < 1:
      raise plan.ConfigError(f"config.{field} must be in (0, 1), got {config[field]!r}.")
  if config.train_fraction + config.val_fraction >= 1:
    raise plan.ConfigError(
        f"config.train_fraction + config.val_fraction must be < 1 (the rest is the test split), "
        f"got {config.train_fraction} + {config.val_fraction}.")
  plan_runs(config)


def train_and_evaluate(config, workdir: str, *, command: str | None = None) -> list[dict]:
  """Trains every (spec, seed) run of `config` (`check_config` passed) not yet finished in
  `workdir`; rewrites the tables (recording `command`, default the one running) as runs end.

  Raises:
    ConfigError: a data folder without the Planetoid files, or a workdir made with another
      config: before any training.
  """
  runs = plan_runs(config)
  try:
    graph, batch = load_graph(config)
  except FileNotFoundError as error:
    raise plan.ConfigError(f"config.data_dir: {error}") from error
  command = tables.command_line() if command is None else command
  write_tables = tables.sweep_writer(workdir, config, columns=report.COLUMNS,
                                     markdown=report.results_markdown, command=command,
                                     plots={"f1_micro.png": report.plot})
  return sweep.sweep(config, workdir, runs=runs,
                     train_run=functools.partial(train_run, config, graph, batch,
                                                 workdir=workdir),
                     write_tables=write_tables)
