r"""GRACE on CiteSeer / Cora with each similarity-to-logit map: the paper's Table 3 (Section 5.2).

PyGCL's GRACE recipe: 2-layer GCN (32, ReLU), projection fc-ELU-fc (32), two views with
EdgeRemoving(0.3) + FeatureMasking(0.3), InfoNCE with intra- and inter-view negatives
(`info_nce(negatives="all")`), full-batch Adam lr 0.01 for 1000 epochs; then PyGCL's
LREvaluator on the frozen embeddings (`evaluation.logistic.lr_evaluate`).

Run: python -m experiments.grace --config=experiments/configs/grace_citeseer.py --workdir=DIR
  [--config.mappings=free,tau=0.5 --config.seeds=20 --config.epochs=1000]

`config.mappings` lists loss specs (`tfcl_jax.losses.from_spec`): a mapping spec trains with
InfoNCE, `sigmoid/<mapping>[/b=<init> | /learn_b=<init>]` with the sigmoid loss (SigLIP:
`sigmoid/learnable=0.1/learn_b=siglip`).

Writes DIR/results.csv (one row per (mapping, seed), appended as each run ends: an interrupted
run resumes where it stopped), DIR/results.md (Table 3 beside the paper) and DIR/f1_micro.png.
"""

from __future__ import annotations

import csv
import itertools
import os
import re
import time

import jax
import numpy as np
import tqdm

from experiments import cli
from tfcl_jax import losses, training
from tfcl_jax.data import planetoid
from tfcl_jax.evaluation import logistic
from tfcl_jax.models import gcn
from tfcl_jax.objectives import grace as grace_objective

RESULT_FIELDS = ("dataset", "mapping", "seed", "f1_micro", "f1_macro", "val_f1_micro",
                 "best_epoch", "final_loss", "final_t", "train_seconds", "epochs", "final_b")

# Table 3 (CiteSeer, 20 runs): F1-micro (std), F1-macro (std), in %.
PAPER_TABLE3 = {
    "tau=0.1": (58.94, 3.17, 53.41, 2.72),
    "tau=0.25": (62.50, 2.92, 56.73, 2.87),
    "tau=0.5": (67.33, 3.02, 60.47, 2.82),
    "tau=1": (67.05, 3.02, 60.03, 2.47),
    "free": (67.95, 2.10, 60.56, 2.09),
}


def parse_spec(spec: str, num_nodes: int) -> losses.LossSpec:
  """`losses.from_spec` for GRACE's loss: `2 * num_nodes - 1` candidates per anchor."""
  return losses.from_spec(spec, num_candidates=2 * num_nodes - 1)


def load_graph(config) -> tuple[planetoid.PlanetoidGraph, grace_objective.GraphBatch]:
  graph = planetoid.load_planetoid(config.dataset, root=config.data_dir)
  batch = grace_objective.GraphBatch(gcn.sparse_features(graph.features),
                                     jax.numpy.asarray(graph.edge_index))
  return graph, batch


def run_one(config, graph: planetoid.PlanetoidGraph, batch: grace_objective.GraphBatch, spec: str,
            seed: int, *, workdir: str, progress: bool = True) -> dict:
  """Trains GRACE with mapping `spec` and `seed` (`tfcl_jax.training`), evaluates it.

  The run's `metrics.csv` and checkpoints go to `workdir/runs/<spec>_seed<seed>/`; a killed run
  resumes from its last checkpoint. Returns a results row.
  """
  objective = parse_spec(spec, graph.num_nodes)
  model = gcn.GRACE(hidden_dims=(config.hidden_dim,) * config.num_layers,
                    projection_dim=config.projection_dim)
  init_key, train_key, eval_key = jax.random.split(jax.random.key(seed), 3)
  full = gcn.gcn_normalize(batch.edge_index, num_nodes=graph.num_nodes)
  state = training.create_train_state(
      model_params=model.init(init_key, batch.features, full)["params"],
      tx=training.make_optimizer(name="adam", learning_rate=config.learning_rate,
                                 total_steps=config.epochs, schedule="constant"),
      apply_fn=model.apply, mapping_params=objective.params)
  # Full batch: the whole graph is one replicated batch; more devices would only repeat it.
  mesh = training.make_mesh(jax.devices()[:config.num_devices])
  loss_fn = grace_objective.make_grace_loss(model, objective, edge_rate=config.edge_rate,
                         feature_rate=config.feature_rate, block_size=config.block_size)
  train_step = training.make_train_step(loss_fn, mesh=mesh, batch_sharded=False)
  batch = training.sharding.shard_batch(batch, mesh, sharded=False)
  run_dir = os.path.join(workdir, "runs", re.sub(r"[^A-Za-z0-9.]+", "_", f"{spec}_seed{seed}"))
  start = time.perf_counter()
  state = training.train(
      state, train_step=train_step,
      batches=lambda first: itertools.repeat(batch, config.epochs - first),
      num_steps=config.epochs, workdir=run_dir, key=train_key, mesh=mesh,
      config={"spec": objective.spec, "seed": seed, **config.to_dict()}, resume=True,
      batch_sharded=False, checkpoint_every=config.checkpoint_every, log_every=config.log_every,
      progress=progress, desc=f"{objective.spec} seed {seed}")
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
      "dataset": graph.name, "mapping": objective.spec,
      "seed": seed, "f1_micro": scores["f1_micro"], "f1_macro": scores["f1_macro"],
      "val_f1_micro": scores["val_f1_micro"], "best_epoch": scores["best_epoch"],
      "final_loss": float(history[-1]) if len(history) else float("nan"),
      "final_t": float(t) if t is not None else "", "train_seconds": round(seconds, 2),
      "epochs": config.epochs, "final_b": float(b) if b is not None else "",
  }


def read_results(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def append_result(path: str, row: dict) -> None:
  """Appends `row`; a file written with fewer `RESULT_FIELDS` is first rewritten with all."""
  new = not os.path.exists(path)
  if not new:
    with open(path, newline="") as f:
      header = next(csv.reader(f), [])
    if tuple(header) != RESULT_FIELDS:
      if not set(header) <= set(RESULT_FIELDS):
        raise ValueError(f"{path} has columns {header}, not a subset of {RESULT_FIELDS}: "
                         "use a fresh workdir.")
      old = read_results(path)
      with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, RESULT_FIELDS, restval="")
        writer.writeheader()
        writer.writerows(old)
  with open(path, "a", newline="") as f:
    writer = csv.DictWriter(f, RESULT_FIELDS)
    if new:
      writer.writeheader()
    writer.writerow(row)


def summarize(rows: list[dict], specs: list[str]) -> list[dict]:
  """Mean and std (in %) of F1 per mapping, in `specs` order, with the paper's numbers."""
  table = []
  for spec in specs:
    runs = [r for r in rows if r["mapping"] == spec]
    if not runs:
      continue
    micro = 100 * np.array([float(r["f1_micro"]) for r in runs])
    macro = 100 * np.array([float(r["f1_macro"]) for r in runs])
    std = (lambda a: float(a.std(ddof=1)) if len(a) > 1 else float("nan"))
    table.append({"mapping": spec, "runs": len(runs), "micro": float(micro.mean()),
                  "micro_std": std(micro), "macro": float(macro.mean()), "macro_std": std(macro),
                  "paper": PAPER_TABLE3.get(spec)})
  return table


def paired_differences(rows: list[dict], specs: list[str], *,
                       reference: str = "free") -> list[dict]:
  """`reference` minus each other mapping in F1-micro (points), paired by seed.

  A seed fixes the initialisation, the views' keys and the evaluation split for every
  mapping, so per-seed differences cancel the split's noise. Returns, per mapping in `specs`
  order (not `reference`): the shared seeds, the mean difference, its standard error, the
  two-sided paired t-test p-value (`scipy.stats.ttest_rel`; NaN below 2 seeds) and how many
  seeds `reference` won.
  """
  from scipy import stats  # noqa: PLC0415

  by_spec = {spec: {int(r["seed"]): 100 * float(r["f1_micro"]) for r in rows
                    if r["mapping"] == spec} for spec in specs}
  base = by_spec.get(reference, {})
  table = []
  for spec in specs:
    seeds = sorted(set(base) & set(by_spec[spec]))
    if spec == reference or not seeds:
      continue
    ours, theirs = np.array([base[s] for s in seeds]), np.array([by_spec[spec][s] for s in seeds])
    diffs = ours - theirs
    many = len(seeds) > 1
    table.append({"mapping": spec, "seeds": len(seeds), "mean": float(diffs.mean()),
                  "sem": float(diffs.std(ddof=1) / np.sqrt(len(seeds))) if many else float("nan"),
                  "p_value": float(stats.ttest_rel(ours, theirs).pvalue) if many
                  else float("nan"),
                  "wins": int(np.sum(diffs > 0))})
  return table


def _cell(mean, std):
  return f"{mean:.2f} ({std:.2f})" if np.isfinite(std) else f"{mean:.2f} (n=1)"


def write_markdown(path: str, table: list[dict], *, dataset: str, command: str, epochs: int,
                   paired: list[dict] = ()):
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
    paper_micro = _cell(paper[0], paper[1]) if paper and dataset == "citeseer" else "-"
    paper_macro = _cell(paper[2], paper[3]) if paper and dataset == "citeseer" else "-"
    lines.append(f"| {row['mapping']} | {row['runs']} | {_cell(row['micro'], row['micro_std'])} | "
                 f"{paper_micro} | {_cell(row['macro'], row['macro_std'])} | {paper_macro} |")
  if paired:
    lines += ["", "free minus each mapping, F1-micro points, paired by seed (same init, views and "
              "split):", "", "| mapping | seeds | free − mapping (s.e.) | paired t-test p "
              "| seeds free wins |", "|---|---|---|---|---|"]
    for row in paired:
      lines.append(f"| {row['mapping']} | {row['seeds']} | {row['mean']:+.2f} ({row['sem']:.2f}) "
                   f"| {row['p_value']:.2g} | {row['wins']}/{row['seeds']} |")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def write_plot(path: str, rows: list[dict], table: list[dict], *, dataset: str):
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

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


ConfigError = cli.ConfigError


def run(config, workdir: str, *, command: str = "", progress: bool = True) -> list[dict]:
  """Runs every (seed, mapping) not yet in `workdir/results.csv`; rewrites the tables.

  Raises:
    ConfigError: (a `ValueError`) for an empty or malformed `config.mappings`, seeds or epochs
      below 1, or a data folder without the Planetoid files: before any training.
  """
  specs = [s.strip() for s in str(config.mappings).split(",") if s.strip()]
  if not specs:
    raise ConfigError(f"config.mappings must list at least one loss spec, got "
                      f"{config.mappings!r} (e.g. --config.mappings=free,tau=0.5).")
  try:
    for spec in specs:
      parse_spec(spec, 2)  # fail before any training on a bad spec
  except ValueError as error:
    raise ConfigError(f"config.mappings: {error}") from error
  if config.seeds < 1 or config.epochs < 1:
    raise ConfigError(f"config.seeds and config.epochs must be >= 1, got {config.seeds}, "
                      f"{config.epochs}.")
  try:
    graph, batch = load_graph(config)
  except FileNotFoundError as error:
    raise ConfigError(f"config.data_dir: {error}") from error
  os.makedirs(workdir, exist_ok=True)
  csv_path = os.path.join(workdir, "results.csv")
  done = {(r["mapping"], int(r["seed"]), int(r["epochs"])) for r in read_results(csv_path)}
  # Seed-major order: an interrupted run has the same number of seeds for every mapping.
  todo = [(seed, spec) for seed in range(config.seed_offset, config.seed_offset + config.seeds)
          for spec in specs]
  for seed, spec in tqdm.tqdm(todo, desc="runs", disable=not progress):
    if (parse_spec(spec, graph.num_nodes).spec, seed, config.epochs) in done:
      continue
    append_result(csv_path, run_one(config, graph, batch, spec, seed, workdir=workdir,
                                    progress=progress))
    _write_tables(config, workdir, specs, command)
  _write_tables(config, workdir, specs, command)
  return read_results(csv_path)


def _write_tables(config, workdir, specs, command):
  rows = [r for r in read_results(os.path.join(workdir, "results.csv"))
          if int(r["epochs"]) == config.epochs]
  names = [parse_spec(s, 2).spec for s in specs]
  table = summarize(rows, names)
  write_markdown(os.path.join(workdir, "results.md"), table, dataset=config.dataset,
                 command=command, epochs=config.epochs, paired=paired_differences(rows, names))
  if table:
    write_plot(os.path.join(workdir, "f1_micro.png"), rows, table, dataset=config.dataset)


if __name__ == "__main__":
  import sys

  cli.run_main(
      lambda config, workdir: run(config, workdir,
                                  command="python -m experiments.grace " + " ".join(sys.argv[1:])),
      usage="pass --config=experiments/configs/grace_citeseer.py --workdir=DIR",
      user_errors=(ConfigError,))
