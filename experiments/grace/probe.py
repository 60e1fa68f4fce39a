r"""A finished GRACE sweep's encoders probed under other evaluation splits (PyGCL's `get_split`).

The paper's code evaluates with PyGCL's `get_split(train_ratio=0.1, test_ratio=0.8)`, whose
slicing trains the probe on 10 % of the nodes, validates on 80 % and tests on the last 10 %
(`evaluation.logistic.random_split`); `experiments.grace` tests on 80 % by default. Here every
finished run of a GRACE workdir is restored from its final checkpoint and its frozen embeddings
are probed (`logistic.lr_evaluate`) under each `--val_fractions` split, `--draws` times: draw 0
uses the run's own evaluation key (with the workdir's split it reproduces `result.json`, which
is checked), draw k > 0 folds k into it. Nothing is retrained.

Run: python -m experiments.grace.probe --workdir=DIR [--val_fractions 0.1 0.8] [--draws 5]

Writes DIR/probe_splits.csv (one row per run, split and draw) and DIR/probe_splits.md: per
split, F1-micro at draw 0 (mean and std over seeds, as a sweep reports it), the std over draws
within a run (the probe's own noise: its split and initialisation), and free minus each
loss paired by seed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import ml_collections

from experiments.framework import plan, sweep, tables
from experiments.grace import report, train
from tfcl_jax.evaluation import logistic
from tfcl_jax.models import gcn
from tfcl_jax.training import checkpoint, loop

#: The fields of a workdir's `config.json` that the probe reads.
CONFIG_FIELDS = ("dataset", "data_dir", "epochs", "learning_rate", "num_layers", "hidden_dim",
                 "projection_hidden_dim", "train_fraction", "val_fraction", "probe_epochs",
                 "probe_learning_rate", "probe_eval_every_epochs")
# The columns of a GRACE `results.csv` that the probe reads.
_RESULTS_READ = ("spec", "seed", "f1_micro")


def finished_runs(workdir: str) -> list[plan.Run]:
  """The finished runs of a GRACE workdir that kept a checkpoint (`sweep.finished_runs`),
  spec by spec in the order of its `results.csv`, then by seed."""
  path = os.path.join(workdir, "results.csv")
  if not os.path.exists(path):
    raise ValueError(f"--workdir {workdir!r} holds no results.csv: run experiments.grace first.")
  rows = tables.read_csv(path, columns=_RESULTS_READ)
  order = list(dict.fromkeys(row["spec"] for row in rows))
  runs = [run for run, _ in sweep.finished_runs(workdir)
          if os.path.isdir(os.path.join(run.directory(workdir), loop.CHECKPOINT_DIR))]
  return sorted(runs, key=lambda run: (order.index(run.spec) if run.spec in order
                                       else len(order), run.spec, run.seed))


def probe(config, graph, batch, run: plan.Run, *, workdir: str,
          val_fractions: list[float], draws: int) -> list[dict]:
  """`report.PROBE_COLUMNS` rows of one run: its final encoder probed under each split,
  `draws` times."""
  init_key, _, eval_key = train.run_keys(run.seed)
  model, template, full = train.build(config, graph, batch,
                                      train.parse_spec(run.spec, graph.num_nodes), init_key)
  manager = checkpoint.make_manager(os.path.join(run.directory(workdir), loop.CHECKPOINT_DIR))
  state = checkpoint.restore_latest(manager, template)
  if state is None or int(state.step) != config.epochs:
    raise ValueError(f"{run.directory(workdir)}: no checkpoint of the final epoch "
                     f"{config.epochs}")
  embeddings = model.apply({"params": state.params["model"]}, batch.features, full,
                           method=gcn.GRACE.embed)
  rows = []
  for val_fraction in val_fractions:
    test_nodes = len(logistic.random_split(graph.num_nodes, key=eval_key,
                                           train_fraction=config.train_fraction,
                                           val_fraction=val_fraction)[2])
    for draw in range(draws):
      scores = logistic.lr_evaluate(
          embeddings, graph.labels, key=eval_key if draw == 0 else jax.random.fold_in(
              eval_key, draw), num_classes=graph.num_classes,
          train_fraction=config.train_fraction, val_fraction=val_fraction,
          epochs=config.probe_epochs, learning_rate=config.probe_learning_rate,
          eval_every_epochs=config.probe_eval_every_epochs)
      rows.append({"dataset": graph.name, "spec": run.spec, "seed": run.seed,
                   "train_fraction": config.train_fraction, "val_fraction": val_fraction,
                   "test_nodes": test_nodes, "draw": draw, "f1_micro": scores["f1_micro"],
                   "f1_macro": scores["f1_macro"], "val_f1_micro": scores["val_f1_micro"]})
  return rows


def evaluate(workdir: str, *, val_fractions: list[float], draws: int,
             data_dir: str | None = None, command: str = "") -> list[dict]:
  """Probes every finished run of `workdir`; writes `probe_splits.{csv,md}` there."""
  if draws < 1:
    raise ValueError(f"--draws must be >= 1, got {draws}.")
  runs = finished_runs(workdir)
  if not runs:
    raise ValueError(f"--workdir {workdir!r}: no finished run has a checkpoint.")
  path = os.path.join(workdir, "config.json")
  with open(path) as f:
    config = ml_collections.ConfigDict(json.load(f))
  missing = [field for field in CONFIG_FIELDS if field not in config]
  if missing:
    raise ValueError(f"{path} records no {', '.join(missing)}: the workdir was made with "
                     "other GRACE config fields; run experiments.grace in a new workdir.")
  if data_dir is not None:
    config.data_dir = data_dir
  graph, batch = train.load_graph(config)
  rows = []
  for run in runs:
    rows += probe(config, graph, batch, run, workdir=workdir, val_fractions=val_fractions,
                  draws=draws)
  recorded = tables.typed(tables.read_csv(os.path.join(workdir, "results.csv"),
                                          columns=_RESULTS_READ))
  tables.write_results(workdir, rows, columns=report.PROBE_COLUMNS, name="probe_splits",
                       markdown=report.probe_markdown(rows, command=command, recorded=recorded,
                                                      val_fraction=config.val_fraction))
  return rows


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True, help="a workdir of experiments.grace")
  parser.add_argument("--val_fractions", type=float, nargs="+", default=[0.1, 0.8],
                      help="validation fractions (the test set is the rest after "
                           "the workdir's train_fraction); 0.8 is PyGCL's get_split")
  parser.add_argument("--draws", type=int, default=5, help="probe splits per run and fraction")
  parser.add_argument("--data_dir", default=None, help="default: the workdir's config")
  args = parser.parse_args(argv)
  try:
    evaluate(args.workdir, val_fractions=args.val_fractions, draws=args.draws,
             data_dir=args.data_dir, command=tables.command_line())
  except (ValueError, FileNotFoundError) as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
  print(f"wrote {os.path.join(args.workdir, 'probe_splits.md')}")


if __name__ == "__main__":
  main()
