"""SimCLR (or SupCon) on an image dataset: the sweep of a config's runs, and its train step for
lowering. A run is one pretraining run of `experiments.framework.pretraining`, which MSC
pretrains its encoder with too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections

from experiments.framework import images, lowering, pretraining, sweep, tables
from experiments.simclr import report
from tfcl_jax import augment, losses
from tfcl_jax.training import state


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       command: str | None = None) -> list[dict]:
  """Trains every run of `config` (`check_config` passed) not yet finished in `workdir`, after
  `check_data`; writes `results.csv`, `results.md` (recording `command`, default the one
  running) and the plots (`report.write`). Returns the result rows in plan order."""
  command = tables.command_line() if command is None else command
  mesh = pretraining.make_mesh(config)
  runs = pretraining.plan_runs(config)
  pretraining.check_data(config, runs, mesh)
  trainer = pretraining.Trainer(config, mesh)
  run_dirs = [run.directory(workdir) for run in runs]
  return sweep.sweep(
      config, workdir, runs=runs, plan_fields=pretraining.PLAN_FIELDS,
      train_run=lambda run: trainer.train(run, workdir),
      write_tables=lambda results: report.write(
          results, workdir, config=config, command=command, run_dirs=run_dirs[:len(results)],
          figures=len(results) == len(runs)))


def abstract_step(config: ml_collections.ConfigDict, mesh, *, spec: str = "free"):
  """The run's jitted train step with abstract `(state, batch, key)` (`framework.lowering`):
  `config`'s encoder, views and batch size, no data."""
  info, recipe, view_size = images.views(config)
  model = pretraining.make_model(config)
  loss = losses.from_spec(spec, num_candidates=losses.num_candidates(
      config.batch_size, negatives=config.negatives))
  train_step = pretraining.make_train_step(config, model, loss, mesh, functools.partial(
      augment.two_views, recipe=recipe, out_size=view_size))

  def initial():
    view = jnp.zeros((2, *info.example_shape(view_size)), jnp.float32)
    variables = model.init(jax.random.key(0), view, train=False)
    return state.create_train_state(
        model_params=variables["params"],
        model_state=state.model_state(variables),
        loss_params=loss.params,
        tx=pretraining.make_optimizer(config, batch_size=config.batch_size, steps_per_epoch=10))

  batch = {"image": jax.ShapeDtypeStruct((config.batch_size, *info.example_shape()), jnp.uint8),
           "label": jax.ShapeDtypeStruct((config.batch_size,), jnp.int32)}
  return train_step.jitted, (jax.eval_shape(initial), batch, lowering.key())
