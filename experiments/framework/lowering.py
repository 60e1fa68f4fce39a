"""Each experiment's own train step with abstract inputs, to lower or compile for another
platform without its data or device: what `tests/test_lowering.py` lowers for `cuda` and `tpu`
and `benchmarks/tpu_compile.py` compiles for a TPU from a CPU host.

Every function builds the step exactly as its experiment does (its config, model, objective,
optimiser, shardings and donation) on `mesh`, and returns `(jitted_step, (state, batch, key))`
with shapes only: `jitted_step.trace(*inputs).lower(lowering_platforms=(platform,))`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from experiments.framework import plan
from tfcl_jax import augment, losses, models
from tfcl_jax.training import state


def _shapes(tree):
  return jax.eval_shape(lambda: tree)


def _key():
  return jax.ShapeDtypeStruct((), jax.random.key(0).dtype)


def simclr(config, mesh, *, spec: str = "free"):
  """SimCLR (`experiments.simclr`) with `config`'s encoder, views and batch size."""
  from experiments.simclr import train as simclr_train  # noqa: PLC0415

  info, recipe, view_size = simclr_train.views(config)
  model = simclr_train.make_model(config)
  loss = losses.from_spec(spec, num_candidates=2 * config.batch_size - 1)
  train_step = simclr_train.make_train_step(
      config, model, loss, mesh, functools.partial(augment.two_views, recipe=recipe,
                                                   out_size=view_size))

  def initial():
    views = jnp.zeros((2, *info.example_shape(view_size)), jnp.float32)
    variables = model.init(jax.random.key(0), views, train=False)
    tx = simclr_train.make_optimizer(config, batch_size=config.batch_size, steps_per_epoch=10)
    return state.create_train_state(
        model_params=variables["params"],
        model_state={k: v for k, v in variables.items() if k != "params"},
        loss_params=loss.params, tx=tx)

  batch = {"image": jax.ShapeDtypeStruct((config.batch_size, *info.example_shape()), jnp.uint8),
           "label": jax.ShapeDtypeStruct((config.batch_size,), jnp.int32)}
  return train_step.jitted, (jax.eval_shape(initial), batch, _key())


def msc(config, mesh, *, spec: str = "free"):
  """MSC's fine-tuning step (`experiments.msc`) on `config`'s encoder."""
  from experiments.msc import train as msc_train  # noqa: PLC0415
  from experiments.simclr import train as simclr_train  # noqa: PLC0415
  from tfcl_jax.anomaly import msc as msc_lib  # noqa: PLC0415

  info, recipe, view_size = simclr_train.views(config)
  encoder = models.make_backbone(config.backbone, width=config.width or None)
  loss = losses.from_spec(spec, num_candidates=losses.num_candidates(config.batch_size,
                                                                     negatives="all"))
  train_step = msc_train.make_train_step(
      config, encoder, loss, mesh,
      functools.partial(augment.two_views, recipe=recipe, out_size=view_size))

  def initial():
    views = jnp.zeros((2, *info.example_shape(view_size)), jnp.float32)
    variables = encoder.init(jax.random.key(0), views, train=False)
    params = {"model": variables["params"], "loss": loss.params}
    model_state = {k: v for k, v in variables.items() if k != "params"}
    features = encoder.apply(variables, views, train=False)
    return state.create_train_state(
        model_params=variables["params"],
        model_state={**model_state, msc_lib.CENTER_KEY: msc_lib.center(features)},
        loss_params=loss.params,
        tx=msc_train.make_optimizer(config, params, total_steps=10))

  batch = {"image": jax.ShapeDtypeStruct((config.batch_size, *info.example_shape()), jnp.uint8)}
  return train_step.jitted, (jax.eval_shape(initial), batch, _key())


def grace(config, mesh, *, spec: str = "free"):
  """GRACE's full-graph step (`experiments.grace`) on `config`'s Planetoid graph (read from
  `config.data_dir`: its sizes and edges)."""
  from experiments.grace import train as grace_train  # noqa: PLC0415

  graph, batch = grace_train.load_graph(config)
  model, loss, initial, _ = grace_train.build(config, graph, batch, plan.Run(spec, 0))
  train_step = grace_train.make_train_step(config, model, loss, mesh)
  return train_step.jitted, (_shapes(initial), _shapes(batch), _key())


def dcrec(config, mesh, *, spec: str = "free", num_users: int = 943, num_items: int = 1682,
          ratings_per_user: int = 106, seed: int = 0):
  """DCRec's step (`experiments.dcrec`) on random interactions of the given sizes
  (default: MovieLens-100K's 943 users, 1,682 items, ~100,000 ratings)."""
  from experiments import dcrec as dcrec_experiment  # noqa: PLC0415
  from tfcl_jax.data import movielens, sequences  # noqa: PLC0415
  from tfcl_jax.objectives import dcrec as dcrec_objective  # noqa: PLC0415

  rng = np.random.default_rng(seed)
  users = np.repeat(np.arange(num_users), ratings_per_user)
  ratings = movielens.Ratings(user=users, item=rng.integers(0, num_items, users.size),
                              rating=np.ones(users.size, np.float32),
                              timestamp=np.arange(users.size), source="random")
  data = sequences.build_sequences(ratings, max_length=config.max_length)
  graphs = dcrec_objective.make_graphs(data, k=config.top_k, phase="train")
  model = dcrec_experiment.make_model(config, data)
  objective = losses.from_spec(spec, num_candidates=config.batch_size)
  train_step = dcrec_experiment.make_train_step(config, model, objective, graphs, mesh)
  example = next(dcrec_experiment.epoch_batches(data.train, batch_size=config.batch_size,
                                                seed=seed, start=0, num_steps=1))
  initial = jax.eval_shape(functools.partial(
      dcrec_experiment.initial_state, config, model, objective, example, num_steps=10),
      jax.random.key(0))
  return train_step.jitted, (initial, _shapes(example), _key())


# Vocabulary sizes (index 0 included) and bag lengths of MovieLens-100K's features.
_ML100K_VOCAB = {"age": 8, "gender": 3, "occupation": 22, "zip": 12, "year": 10, "title": 611,
                 "genres": 20}
_ML100K_BAGS = {"title": 10, "genres": 6}


def retrieval(config, mesh, *, spec: str = "free", num_users: int = 943, num_items: int = 1682,
              num_pairs: int = 80_000, seed: int = 0):
  """The two-tower retrieval step (`experiments.retrieval`) with `config`'s towers,
  objective and batch on random features of MovieLens-100K's sizes."""
  from experiments.retrieval import train as retrieval_experiment  # noqa: PLC0415
  from tfcl_jax.data import interactions, movielens_features  # noqa: PLC0415

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
  data = retrieval_experiment.Data(
      pairs, pairs, num_users, num_items, side(config.query_features, num_users),
      side(config.candidate_features, num_items), None, np.zeros(num_items, np.float32))
  example = next(interactions.batches(pairs, batch_size=config.batch_size, seed=seed, start=0,
                                      num_steps=1))
  loss = losses.from_spec(spec, num_candidates=config.batch_size)
  _, initial, train_step = retrieval_experiment.build(
      config, data, loss, example, jax.random.key(0), mesh=mesh, num_steps=10)
  return train_step.jitted, (_shapes(initial), _shapes(example), _key())
