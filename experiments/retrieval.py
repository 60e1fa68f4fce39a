r"""Two-tower retrieval on MovieLens with each objective: fixed τ, learnable scale, free, sigmoid.

The towers (`tfcl_jax.models.towers`) embed users and movies; each batch of (user, movie)
interactions is scored with in-batch negatives by the objective its spec names
(`tfcl_jax.objectives.retrieval`: one-directional InfoNCE, CLIP's symmetric loss, SigLIP's
sigmoid loss, the tutorial's raw dot-product softmax, with or without the logQ correction).
After every epoch each test interaction's movie is ranked against every movie (exact;
`tfcl_jax.evaluation.ranking.rank_all`): top-k accuracy (TensorFlow Recommenders'
`FactorizedTopK`; Recall@k with one relevant item) and NDCG@10 of the last epoch are reported.

Run: python -m experiments.retrieval --config=experiments/configs/retrieval_ml100k.py \
  --workdir=DIR [--config.losses=free,clip:learnable=0.07:100 --config.seeds=3]

Writes DIR/results.csv (one row per (objective, seed)), DIR/results.md (metrics per objective,
free minus each objective paired by seed, the learnable scale's end values) and
DIR/retrieval.png (top-100 accuracy per objective; the learnable scale over training), rewritten
as each run ends. Rerunning continues the workdir (`experiments/runner.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import cli, runner, tables
from tfcl_jax import mappings, training
from tfcl_jax.data import interactions, movielens, movielens_features
from tfcl_jax.evaluation import ranking
from tfcl_jax.models import towers
from tfcl_jax.objectives import retrieval

KS = (1, 5, 10, 50, 100)
METRICS = (*(f"top@{k}" for k in KS), "ndcg@10")
RESULT_FIELDS = ("dataset", "mapping", "seed", *METRICS, "final_loss", "scale_start",
                 "scale_end", "scale_max", "epochs", "steps", "train_seconds",
                 "seconds_per_epoch")
PLAN_FIELDS = ("losses", "mappings", "seeds", "seed_offset")
SPLITS = ("random", "last")
EXAMPLE = "free,clip:learnable=0.07:100"
POPULARITY = "popularity"  # not trained: movies ranked by their count in the training pairs
# TensorFlow Recommenders' retrieval tutorial: test top-k accuracy printed by two executed
# copies of its page (dot-product softmax, ids only, 3 epochs; its shuffles are TensorFlow's).
TUTORIAL_PUBLISHED = {"top@1": (0.00105, 0.00100), "top@5": (0.00975, 0.00870),
                      "top@10": (0.02240, 0.02115), "top@50": (0.12480, 0.12180),
                      "top@100": (0.23250, 0.23340)}

ConfigError = runner.ConfigError
Run = runner.Run


@dataclasses.dataclass(frozen=True)
class Data:
  """Everything the runs share: the split, the feature tables, the evaluation inputs."""

  train: interactions.Pairs
  test: interactions.Pairs
  num_users: int
  num_items: int
  users: movielens_features.Encoded
  items: movielens_features.Encoded
  seen: np.ndarray | None  # [U, I] left out of the ranking, or None
  log_q: np.ndarray  # [I] log item frequency in the training pairs


def _features(config, field: str, allowed) -> list[str]:
  try:
    names = runner.split_list(config[field], name=field)
  except ValueError as error:
    raise ConfigError(str(error)) from error
  unknown = [name for name in names if name not in allowed]
  if unknown:
    raise ConfigError(f"config.{field}: unknown feature(s) {', '.join(unknown)}; expected "
                      f"names from {', '.join(allowed)}.")
  return names


def load_data(config) -> Data:
  """Reads the ratings (and the users and movies files the features need) and splits them.

  Raises:
    ConfigError: missing or malformed files (naming `config.data_dir`), unknown features
      (naming the field), a bad split, or fewer training pairs than one batch.
  """
  query_features = _features(config, "query_features", movielens_features.QUERY_FEATURES)
  candidate_features = _features(config, "candidate_features",
                                 movielens_features.CANDIDATE_FEATURES)
  if config.split not in SPLITS:
    raise ConfigError(f"config.split must be one of {', '.join(SPLITS)}, got {config.split!r}.")
  path = os.path.expanduser(config.data_dir)
  try:
    ratings = movielens.read_ratings(path)
    items = movielens_features.read_items(path) if (
        candidate_features != ["item_id"]) else None
    users = movielens_features.read_users(path) if query_features != ["user_id"] else None
  except (FileNotFoundError, ValueError) as error:
    raise ConfigError(f"config.data_dir: {error}") from error
  try:
    data = interactions.index(ratings, item_ids=None if items is None else items.ids)
  except ValueError as error:
    raise ConfigError(f"config.data_dir: {ratings.source} and {items.source}: {error}"
                      ) from error
  try:
    if config.split == "random":
      train, test = interactions.random_split(data, train_fraction=config.train_fraction,
                                              seed=config.split_seed)
    else:
      train, test = interactions.leave_last_out(data)
  except ValueError as error:
    raise ConfigError(f"config.train_fraction: {error}") from error
  if len(train) < config.batch_size:
    raise ConfigError(f"config.batch_size={config.batch_size} but the {config.split} split of "
                      f"{ratings.source} leaves only {len(train)} training pairs.")
  if users is None:
    users = movielens_features.Users(data.user_ids, *([np.zeros(0)] * 4), source="")
  if items is None:
    items = movielens_features.Items(data.item_ids, (), np.zeros(0, np.int64), (), source="")
  encoded_users = movielens_features.encode_users(users, query_features, ids=data.user_ids)
  encoded_items = movielens_features.encode_items(items, candidate_features, ids=data.item_ids,
                                                  min_word_count=config.min_word_count)
  seen = interactions.seen(train, num_users=data.num_users, num_items=data.num_items) if (
      config.exclude_seen) else None
  return Data(train, test, data.num_users, data.num_items, encoded_users, encoded_items, seen,
              interactions.log_item_frequency(train, num_items=data.num_items))


def _hidden(config) -> tuple[int, ...]:
  text = str(config.hidden).strip()
  try:
    sizes = tuple(int(size) for size in text.split(",") if size.strip()) if text else ()
  except ValueError:
    raise ConfigError(f"config.hidden must be a comma list of ints, got {text!r}.") from None
  if any(size < 1 for size in sizes):
    raise ConfigError(f"config.hidden sizes must be >= 1, got {text!r}.")
  return sizes


def make_model(config, data: Data) -> towers.TwoTower:
  def tower(encoded: movielens_features.Encoded) -> towers.Tower:
    return towers.Tower(vocab_sizes=encoded.vocab_sizes, categorical=tuple(encoded.categorical),
                        bags=tuple(encoded.bags), dim=config.dim, hidden=_hidden(config))

  return towers.TwoTower(tower(data.users), tower(data.items))


def tables_of(encoded: movielens_features.Encoded) -> dict[str, jax.Array]:
  return {name: jnp.asarray(x) for name, x in {**encoded.categorical, **encoded.bags}.items()}


def make_evaluator(model: towers.TwoTower, data: Data, *, cosine: bool):
  """`evaluate(model_params) -> {metric: float}` on the test pairs, against every item."""
  users, items = tables_of(data.users), tables_of(data.items)

  @jax.jit
  def ranks(params):
    q = model.apply({"params": params}, users, method=model.embed_queries)
    c = model.apply({"params": params}, items, method=model.embed_candidates)
    if cosine:  # the losses score cosines; any map of them is monotone
      q, c = (x / jnp.maximum(jnp.linalg.norm(x, axis=1, keepdims=True), 1e-12) for x in (q, c))
    return ranking.rank_all(q, c, data.test.user, data.test.item, seen=data.seen)

  def evaluate(params) -> dict[str, float]:
    metrics = ranking.hit_ratio_and_ndcg(ranks(params), KS)
    out = {f"top@{k}": float(metrics[f"hr@{k}"]) for k in KS}
    out["ndcg@10"] = float(metrics["ndcg@10"])
    return out

  return evaluate


def _scale(mapping_params, spec: retrieval.RetrievalSpec) -> float:
  """The logit scale a learnable map applies (`min(exp(t), cap)`), NaN for other maps."""
  if "t" not in mapping_params:
    return float("nan")
  return float(mappings.logit_scale(spec.loss.mapping, params=mapping_params))


def popularity_row(config, data: Data, run: Run) -> dict:
  """The untrained reference: every user gets the movies by training popularity."""
  counts = np.bincount(data.train.item, minlength=data.num_items).astype(np.float32)
  ranks = ranking.rank_all(np.ones((data.num_users, 1), np.float32), counts[:, None],
                           data.test.user, data.test.item, seen=data.seen)
  metrics = ranking.hit_ratio_and_ndcg(ranks, KS)
  nan = float("nan")
  return {"dataset": config.dataset, "mapping": run.spec, "seed": run.seed,
          **{f"top@{k}": float(metrics[f"hr@{k}"]) for k in KS},
          "ndcg@10": float(metrics["ndcg@10"]), "final_loss": nan, "scale_start": nan,
          "scale_end": nan, "scale_max": nan, "epochs": 0, "steps": 0, "train_seconds": 0.0,
          "seconds_per_epoch": 0.0, **{f"scale@{e}": nan for e in range(1, config.epochs + 1)}}


def build(config, data: Data, spec: retrieval.RetrievalSpec, example: dict, key: jax.Array, *,
          mesh, num_steps: int):
  """`(model, initial train state, train step)` of one run, the model initialised on the
  batch `example`."""
  model = make_model(config, data)
  users, items = tables_of(data.users), tables_of(data.items)
  params = model.init(key, retrieval.gather(users, example["user"]),
                      retrieval.gather(items, example["item"]))["params"]
  state = training.create_train_state(
      model_params=params, apply_fn=model.apply, mapping_params=spec.params,
      tx=training.make_optimizer(name=config.optimizer, learning_rate=config.learning_rate,
                                 total_steps=num_steps, schedule="constant",
                                 weight_decay=config.weight_decay))
  loss_fn = retrieval.make_retrieval_loss(model, spec, user_features=users,
                                          item_features=items, log_q=jnp.asarray(data.log_q),
                                          reduction=config.reduction)
  return model, state, training.make_train_step(loss_fn, mesh=mesh)


def run_one(config, data: Data, run: Run, *, workdir: str, progress: bool = True) -> dict:
  """Trains the towers for `run`, evaluates after every epoch; the row of the last epoch."""
  if run.spec == POPULARITY:
    return popularity_row(config, data, run)
  spec = retrieval.parse_spec(run.spec, num_candidates=config.batch_size)
  steps_per_epoch = -(-len(data.train) // config.batch_size)
  num_steps = config.epochs * steps_per_epoch
  init_key, train_key = jax.random.split(jax.random.key(run.seed))
  batches = functools.partial(interactions.batches, data.train, batch_size=config.batch_size,
                              seed=run.seed, num_steps=num_steps, reshuffle=config.reshuffle)
  mesh = training.make_mesh(jax.devices()[:config.num_devices])
  model, state, train_step = build(config, data, spec, next(batches(start=0)), init_key,
                                   mesh=mesh, num_steps=num_steps)
  evaluate = make_evaluator(model, data, cosine=spec.cosine)
  run_dir = run.directory(workdir)
  record = {k: v for k, v in config.to_dict().items() if k not in PLAN_FIELDS}
  scale_start = _scale(spec.params, spec)
  start = time.perf_counter()
  final = training.train(
      state, train_step=train_step,
      batches=lambda first: batches(start=first), num_steps=num_steps, workdir=run_dir,
      key=train_key, mesh=mesh, config={**run.record(), **record}, resume=True,
      checkpoint_every=steps_per_epoch, eval_every=steps_per_epoch,
      eval_fn=lambda s: {**evaluate(s.params["model"]),
                         "scale": _scale(jax.device_get(s.params["mapping"]), spec)},
      log_every=config.log_every,
      examples_per_step=config.batch_size, progress=progress, desc=run.label())
  seconds = time.perf_counter() - start
  history = training.loop.read_csv(os.path.join(run_dir, training.loop.METRICS_FILE))
  evals = tables.read_csv(os.path.join(run_dir, training.loop.EVAL_FILE))
  scale_end = _scale(final.params["mapping"], spec)
  scales = [scale_start, scale_end, *(float(row["scale"]) for row in evals)]
  if "mapping/t" in history:
    scales += [_scale({"t": t}, spec) for t in history["mapping/t"]]
  return {
      "dataset": config.dataset, "mapping": run.spec, "seed": run.seed,
      **{metric: float(evals[-1][metric]) for metric in METRICS},
      "final_loss": float(history["loss"][-1]), "scale_start": scale_start,
      "scale_end": scale_end, "scale_max": float(np.max(scales)),
      "epochs": config.epochs, "steps": num_steps, "train_seconds": round(seconds, 2),
      "seconds_per_epoch": round(seconds / config.epochs, 2),
      **{f"scale@{e + 1}": float(row["scale"]) for e, row in enumerate(evals)},
  }


def result_fields(config) -> tuple[str, ...]:
  """The CSV's columns: `RESULT_FIELDS`, then the scale after each epoch (`scale@<epoch>`)."""
  return (*RESULT_FIELDS, *(f"scale@{e}" for e in range(1, config.epochs + 1)))


# -- tables -----------------------------------------------------------------------------------


def reference(spec: str, present) -> str:
  """The free objective a spec is paired with: CLIP's and the sigmoid loss's against
  `clip:free`, corrected ones against `free+logq`, the others against `free`."""
  if spec.startswith(("clip:", "sigmoid/")) and "clip:free" in present:
    return "clip:free"
  if spec.endswith(retrieval.LOGQ_SUFFIX) and f"free{retrieval.LOGQ_SUFFIX}" in present:
    return f"free{retrieval.LOGQ_SUFFIX}"
  return "free"


def _cell(values, digits: int = 4) -> str:
  mean, std = tables.mean_std(values)
  return f"{mean:.{digits}f} ± {std:.{digits}f}" if np.isfinite(std) else f"{mean:.{digits}f}"


def table(rows: list[dict], specs: list[str], *, config, command: str) -> str:
  """Markdown: metrics per objective, the tutorial's published numbers, paired differences
  against each objective's free counterpart, and the learnable scales."""
  present = [spec for spec in specs if any(r["mapping"] == spec for r in rows)]
  of = lambda spec, key: [float(r[key]) for r in rows if r["mapping"] == spec]  # noqa: E731
  towers_text = (f"query features {config.query_features}; candidate features "
                 f"{config.candidate_features}; width {config.dim}"
                 + (f", hidden {config.hidden}" if str(config.hidden).strip() else ""))
  split = (f"random {config.train_fraction:g} split (seed {config.split_seed})"
           if config.split == "random" else "leave-last-out split")
  lines = [
      f"# Two-tower retrieval on {config.dataset}: top-k accuracy against every movie",
      "",
      f"Command: `{command}`",
      "",
      f"{split}; {towers_text}; {config.optimizer} {config.learning_rate:g}, batch "
      f"{config.batch_size}, {config.epochs} epochs, {config.reduction} reduction; test "
      "metrics after the last epoch, mean ± sample std over seeds; each test movie ranked "
      "against all movies"
      + (" except the user's training movies." if config.exclude_seen else "."),
      "",
      "| objective | top-10 | top-50 | top-100 | NDCG@10 | seeds | s / run |",
      "|---|---|---|---|---|---|---|",
  ]
  for spec in present:
    lines.append(f"| {spec} | " + " | ".join(_cell(of(spec, m)) for m in (
        "top@10", "top@50", "top@100", "ndcg@10"))
        + f" | {len(of(spec, 'seed'))} | {np.mean(of(spec, 'train_seconds')):.1f} |")
  if config.split == "random" and config.query_features == "user_id" and (
      config.candidate_features == "item_id"):
    lines += ["", "The tutorial's own test accuracy (its `dot` model; the range over two "
              "executed copies of its page, docs/retrieval.md): " + ", ".join(
                  f"{m.replace('@', '-')} {min(v):.5f}–{max(v):.5f}"
                  for m, v in TUTORIAL_PUBLISHED.items()) + "."]
  fixed = [s for s in present if s.startswith("tau=") and not s.endswith("+logq")]
  if fixed:
    best = max(fixed, key=lambda s: np.mean(of(s, "top@100")))
    lines += ["", f"Best fixed τ of the one-directional loss by mean top-100: `{best}`."]
  clip_fixed = [s for s in present if s.startswith("clip:tau=")]
  if clip_fixed:
    best = max(clip_fixed, key=lambda s: np.mean(of(s, "top@100")))
    lines += [f"Best fixed τ of CLIP's loss by mean top-100: `{best}`."]
  for ref in dict.fromkeys(reference(s, present) for s in present):
    if ref not in present:
      continue
    group = [ref] + [s for s in present if s != ref and reference(s, present) == ref]
    paired = {metric: {row["mapping"]: row for row in tables.paired_differences(
        rows, group, metric=metric, reference=ref, scale=100.0)}
              for metric in ("top@100", "top@10")}
    if not paired["top@100"]:
      continue
    lines += ["", f"`{ref}` minus each objective, in points of accuracy, paired by seed (same "
              "initialisation and batches): mean (s.e.), paired t-test p, seeds it wins.", "",
              "| objective | seeds | top-100 | p | wins | top-10 | p | wins |",
              "|---|---|---|---|---|---|---|---|"]
    for spec, row in paired["top@100"].items():
      cells = [f"{row['seeds']}"]
      for metric in ("top@100", "top@10"):
        d = paired[metric][spec]
        cells += [f"{d['mean']:+.2f} ({d['sem']:.2f})", f"{d['p_value']:.2g}",
                  f"{d['wins']}/{d['seeds']}"]
      lines.append(f"| {spec} | " + " | ".join(cells) + " |")
  learnable = [s for s in present if not math.isnan(np.mean(of(s, "scale_start")))]
  if learnable:
    lines += ["", "Learnable logit scale `exp(t)` (capped where the spec says): start, end "
              "and largest value over training, mean over seeds; runs that reached the cap.",
              "", "| objective | start | end | max | runs at the cap |", "|---|---|---|---|---|"]
    for spec in learnable:
      cap = retrieval.parse_spec(spec, num_candidates=2).loss.mapping.fn.max_scale
      at_cap = sum(v >= cap - 1e-6 for v in of(spec, "scale_max")) if cap else 0
      lines.append(f"| {spec} | {np.mean(of(spec, 'scale_start')):.2f} | "
                   f"{np.mean(of(spec, 'scale_end')):.2f} | {np.mean(of(spec, 'scale_max')):.2f}"
                   f" | {at_cap}/{len(of(spec, 'seed'))}" + (" (no cap)" if not cap else "")
                   + " |")
  return "\n".join(lines) + "\n"


def specs_of(config) -> list[str]:
  """The canonical objectives of `config.losses` (`retrieval.parse_spec`), each once;
  `popularity` names the untrained popularity ranking."""
  text = runner.renamed(config, "losses", "mappings")
  try:
    return list(dict.fromkeys(
        spec if spec == POPULARITY else
        retrieval.parse_spec(spec, num_candidates=config.batch_size).spec
        for spec in runner.split_list(text, name="losses")))
  except ValueError as error:
    raise ConfigError(f"config.losses: {error}") from error


def results_markdown(rows: list[dict], config, command: str) -> str:
  return table(rows, specs_of(config), config=config, command=command)


def write_plot(path: str, rows: list[dict], config) -> None:
  """Top-100 accuracy of every run per objective (left); the learnable scale's start, end
  and maximum per objective (right)."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  specs = [s for s in specs_of(config) if any(r["mapping"] == s for r in rows)]
  fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.5),
                                    gridspec_kw={"width_ratios": [3, 1]})
  for i, spec in enumerate(specs):
    values = np.array([float(r["top@100"]) for r in rows if r["mapping"] == spec])
    color = "C2" if "free" in spec else ("C1" if "learnable" in spec else "C0")
    left.scatter(np.full(values.size, i), values, s=10, alpha=0.5, color=color)
    left.errorbar(i, values.mean(), yerr=values.std(ddof=1) if values.size > 1 else 0,
                  fmt="o", color=color, capsize=3)
  left.set_xticks(range(len(specs)), specs, rotation=60, ha="right", fontsize=7)
  left.set_ylabel("test top-100 accuracy")
  learnable = [s for s in specs if any(r["mapping"] == s and not math.isnan(float(
      r["scale_start"])) for r in rows)]
  epochs = np.arange(0, config.epochs + 1)
  for i, spec in enumerate(learnable):
    runs = [r for r in rows if r["mapping"] == spec]
    curves = np.array([[float(r["scale_start"])] + [float(r[f"scale@{e}"]) for e in epochs[1:]]
                       for r in runs])
    for curve in curves:
      right.plot(epochs, curve, color=f"C{i}", alpha=0.25, lw=0.8)
    right.plot(epochs, curves.mean(axis=0), color=f"C{i}", lw=2, label=spec)
  right.axhline(100, color="grey", lw=0.8, ls="--")
  right.set_xlabel("epoch")
  right.set_ylabel("logit scale min(exp(t), cap)")
  right.set_yscale("log")
  if learnable:
    right.legend(fontsize=7)
  fig.suptitle(f"Two-tower retrieval on {config.dataset} ({config.split} split)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plan_runs(config) -> list[Run]:
  return runner.plan(config, order=("seed", "spec"), specs=specs_of(config), example=EXAMPLE,
                     positive_ints=("epochs", "batch_size", "dim", "num_devices", "log_every",
                                    "min_word_count"))


def check_config(config) -> None:
  """Every check of `config` that needs no data: the objectives, the features, each field's
  type and range.

  Raises:
    ConfigError: (a `ValueError`) naming the first bad field.
  """
  runner.check_fields(
      config, positive=("epochs", "batch_size", "dim", "num_devices", "log_every",
                        "min_word_count"),
      non_negative=("seed_offset", "split_seed"), positive_numbers=("learning_rate",),
      non_negative_numbers=("weight_decay",),
      choices={"split": SPLITS, "reduction": ("sum", "mean"),
               "optimizer": tuple(training.optim.OPTIMIZERS)})
  if not 0 < config.train_fraction < 1:
    raise ConfigError(f"config.train_fraction must be in (0, 1), got {config.train_fraction!r}.")
  _features(config, "query_features", movielens_features.QUERY_FEATURES)
  _features(config, "candidate_features", movielens_features.CANDIDATE_FEATURES)
  _hidden(config)
  plan_runs(config)


def run(config, workdir: str, *, command: str | None = None, progress: bool = True
        ) -> list[dict]:
  """Trains every (objective, seed) run not yet finished in `workdir`; rewrites the tables.

  Raises:
    ConfigError: (a `ValueError`) for a malformed config, missing or malformed data, unknown
      features, a batch larger than the training set, or a workdir made with another config:
      before any training.
  """
  check_config(config)
  runs = plan_runs(config)
  data = load_data(config)
  command = tables.command_line() if command is None else command
  write_tables = tables.sweep_writer(workdir, config, columns=result_fields(config),
                                     markdown=results_markdown, command=command,
                                     plots={"retrieval.png": write_plot})
  return runner.sweep(config, workdir, runs=runs, plan_fields=PLAN_FIELDS,
                      train_run=functools.partial(run_one, config, data, workdir=workdir,
                                                  progress=progress),
                      write_tables=write_tables, progress=progress)


if __name__ == "__main__":
  cli.run_main(run, user_errors=(ConfigError,),
               usage="pass --config=experiments/configs/retrieval_ml100k.py --workdir=DIR")
