r"""DCRec on MovieLens with each similarity-to-logit mapping: the paper's Table 6 (Section 5.4).

DCRec (Yang et al., WWW 2023) as in its reference code (`tfcl_jax.models.dcrec`,
`tfcl_jax.objectives.dcrec`): RecBole's leave-one-out sequences with prefix training targets
(`tfcl_jax.data.sequences`), the transition and co-interaction item graphs
(`tfcl_jax.data.item_graphs`), Adam, batches of 512 training examples (a fresh permutation per
epoch; the last partial batch of an epoch is dropped so that every step has one shape). The
mapping replaces DCRec's `cos / cl_temp` (0.8) in its cross-view contrastive term.

Evaluation as the reference (`pop100`, `tfcl_jax.evaluation.ranking`): each user's validation
and test target is ranked against 100 items drawn by popularity among those the user never
interacted with (one draw per seed, so every loss of a seed meets the same negatives), and
HR@k, NDCG@k (k = 1, 5, 10) are computed. Both splits are scored after every epoch; a run
reports the test metrics of the epoch with the best validation NDCG@10. The reference's
benchmark files hold only a training and a test split and its early stopping watches the test
split; selecting on the validation split is the unbiased version of the same rule.

Run: python -m experiments.dcrec --config=experiments/configs/dcrec_ml100k.py --workdir=DIR
  [--config.losses=tau=0.8,free --config.seeds=10 --config.epochs=20]

Writes DIR/results.csv (one row per (loss, seed)), DIR/results.md (Table 6's metrics per
loss beside the paper's ML-20M numbers, and free minus each loss paired by seed) and
DIR/ndcg.png, rewritten as each run ends. Rerunning the command continues the workdir
(`experiments.framework`); more seeds or losses may be added, other fields are refused.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import numpy as np

from experiments.framework import experiment, lowering, plan, sweep, tables
from tfcl_jax import losses, training
from tfcl_jax.data import movielens, sequences
from tfcl_jax.evaluation import ranking
from tfcl_jax.models import dcrec
from tfcl_jax.objectives import dcrec as dcrec_objective

KS = (1, 5, 10)
METRICS = tuple(f"{name}@{k}" for name in ("hr", "ndcg") for k in KS)
SELECT_METRIC = "ndcg@10"  # validation metric of the model selection
COLUMNS = ("dataset", "spec", "seed", *METRICS, "best_epoch", "valid_ndcg@10",
           "final_loss", "epochs", "steps", "train_seconds", "seconds_per_epoch")

# Table 6 (DCRec on MovieLens-20M, 10 seeds): metric -> (mean, std), τ = 0.8 and free.
PAPER_TABLE6 = {
    "tau=0.8": {"hr@1": (0.1336, 0.0012), "hr@5": (0.3719, 0.0010), "hr@10": (0.5191, 0.0008),
                "ndcg@1": (0.1336, 0.0012), "ndcg@5": (0.2556, 0.0007),
                "ndcg@10": (0.3031, 0.0008)},
    "free": {"hr@1": (0.1360, 0.0004), "hr@5": (0.3741, 0.0015), "hr@10": (0.5209, 0.0018),
             "ndcg@1": (0.1360, 0.0004), "ndcg@5": (0.2579, 0.0007),
             "ndcg@10": (0.3052, 0.0008)},
}
EXAMPLE = "tau=0.8,free"


def load_data(config) -> sequences.SequenceData:
  """The config's ratings file as leave-one-out sequences.

  Raises:
    ConfigError: no ratings file under `config.data_dir` (naming the download command), or a
      malformed file or too short a user (naming the file, line or option).
  """
  path = os.path.expanduser(config.data_dir)
  try:
    ratings = movielens.read_ratings(path)
  except (movielens.RatingsNotFoundError, ValueError) as error:
    raise plan.ConfigError(f"config.data_dir: {error}") from error
  try:
    return sequences.build_sequences(
        ratings, max_length=config.max_length,
        min_user_interactions=config.min_user_interactions or None,
        min_rating=None if config.min_rating is None else float(config.min_rating))
  except ValueError as error:
    raise plan.ConfigError(f"{error} (config.min_user_interactions, config.max_length)"
                           ) from error


@dataclasses.dataclass(frozen=True)
class EvaluationSet:
  """One split scored against sampled negatives: the target is candidate 0."""

  inputs: np.ndarray  # [M, L]
  lengths: np.ndarray  # [M]
  candidates: np.ndarray  # [M, 1 + num_negatives]


def evaluation_set(data: sequences.SequenceData, split: sequences.SequenceSplit, *, seed: int,
                   num_negatives: int) -> EvaluationSet:
  """`split`'s examples with `num_negatives` popularity-sampled negatives each (`pop100`)."""
  negatives = ranking.sample_popular_negatives(
      seed, users=split.users, user_items=data.user_items, item_counts=data.item_counts(),
      num_negatives=num_negatives)
  return EvaluationSet(split.inputs(), split.lengths,
                       np.concatenate([split.targets[:, None], negatives], axis=1))


def epoch_batches(split: sequences.SequenceSplit, *, batch_size: int, seed: int, start: int,
                  num_steps: int):
  """Training batches for steps `start + 1 … num_steps`: epoch `e` visits the examples in the
  order of `default_rng((seed, e))`, in `len(split) // batch_size` full batches."""
  steps_per_epoch = len(split) // batch_size
  for step in range(start, num_steps):
    epoch, position = divmod(step, steps_per_epoch)
    order = np.random.default_rng((seed, epoch)).permutation(len(split))
    index = np.sort(order[position * batch_size:(position + 1) * batch_size])
    yield {"users": split.users[index], "inputs": split.inputs(index),
           "lengths": split.lengths[index], "targets": split.targets[index]}


def make_evaluator(model: dcrec.DCRec, graphs: dcrec_objective.DCRecGraphs, *,
                   chunk: int = 2048):
  """`evaluate(params, EvaluationSet, key) -> {metric: float}` (HR@k, NDCG@k for `KS`); `key`
  draws the graph dropout the reference applies at evaluation too."""
  score = jax.jit(dcrec_objective.make_scorer(model, graphs))

  def evaluate(params, split: EvaluationSet, key) -> dict[str, float]:
    ranks = []
    for start in range(0, len(split.lengths), chunk):
      part = slice(start, start + chunk)
      scores = score(params, key, split.inputs[part], split.lengths[part],
                     split.candidates[part])
      ranks.append(np.asarray(ranking.target_rank(scores[:, 0], scores[:, 1:])))
    metrics = ranking.hit_ratio_and_ndcg(np.concatenate(ranks), KS)
    return {name: float(value) for name, value in metrics.items()}

  return evaluate


def best_epoch(evaluations: dict[str, np.ndarray], *, steps_per_epoch: int) -> dict:
  """The evaluation (`eval.csv` columns) with the highest validation NDCG@10, the earliest
  among ties: `{column: float}` and its `epoch`."""
  index = int(np.lexsort((evaluations["step"], -evaluations[f"valid_{SELECT_METRIC}"]))[0])
  best = {name: float(values[index]) for name, values in evaluations.items()}
  return {**best, "epoch": int(round(best["step"] / steps_per_epoch))}


def make_model(config, data: sequences.SequenceData) -> dcrec.DCRec:
  return dcrec.DCRec(
      num_nodes=data.num_items + 2, max_length=config.max_length,
      hidden_dim=config.hidden_dim, inner_size=config.inner_size,
      num_layers=config.num_layers, num_heads=config.num_heads,
      hidden_dropout=config.hidden_dropout, attention_dropout=config.attention_dropout,
      graph_dropout=config.graph_dropout, graph_dropout_at_eval=config.graph_dropout_at_eval)


def make_train_step(config, model: dcrec.DCRec, loss: losses.Loss,
                    graphs: dcrec_objective.DCRecGraphs, mesh):
  """DCRec's sharded train step on the training-phase `graphs`."""
  loss_fn = dcrec_objective.make_dcrec_loss(
      model, loss, graphs, cl_weight=config.cl_weight, kl_weight=config.kl_weight,
      weight_mean=config.weight_mean)
  return training.make_train_step(loss_fn, mesh=mesh)


def initial_state(config, model: dcrec.DCRec, loss: losses.Loss, example: dict,
                  key: jax.Array, *, num_steps: int) -> training.TrainState:
  """The run's train state, its model initialised on one batch `example`."""
  return training.create_train_state(
      model_params=model.init(key, example["inputs"], example["lengths"])["params"],
      tx=training.make_optimizer(name="adam", learning_rate=config.learning_rate,
                                 total_steps=num_steps, schedule="constant"),
      apply_fn=model.apply, loss_params=loss.params)


def abstract_step(config, mesh, *, spec: str = "free", num_users: int = 943,
                  num_items: int = 1682, ratings_per_user: int = 106, seed: int = 0):
  """The step with abstract `(state, batch, key)` (`framework.lowering`) on random
  interactions of the given sizes (default: MovieLens-100K's 943 users, 1,682 items, ~100,000
  ratings)."""
  rng = np.random.default_rng(seed)
  users = np.repeat(np.arange(num_users), ratings_per_user)
  ratings = movielens.Ratings(user=users, item=rng.integers(0, num_items, users.size),
                              rating=np.ones(users.size, np.float32),
                              timestamp=np.arange(users.size), source="random")
  data = sequences.build_sequences(ratings, max_length=config.max_length)
  graphs = dcrec_objective.make_graphs(data, k=config.top_k, phase="train")
  model = make_model(config, data)
  loss = losses.from_spec(spec, num_candidates=losses.num_candidates(config.batch_size,
                                                                     negatives="cross"))
  train_step = make_train_step(config, model, loss, graphs, mesh)
  example = next(epoch_batches(data.train, batch_size=config.batch_size, seed=seed, start=0,
                               num_steps=1))
  initial = jax.eval_shape(functools.partial(initial_state, config, model, loss, example,
                                             num_steps=10), jax.random.key(0))
  return train_step.jitted, (initial, lowering.shapes(example), lowering.key())


def train_run(config, data: sequences.SequenceData, graphs: dict, evaluators: dict,
              run: plan.Run, *, workdir: str) -> dict:
  """Trains DCRec for `run` (`sweep.train_run`), scores both splits after every epoch and
  returns the results row (test metrics at the best validation epoch).

  `evaluators`: `{"valid", "test"}` -> `make_evaluator(...)`, shared by every run.
  """
  steps_per_epoch = len(data.train) // config.batch_size
  num_steps = config.epochs * steps_per_epoch
  # Negatives are drawn once per seed: every loss of a seed meets the same candidates.
  splits = {name: evaluation_set(data, getattr(data, name), seed=run.seed,
                                 num_negatives=config.num_negatives)
            for name in ("valid", "test")}

  def trainable(loss, keys, mesh) -> sweep.Trainable:
    init_key, _, eval_key = keys
    model = make_model(config, data)
    example = next(epoch_batches(data.train, batch_size=config.batch_size, seed=run.seed,
                                 start=0, num_steps=1))

    def eval_fn(train_state):
      params = train_state.params["model"]  # stays on the device for the jitted scorer
      return {f"{name}_{metric}": value for name in ("valid", "test")
              for metric, value in evaluators[name](params, splits[name], eval_key).items()}

    def result(trained: sweep.Trained) -> dict:
      best = best_epoch(trained.evaluations, steps_per_epoch=steps_per_epoch)
      return {"dataset": config.dataset,
              **{metric: best[f"test_{metric}"] for metric in METRICS},
              "best_epoch": best["epoch"], f"valid_{SELECT_METRIC}": best[f"valid_{SELECT_METRIC}"],
              "epochs": config.epochs, "steps": num_steps,
              "seconds_per_epoch": round(trained.seconds / config.epochs, 2)}

    return sweep.Trainable(
        initial_state(config, model, loss, example, init_key, num_steps=num_steps),
        make_train_step(config, model, loss, graphs["train"], mesh),
        batches=lambda first: epoch_batches(data.train, batch_size=config.batch_size,
                                            seed=run.seed, start=first, num_steps=num_steps),
        num_steps=num_steps, result=result,
        options={"checkpoint_every": steps_per_epoch, "eval_every": steps_per_epoch,
                 "eval_fn": eval_fn, "examples_per_step": config.batch_size})

  # The cross-view term scores each sequence against the batch's other views ("cross").
  return sweep.train_run(config, run, workdir, build=trainable,
                         num_candidates=losses.num_candidates(config.batch_size,
                                                              negatives="cross"))


def _cell(values) -> str:
  mean, std = tables.mean_std(values)
  return f"{mean:.4f} ({std:.4f})" if np.isfinite(std) else f"{mean:.4f} (n=1)"


def table6(rows: list[dict], specs: list[str], *, dataset: str, command: str,
           epochs: int) -> str:
  """Markdown: the six metrics per loss beside the paper's Table 6 (ML-20M), and free minus
  each loss paired by seed (`tables.paired_differences`) for NDCG@10 and HR@10."""
  present = [spec for spec in specs if any(r["spec"] == spec for r in rows)]
  lines = [
      f"# DCRec on {dataset}: HR@k and NDCG@k, mean (std) over seeds",
      "",
      f"Command: `{command}`",
      "",
      f"{epochs} epochs per run; test metrics of the epoch with the best validation NDCG@10; "
      "each target ranked against 100 popularity-sampled negatives (`pop100`). Paper: Kim & "
      "Kim, arXiv 2501.17683, Table 6 (MovieLens-20M, 10 seeds, τ = 0.8 against free).",
      "",
      "| metric | " + " | ".join(f"{spec} (ours)" for spec in present)
      + " | τ = 0.8 (paper) | free (paper) |",
      "|---|" + "---|" * (len(present) + 2),
  ]
  for metric in METRICS:
    cells = [_cell([float(r[metric]) for r in rows if r["spec"] == spec]) for spec in present]
    paper = [f"{PAPER_TABLE6[name][metric][0]:.4f} ({PAPER_TABLE6[name][metric][1]:.4f})"
             for name in ("tau=0.8", "free")]
    lines.append(f"| {metric.upper()} | " + " | ".join(cells + paper)
                 + " |")
  runs = {spec: sum(r["spec"] == spec for r in rows) for spec in present}
  lines += ["", "Runs: " + ", ".join(f"{spec} {count}" for spec, count in runs.items()) + "."]
  for metric in ("ndcg@10", "hr@10"):
    lines += tables.paired_markdown(
        tables.paired_differences(rows, specs, metric=metric, scale=1.0), digits=4,
        caption=f"free minus each loss, {metric.upper()}, paired by seed (same init, "
        "batches and negatives):")
  return "\n".join(lines) + "\n"


def write_plot(file, rows: list[dict], specs: list[str], *, dataset: str) -> None:
  """Test NDCG@10 and HR@10 of every run per loss, with mean and std."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  present = [spec for spec in specs if any(r["spec"] == spec for r in rows)]
  fig, axes = plt.subplots(1, 2, figsize=(2.4 * len(present) + 2, 3.4))
  for ax, metric in zip(axes, ("ndcg@10", "hr@10"), strict=True):
    for i, spec in enumerate(present):
      values = np.array([float(r[metric]) for r in rows if r["spec"] == spec])
      ax.scatter(np.full(values.size, i), values, s=12, alpha=0.6, color="C0")
      ax.errorbar(i, values.mean(), yerr=values.std(ddof=1) if values.size > 1 else 0,
                  fmt="o", color="C0", capsize=4)
    ax.set_xticks(range(len(present)), present, rotation=20)
    ax.set_ylabel(f"test {metric.upper()}")
  fig.suptitle(f"DCRec on {dataset}")
  fig.tight_layout()
  fig.savefig(file, dpi=120)
  plt.close(fig)


# What the sweep writes, and what `experiments.regenerate` rebuilds from `results.csv`.
results_markdown = tables.sweep_markdown(table6, example=EXAMPLE)
plot = tables.sweep_plot(write_plot, example=EXAMPLE)


def check_config(config) -> None:
  """Every check of `config` that needs no data: the loss specs, each field's type and range.

  Raises:
    ConfigError: (a `ValueError`) naming the first bad field.
  """
  plan.check_fields(
      config, positive=("epochs", "batch_size", "max_length", "num_negatives", "top_k",
                        "hidden_dim", "inner_size", "num_layers", "num_heads", "num_devices",
                        "log_every"),
      non_negative=("seed_offset", "min_user_interactions"),
      positive_numbers=("learning_rate",), non_negative_numbers=("cl_weight", "kl_weight"),
      fractions=("hidden_dropout", "attention_dropout", "graph_dropout", "weight_mean"))
  if config.hidden_dim % config.num_heads:
    raise plan.ConfigError(f"config.hidden_dim={config.hidden_dim} must be a multiple of "
                           f"config.num_heads={config.num_heads}.")
  if config.min_rating is not None and not isinstance(config.min_rating, (int, float)):
    raise plan.ConfigTypeError(f"config.min_rating must be None or a number, got "
                               f"{config.min_rating!r}.")
  plan_runs(config)


def plan_runs(config) -> list[plan.Run]:
  """The (spec, seed) runs, seed-major (an interrupted sweep has as many seeds per spec).

  Raises:
    ConfigError: an empty or malformed `config.losses`, or seeds below 1.
  """
  return plan.plan(config, order=("seed", "spec"), example=EXAMPLE)


def train_and_evaluate(config, workdir: str, *, command: str | None = None) -> list[dict]:
  """Trains every (spec, seed) run of `config` (`check_config` passed) not yet finished in
  `workdir`; rewrites the tables (recording `command`, default the one running) as runs end.

  Raises:
    ConfigError: missing or malformed data, fewer training examples than one batch, more
      negatives or co-interaction neighbours (`top_k`) than the catalogue allows, or a
      workdir made with another config: before any training.
  """
  runs = plan_runs(config)
  data = load_data(config)
  if len(data.train) < config.batch_size:
    raise plan.ConfigError(f"config.batch_size={config.batch_size} but {config.data_dir} gives "
                           f"only {len(data.train)} training examples.")
  free_items = data.num_items - max(np.unique(data.user_items(u)).size
                                    for u in range(data.num_users))
  if config.num_negatives > free_items:
    raise plan.ConfigError(f"config.num_negatives={config.num_negatives} but a user of "
                           f"{config.data_dir} leaves only {free_items} of the {data.num_items} "
                           "items to draw negatives from.")
  try:
    graphs = {phase: dcrec_objective.make_graphs(data, k=config.top_k, phase=phase)
              for phase in ("train", "test")}
  except ValueError as error:
    raise plan.ConfigError(f"config.top_k={config.top_k}: {error}") from error
  # Each split is scored on graphs built without its targets: validation on the training
  # graphs, test on the test graphs (the reference's test phase).
  model = make_model(config, data)
  evaluators = {"valid": make_evaluator(model, graphs["train"]),
                "test": make_evaluator(model, graphs["test"])}
  command = tables.command_line() if command is None else command
  write_tables = tables.sweep_writer(workdir, config, columns=COLUMNS,
                                     markdown=results_markdown, command=command,
                                     plots={"ndcg.png": plot})
  return sweep.sweep(config, workdir, runs=runs,
                     train_run=functools.partial(train_run, config, data, graphs, evaluators,
                                                 workdir=workdir),
                     write_tables=write_tables)


EXPERIMENT = experiment.Experiment(
    name="dcrec", kind="sweep", train_and_evaluate=train_and_evaluate, check_config=check_config,
    configs=tuple(f"experiments/configs/dcrec_{name}.py" for name in ("ml100k", "ml1m", "ml20m")),
    results_markdown=results_markdown, abstract_step=abstract_step, reads_files=True)

if __name__ == "__main__":
  EXPERIMENT.main()
