r"""GRACE on CiteSeer / Cora with each similarity-to-logit map: the paper's Table 3 (Section 5.2).

PyGCL's GRACE recipe: 2-layer GCN (32, ReLU), projection fc-ELU-fc (32), two views with
EdgeRemoving(0.3) + FeatureMasking(0.3), InfoNCE with intra- and inter-view negatives
(`info_nce(negatives="all")`), full-batch Adam lr 0.01 for 1000 epochs; then PyGCL's
LREvaluator on the frozen embeddings (`evaluation.logistic.lr_evaluate`).

Run: python -m experiments.grace --config=experiments/configs/grace_citeseer.py --workdir=DIR
  [--config.losses=free,tau=0.5 --config.seeds=20 --config.epochs=1000]

`config.losses` lists loss specs (`tfcl_jax.losses.from_spec`): a mapping spec trains with
InfoNCE, `sigmoid/<mapping>[/b=<init> | /learn_b=<init>]` with the sigmoid loss (SigLIP:
`sigmoid/learnable=0.1/learn_b=siglip`).

Writes DIR/results.csv (one row per (mapping, seed)), DIR/results.md (Table 3 beside the paper,
and free minus each mapping paired by seed) and DIR/f1_micro.png, rewritten as each run ends.
Rerunning the command continues the workdir (`experiments/runner.py`); more seeds or mappings
may be added, other fields are refused.
"""

from __future__ import annotations

import functools
import itertools
import os
import time

import jax
import numpy as np

from experiments import cli, runner, tables
from tfcl_jax import losses, training
from tfcl_jax.data import planetoid
from tfcl_jax.evaluation import logistic
from tfcl_jax.models import gcn
from tfcl_jax.objectives import grace as grace_objective

# `probe_best_epoch`: the linear probe's epoch with the best validation F1 (PyGCL's
# LREvaluator), not a training epoch of GRACE.
RESULT_FIELDS = ("dataset", "mapping", "seed", "f1_micro", "f1_macro", "val_f1_micro",
                 "probe_best_epoch", "final_loss", "final_t", "train_seconds", "epochs",
                 "final_b")

# Table 3 (CiteSeer, 20 runs): F1-micro (std), F1-macro (std), in %.
PAPER_TABLE3 = {
    "tau=0.1": (58.94, 3.17, 53.41, 2.72),
    "tau=0.25": (62.50, 2.92, 56.73, 2.87),
    "tau=0.5": (67.33, 3.02, 60.47, 2.82),
    "tau=1": (67.05, 3.02, 60.03, 2.47),
    "free": (67.95, 2.10, 60.56, 2.09),
}


def parse_spec(spec: str, num_nodes: int) -> losses.LossSpec:
  """`losses.from_spec` for GRACE's loss: every node's two views, `negatives="all"`."""
  return losses.from_spec(spec, num_candidates=losses.num_candidates(num_nodes, negatives="all"))


def load_graph(config) -> tuple[planetoid.PlanetoidGraph, grace_objective.GraphBatch]:
  graph = planetoid.load_planetoid(config.dataset, root=config.data_dir)
  batch = grace_objective.GraphBatch(gcn.sparse_features(graph.features),
                                     jax.numpy.asarray(graph.edge_index))
  return graph, batch


# Fields that only choose which runs exist: a workdir may be rerun with other values.
PLAN_FIELDS = ("losses", "mappings", "seeds", "seed_offset")
Run = runner.Run


def run_keys(seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The run's (initialisation, training, evaluation) keys: a seed fixes all three."""
  return tuple(jax.random.split(jax.random.key(seed), 3))


def build(config, graph: planetoid.PlanetoidGraph, batch: grace_objective.GraphBatch,
          run: Run) -> tuple[gcn.GRACE, losses.LossSpec, training.TrainState, gcn.Propagation]:
  """The run's model, loss, initial train state and full-graph propagation."""
  loss = parse_spec(run.spec, graph.num_nodes)
  model = gcn.GRACE(hidden_dims=(config.hidden_dim,) * config.num_layers,
                    projection_dim=config.projection_dim)
  full = gcn.gcn_normalize(batch.edge_index, num_nodes=graph.num_nodes)
  state = training.create_train_state(
      model_params=model.init(run_keys(run.seed)[0], batch.features, full)["params"],
      tx=training.make_optimizer(name="adam", learning_rate=config.learning_rate,
                                 total_steps=config.epochs, schedule="constant"),
      apply_fn=model.apply, mapping_params=loss.params)
  return model, loss, state, full


def make_train_step(config, model: gcn.GRACE, loss: losses.LossSpec, mesh):
  """GRACE's full-batch train step: the whole graph is one replicated batch."""
  loss_fn = grace_objective.make_grace_loss(model, loss, edge_rate=config.edge_rate,
                                            feature_rate=config.feature_rate,
                                            block_size=config.block_size)
  return training.make_train_step(loss_fn, mesh=mesh, batch_sharded=False)


def run_one(config, graph: planetoid.PlanetoidGraph, batch: grace_objective.GraphBatch,
            run: Run, *, workdir: str, progress: bool = True) -> dict:
  """Trains GRACE for `run` (`tfcl_jax.training`), evaluates it; returns its results row.

  The run's `metrics.csv` and checkpoints go to `run.directory(workdir)`; a killed run
  resumes from its last checkpoint.
  """
  model, loss, state, full = build(config, graph, batch, run)
  _, train_key, eval_key = run_keys(run.seed)
  # Full batch: the whole graph is one replicated batch; more devices would only repeat it.
  mesh = training.make_mesh(jax.devices()[:config.num_devices])
  train_step = make_train_step(config, model, loss, mesh)
  batch = training.sharding.shard_batch(batch, mesh, sharded=False)
  run_dir = run.directory(workdir)
  record = {k: v for k, v in config.to_dict().items() if k not in PLAN_FIELDS}
  start = time.perf_counter()
  state = training.train(
      state, train_step=train_step,
      batches=lambda first: itertools.repeat(batch, config.epochs - first),
      num_steps=config.epochs, workdir=run_dir, key=train_key, mesh=mesh,
      config={**run.record(), **record}, resume=True, batch_sharded=False,
      checkpoint_every=config.checkpoint_every, log_every=config.log_every, progress=progress,
      desc=run.label())
  seconds = time.perf_counter() - start
  history = training.loop.read_csv(os.path.join(run_dir, training.loop.METRICS_FILE))["loss"]
  params = state.params
  embeddings = model.apply({"params": params["model"]}, batch.features, full,
                           method=gcn.GRACE.embed)
  scores = logistic.lr_evaluate(
      embeddings, graph.labels, key=eval_key, num_classes=graph.num_classes,
      train_ratio=config.train_ratio, val_ratio=config.val_ratio, epochs=config.eval_epochs,
      learning_rate=config.eval_learning_rate, test_interval=config.eval_interval)
  t, b = params["mapping"].get("t"), params["mapping"].get("bias")
  return {
      "dataset": graph.name, "mapping": run.spec,
      "seed": run.seed, "f1_micro": scores["f1_micro"], "f1_macro": scores["f1_macro"],
      "val_f1_micro": scores["val_f1_micro"], "probe_best_epoch": scores["best_epoch"],
      "final_loss": float(history[-1]) if len(history) else float("nan"),
      "final_t": float(t) if t is not None else "", "train_seconds": round(seconds, 2),
      "epochs": config.epochs, "final_b": float(b) if b is not None else "",
  }


def summarize(rows: list[dict], specs: list[str]) -> list[dict]:
  """Mean and std (in %) of F1 per mapping, in `specs` order, with the paper's numbers."""
  table = []
  for spec in specs:
    runs = [r for r in rows if r["mapping"] == spec]
    if not runs:
      continue
    micro, micro_std = tables.mean_std([100 * float(r["f1_micro"]) for r in runs])
    macro, macro_std = tables.mean_std([100 * float(r["f1_macro"]) for r in runs])
    table.append({"mapping": spec, "runs": len(runs), "micro": micro, "micro_std": micro_std,
                  "macro": macro, "macro_std": macro_std, "paper": PAPER_TABLE3.get(spec)})
  return table


def cell(mean: float, std: float) -> str:
  """`mean (std)`, or `mean (n=1)` where one value has no std."""
  return f"{mean:.2f} ({std:.2f})" if np.isfinite(std) else f"{mean:.2f} (n=1)"


def table3(rows: list[dict], specs: list[str], *, dataset: str, command: str,
           epochs: int) -> str:
  """Markdown: F1 per mapping beside the paper's Table 3, and free minus each mapping paired
  by seed (`tables.paired_differences`)."""
  table = summarize(rows, specs)
  paired = tables.paired_differences(rows, specs, metric="f1_micro")
  lines = [
      f"# GRACE on {dataset}: F1 (%) of node classification, mean (std) over seeds",
      "",
      f"Command: `{command}`",
      "",
      f"{epochs} training epochs per run; PyGCL LREvaluator (10% train / 10% val / 80% test). "
      "Paper: Kim & Kim, arXiv 2501.17683, Table 3 (CiteSeer, 20 runs).",
      "",
      "| mapping | runs | F1-micro (ours) | F1-micro (paper) | F1-macro (ours) "
      "| F1-macro (paper) |",
      "|---|---|---|---|---|---|",
  ]
  for row in table:
    paper = row["paper"]
    paper_micro = cell(paper[0], paper[1]) if paper and dataset == "citeseer" else "-"
    paper_macro = cell(paper[2], paper[3]) if paper and dataset == "citeseer" else "-"
    lines.append(f"| {row['mapping']} | {row['runs']} | {cell(row['micro'], row['micro_std'])} | "
                 f"{paper_micro} | {cell(row['macro'], row['macro_std'])} | {paper_macro} |")
  lines += tables.paired_markdown(
      paired, caption="free minus each mapping, F1-micro points, paired by seed (same init, "
      "views and split):")
  return "\n".join(lines) + "\n"


def write_plot(path: str, rows: list[dict], specs: list[str], *, dataset: str) -> None:
  """Test F1-micro of every run per mapping, its mean and std, and the paper's Table 3."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  table = summarize(rows, specs)
  fig, ax = plt.subplots(figsize=(1.2 * len(table) + 2, 3.5))
  for i, row in enumerate(table):
    values = [100 * float(r["f1_micro"]) for r in rows if r["mapping"] == row["mapping"]]
    ax.scatter(np.full(len(values), i), values, s=12, alpha=0.6, color="C0",
               label="ours (runs)" if i == 0 else None)
    ax.errorbar(i, row["micro"], yerr=0 if row["runs"] < 2 else row["micro_std"], fmt="o",
                color="C0", capsize=4)
    if row["paper"] and dataset == "citeseer":
      ax.errorbar(i + 0.2, row["paper"][0], yerr=row["paper"][1], fmt="s", color="C3",
                  capsize=4, label="paper Table 3" if i == 0 else None)
  ax.set_xticks(range(len(table)), [row["mapping"] for row in table], rotation=20)
  ax.set_ylabel("test F1-micro (%)")
  ax.set_title(f"GRACE on {dataset}")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


ConfigError = runner.ConfigError


# What the sweep writes, and what `experiments.regenerate` rebuilds from `results.csv`.
results_markdown = tables.sweep_markdown(table3, example="free,tau=0.5")
plot = tables.sweep_plot(write_plot, example="free,tau=0.5")


def plan_runs(config) -> list[Run]:
  """The (spec, seed) runs, seed-major (an interrupted sweep has as many seeds per spec).

  Raises:
    ConfigError: (a `ValueError`) for an empty or malformed `config.losses`, or seeds or
      epochs below 1.
  """
  return runner.plan(config, order=("seed", "spec"), example="free,tau=0.5",
                     positive_ints=("epochs",))


def check_config(config) -> None:
  """Every check of `config` that needs no data: the loss specs, each field's type and range.

  Raises:
    ConfigError: (a `ValueError`) naming the first bad field.
  """
  runner.check_fields(
      config, positive=("epochs", "num_layers", "hidden_dim", "projection_dim", "num_devices",
                        "checkpoint_every", "eval_epochs", "eval_interval", "log_every"),
      non_negative=("seed_offset",), positive_numbers=("learning_rate", "eval_learning_rate"),
      fractions=("edge_rate", "feature_rate"))
  if str(config.dataset).lower() not in planetoid.DATASETS:
    raise ConfigError(f"config.dataset must be one of {', '.join(sorted(planetoid.DATASETS))}, "
                      f"got {config.dataset!r}.")
  if config.block_size is not None:
    runner.check_fields(config, positive=("block_size",))
  for field in ("train_ratio", "val_ratio"):
    if not 0 < config[field] < 1:
      raise ConfigError(f"config.{field} must be in (0, 1), got {config[field]!r}.")
  if config.train_ratio + config.val_ratio >= 1:
    raise ConfigError(f"config.train_ratio + config.val_ratio must be < 1 (the rest is the test "
                      f"split), got {config.train_ratio} + {config.val_ratio}.")
  plan_runs(config)


def run(config, workdir: str, *, command: str | None = None, progress: bool = True
        ) -> list[dict]:
  """Trains every (spec, seed) run not yet finished in `workdir`; rewrites the tables.

  Raises:
    ConfigError: (a `ValueError`) for an empty or malformed `config.losses`, seeds or epochs
      below 1, a data folder without the Planetoid files, or a workdir made with another
      config: before any training.
  """
  check_config(config)
  runs = plan_runs(config)
  try:
    graph, batch = load_graph(config)
  except FileNotFoundError as error:
    raise ConfigError(f"config.data_dir: {error}") from error
  command = tables.command_line() if command is None else command
  write_tables = tables.sweep_writer(workdir, config, columns=RESULT_FIELDS,
                                     markdown=results_markdown, command=command,
                                     plots={"f1_micro.png": plot})
  train = functools.partial(run_one, config, graph, batch, workdir=workdir, progress=progress)
  return runner.sweep(config, workdir, runs=runs, plan_fields=PLAN_FIELDS, train_run=train,
                      write_tables=write_tables, progress=progress)


if __name__ == "__main__":
  cli.run_main(run, usage="pass --config=experiments/configs/grace_citeseer.py --workdir=DIR",
               user_errors=(ConfigError,))
