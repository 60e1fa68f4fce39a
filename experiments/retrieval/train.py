"""Two-tower retrieval's data, towers, one run and the sweep (`experiments.retrieval`)."""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from experiments.framework import held_out, lowering, plan, sweep, tables
from experiments.retrieval import report
from tfcl_jax import losses, mappings, training
from tfcl_jax.data import interactions, movielens, movielens_features
from tfcl_jax.evaluation import ranking
from tfcl_jax.models import towers
from tfcl_jax.objectives import retrieval

SPLITS = ("random", "last")


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
  users_log_q: np.ndarray  # [U] log user frequency (the candidates of CLIP's movie -> user)


def _features(config, field: str, allowed) -> list[str]:
  names = plan.split_list(config[field], name=field)
  unknown = [name for name in names if name not in allowed]
  if unknown:
    raise plan.ConfigError(f"config.{field}: unknown feature(s) {', '.join(unknown)}; expected "
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
  plan.check_fields(config, choices={"split": SPLITS})
  path = os.path.expanduser(config.data_dir)
  try:
    ratings = movielens.read_ratings(path)
    items = movielens_features.read_items(path) if (
        candidate_features != ["item_id"]) else None
    users = movielens_features.read_users(path) if query_features != ["user_id"] else None
  except (FileNotFoundError, ValueError) as error:
    raise plan.ConfigError(f"config.data_dir: {error}") from error
  try:
    data = interactions.index(ratings, item_ids=None if items is None else items.ids)
  except ValueError as error:
    raise plan.ConfigError(f"config.data_dir: {ratings.source} and {items.source}: {error}"
                           ) from error
  try:
    if config.split == "random":
      train, test = interactions.random_split(data, train_fraction=config.train_fraction,
                                              seed=config.split_seed)
    else:
      train, test = interactions.leave_last_out(data)
  except ValueError as error:
    raise plan.ConfigError(f"config.train_fraction: {error}") from error
  if len(train) < config.batch_size:
    raise plan.ConfigError(f"config.batch_size={config.batch_size} but the {config.split} split "
                           f"of {ratings.source} leaves only {len(train)} training pairs.")
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
              interactions.log_item_frequency(train, num_items=data.num_items),
              interactions.log_user_frequency(train, num_users=data.num_users))


def _hidden_dims(config) -> tuple[int, ...]:
  text = str(config.hidden_dims).strip()
  try:
    sizes = tuple(int(size) for size in text.split(",") if size.strip()) if text else ()
  except ValueError:
    raise plan.ConfigError(f"config.hidden_dims must be a comma list of ints, got {text!r}."
                           ) from None
  if any(size < 1 for size in sizes):
    raise plan.ConfigError(f"config.hidden_dims must all be >= 1, got {text!r}.")
  return sizes


def make_model(config, data: Data) -> towers.TwoTower:
  def tower(encoded: movielens_features.Encoded) -> towers.Tower:
    return towers.Tower(vocab_sizes=encoded.vocab_sizes, categorical=tuple(encoded.categorical),
                        bags=tuple(encoded.bags), dim=config.dim,
                        hidden_dims=_hidden_dims(config))

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
    if cosine:  # the losses score cosines; any mapping of them is monotone
      q, c = (x / jnp.maximum(jnp.linalg.norm(x, axis=1, keepdims=True), 1e-12) for x in (q, c))
    return ranking.rank_all(q, c, data.test.user, data.test.item, seen=data.seen)

  def evaluate(params) -> dict[str, float]:
    metrics = ranking.hit_ratio_and_ndcg(ranks(params), report.KS)
    out = {f"top@{k}": float(metrics[f"hr@{k}"]) for k in report.KS}
    out["ndcg@10"] = float(metrics["ndcg@10"])
    return out

  return evaluate


def held_out_set(model: towers.TwoTower, data: Data):
  """`params -> held_out.HeldOut` of a run. The two towers have no augmentation and their
  held-out data are the test interactions the metric counts, so the scores read no held-out
  pair: the candidate tower's embeddings of the items (`held_out.subset` of them) and, as the
  two views, one training pair of each user (drawn with `held_out.VIEW_SEED`; distinct users,
  so that each item has one right user): the user's query embedding (first) and the item's
  candidate embedding (second). No LiDAR."""
  users, items = tables_of(data.users), tables_of(data.items)
  order = np.random.default_rng(held_out.VIEW_SEED).permutation(len(data.train))
  _, first = np.unique(data.train.user[order], return_index=True)
  pairs = order[np.sort(first)][held_out.subset(len(first))]
  pair_users, pair_items = data.train.user[pairs], data.train.item[pairs]
  catalogue = held_out.subset(data.num_items)

  @jax.jit
  def embed(params):
    q = model.apply({"params": params}, users, method=model.embed_queries)
    c = model.apply({"params": params}, items, method=model.embed_candidates)
    return c[catalogue], q[pair_users], c[pair_items]

  return lambda params: held_out.HeldOut(*embed(params))


def _scale(loss_params, loss: losses.Loss) -> float:
  """The logit scale a learnable mapping applies (`min(exp(t), cap)`), NaN for other mappings."""
  if "t" not in loss_params:
    return float("nan")
  return float(mappings.logit_scale(loss.mapping, params=loss_params))


def _solved_scales(metrics: dict[str, np.ndarray], steps_per_epoch: int, epochs: int
                   ) -> tuple[np.ndarray, float, float]:
  """`(per epoch, first, last)` of the scale a batch-scaled mapping solved (`loss/scale`, logged
  every `log_every` steps): per epoch the mean of its logged values, NaN where none was."""
  steps, solved = metrics["step"], metrics["loss/scale"]
  epoch = np.ceil(steps / steps_per_epoch).astype(int)
  per_epoch = np.array([np.mean(solved[epoch == e]) if np.any(epoch == e) else np.nan
                        for e in range(1, epochs + 1)])
  return per_epoch, float(solved[0]), float(solved[-1])


def popularity_row(config, data: Data, run: plan.Run) -> dict:
  """The untrained reference: every user gets the movies by training popularity."""
  counts = np.bincount(data.train.item, minlength=data.num_items).astype(np.float32)
  ranks = ranking.rank_all(np.ones((data.num_users, 1), np.float32), counts[:, None],
                           data.test.user, data.test.item, seen=data.seen)
  metrics = ranking.hit_ratio_and_ndcg(ranks, report.KS)
  nan = float("nan")
  return {"dataset": config.dataset, "spec": run.spec, "seed": run.seed,
          **{f"top@{k}": float(metrics[f"hr@{k}"]) for k in report.KS},
          "ndcg@10": float(metrics["ndcg@10"]), "final_loss": nan, "scale_start": nan,
          "scale_end": nan, "scale_max": nan, "epochs": 0, "steps": 0, "train_seconds": 0.0,
          "seconds_per_epoch": 0.0, **{f"scale@{e}": nan for e in range(1, config.epochs + 1)}}


def build(config, data: Data, loss: losses.Loss, example: dict, key: jax.Array, *,
          mesh, num_steps: int):
  """`(model, initial train state, train step)` of one run, the model initialised on the
  batch `example`."""
  model = make_model(config, data)
  users, items = tables_of(data.users), tables_of(data.items)
  params = model.init(key, retrieval.gather(users, example["user"]),
                      retrieval.gather(items, example["item"]))["params"]
  state = training.create_train_state(
      model_params=params, apply_fn=model.apply, loss_params=loss.params,
      tx=training.make_optimizer(name=config.optimizer, learning_rate=config.learning_rate,
                                 total_steps=num_steps, schedule="constant",
                                 weight_decay=config.weight_decay))
  loss_fn = retrieval.make_retrieval_loss(model, loss, user_features=users,
                                          item_features=items, log_q=jnp.asarray(data.log_q),
                                          users_log_q=jnp.asarray(data.users_log_q),
                                          reduction=config.reduction)
  return model, state, training.make_train_step(loss_fn, mesh=mesh)


# Vocabulary sizes (index 0 included) and bag lengths of MovieLens-100K's features.
_ML100K_VOCAB = {"age": 8, "gender": 3, "occupation": 22, "zip": 12, "year": 10, "title": 611,
                 "genres": 20}
_ML100K_BAGS = {"title": 10, "genres": 6}


def abstract_step(config, mesh, *, spec: str = "free", num_users: int = 943,
                  num_items: int = 1682, num_pairs: int = 80_000, seed: int = 0):
  """The step with abstract `(state, batch, key)` (`framework.lowering`): `config`'s towers,
  objective and batch on random features of MovieLens-100K's sizes."""
  rng = np.random.default_rng(seed)

  def side(features: str, rows: int) -> movielens_features.Encoded:
    categorical, bags, sizes = {}, {}, {}
    for name in features.split(","):
      size = rows + 1 if name.endswith("_id") else _ML100K_VOCAB[name]
      if name in _ML100K_BAGS:
        bags[name] = rng.integers(0, size, (rows, _ML100K_BAGS[name])).astype(np.int32)
      else:
        categorical[name] = rng.integers(0, size, rows).astype(np.int32)
      sizes[name] = size
    return movielens_features.Encoded(np.arange(rows), categorical, bags, sizes)

  pairs = interactions.Pairs(rng.integers(0, num_users, num_pairs).astype(np.int32),
                             rng.integers(0, num_items, num_pairs).astype(np.int32))
  data = Data(pairs, pairs, num_users, num_items, side(config.query_features, num_users),
              side(config.candidate_features, num_items), None, np.zeros(num_items, np.float32),
              np.zeros(num_users, np.float32))
  example = next(interactions.batches(pairs, batch_size=config.batch_size, seed=seed, start=0,
                                      num_steps=1))
  loss = losses.from_spec(spec, num_candidates=losses.num_candidates(config.batch_size,
                                                                     negatives="cross"))
  _, initial, train_step = build(config, data, loss, example, jax.random.key(0), mesh=mesh,
                                 num_steps=10)
  return train_step.jitted, (lowering.shapes(initial), lowering.shapes(example), lowering.key())


def train_run(config, data: Data, run: plan.Run, *, workdir: str) -> dict:
  """Trains the towers for `run` (`sweep.train_run`), evaluates after every epoch; the row of
  the last epoch."""
  if run.spec == report.POPULARITY:
    return popularity_row(config, data, run)
  steps_per_epoch = -(-len(data.train) // config.batch_size)
  num_steps = config.epochs * steps_per_epoch
  batches = functools.partial(interactions.batches, data.train, batch_size=config.batch_size,
                              seed=run.seed, num_steps=num_steps, reshuffle=config.reshuffle)

  def trainable(loss, keys, mesh) -> sweep.Trainable:
    model, state, train_step = build(config, data, loss, next(batches(start=0)), keys[0],
                                     mesh=mesh, num_steps=num_steps)
    evaluate = make_evaluator(model, data, cosine=loss.scores_cosines)
    held = held_out_set(model, data)
    scale_start = _scale(loss.params, loss)

    def learnt_scale(s) -> dict[str, float]:  # no column for a mapping without `t` (no NaNs)
      return {"scale": _scale(jax.device_get(s.params["loss"]), loss)} if "t" in loss.params else {}

    def result(trained: sweep.Trained) -> dict:
      evals = trained.evaluations
      scale_end = _scale(trained.state.params["loss"], loss)
      per_epoch = evals.get("scale", np.full(config.epochs, np.nan))  # learnable mappings only
      if mappings.batch_scaled(loss.mapping):  # the scales it solved, as logged: epoch means
        nonlocal scale_start
        per_epoch, scale_start, scale_end = _solved_scales(trained.metrics, steps_per_epoch,
                                                           config.epochs)
      scales = [scale_start, scale_end, *per_epoch]
      if "loss/t" in trained.metrics:
        scales += [_scale({"t": t}, loss) for t in trained.metrics["loss/t"]]
      return {
          "dataset": config.dataset, **{metric: float(evals[metric][-1])
                                        for metric in report.METRICS},
          "scale_start": scale_start, "scale_end": scale_end,
          "scale_max": float(np.max(scales)), "epochs": config.epochs, "steps": num_steps,
          "seconds_per_epoch": round(trained.seconds / config.epochs, 2),
          **{f"scale@{e + 1}": float(scale) for e, scale in enumerate(per_epoch)},
      }

    return sweep.Trainable(
        state, train_step, batches=lambda first: batches(start=first), num_steps=num_steps,
        result=result, options={
            "checkpoint_every": steps_per_epoch, "eval_every": steps_per_epoch,
            "eval_fn": lambda s: {**evaluate(s.params["model"]), **learnt_scale(s)},
            "examples_per_step": config.batch_size},
        held_out=lambda s: held(s.params["model"]))

  # The runs' keys were drawn as (initialisation, training): two.
  return sweep.train_run(config, run, workdir, build=trainable, keys=2,
                         num_candidates=losses.num_candidates(config.batch_size,
                                                              negatives="cross"))


def plan_runs(config) -> list[plan.Run]:
  """The (loss, seed) runs, seed-major (an interrupted sweep has as many seeds of each).

  Raises:
    ConfigError: an empty or malformed `config.losses`, or seeds below 1.
  """
  return plan.plan(config, order=("seed", "spec"), specs=plan.parse_losses(
      config, example=report.EXAMPLE, others=(report.POPULARITY,)))


def check_config(config) -> None:
  """Every check of `config` that needs no data: the losses, the features, each field's
  type and range.

  Raises:
    ConfigError: naming the first bad field.
  """
  plan.check_fields(
      config, positive=("epochs", "batch_size", "dim", "num_devices", "log_every",
                        "min_word_count"),
      non_negative=("seed_offset", "split_seed"), positive_numbers=("learning_rate",),
      non_negative_numbers=("weight_decay",),
      choices={"split": SPLITS, "reduction": ("sum", "mean"),
               "optimizer": tuple(training.optim.OPTIMIZERS)})
  if not 0 < config.train_fraction < 1:
    raise plan.ConfigError(f"config.train_fraction must be in (0, 1), got "
                           f"{config.train_fraction!r}.")
  _features(config, "query_features", movielens_features.QUERY_FEATURES)
  _features(config, "candidate_features", movielens_features.CANDIDATE_FEATURES)
  _hidden_dims(config)
  plan_runs(config)


def train_and_evaluate(config, workdir: str, *, command: str | None = None) -> list[dict]:
  """Trains every (loss, seed) run of `config` (`check_config` passed) not yet finished
  in `workdir`; rewrites the tables (recording `command`, default the one running) as runs
  end.

  Raises:
    ConfigError: missing or malformed data, a batch larger than the training set, or a
      workdir made with another config: before any training.
  """
  runs = plan_runs(config)
  data = load_data(config)
  command = tables.command_line() if command is None else command
  write_tables = tables.sweep_writer(workdir, config, columns=report.columns(config),
                                     markdown=report.results_markdown, command=command,
                                     plots={"retrieval.png": report.write_plot})
  return sweep.sweep(config, workdir, runs=runs,
                     train_run=functools.partial(train_run, config, data, workdir=workdir),
                     write_tables=write_tables)
