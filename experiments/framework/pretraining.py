"""Contrastive pretraining of an image encoder, one run at a time: SimCLR, or SupCon with the
images' labels. `experiments.simclr` sweeps these runs; `experiments.msc` pretrains its encoder
with one.

`config.objective` chooses what the two views train: SimCLR (`"simclr"`), or SupCon with the
images' labels (`"supcon"`) on the labelled training split (`training_split`), in the form
`config.form` (`"supcon"`: Khosla et al.'s `L_out`; `"ntxent"`: each positive pair against
the anchor's negatives only), which SimCLR ignores.

A run is one (loss spec, seed, batch size) (`plan.Run` with a `batch_size` axis); `plan_runs`
lists a config's runs, `check_config` checks the config without data, `check_data` what the
data and devices decide, and `Trainer.train` trains one run with `tfcl_jax.training` (its
metrics, checkpoints and `eval.csv` in the run's directory) and returns its results row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.framework import held_out, plan, sweep
from experiments.framework.images import load_images
from tfcl_jax import augment, data, losses, models
from tfcl_jax.analysis import geometry
from tfcl_jax.evaluation import knn, logistic
from tfcl_jax.objectives import simclr
from tfcl_jax.training import optim, sharding, state, step

MODES = ("sweep", "n_sensitivity")
OBJECTIVES = ("simclr", "supcon")  # config.objective; config.form: `objectives.simclr.FORMS`
# The fields of the N-sensitivity mode's runs: they choose which runs exist, as `losses` does.
PLAN_FIELDS = ("n_losses", "n_batch_sizes")


def plan_runs(config: ml_collections.ConfigDict) -> list[plan.Run]:
  """The runs of `config.mode` (batch size, then spec, then seed): `config.losses` at
  `config.batch_size` (`"sweep"`), or `config.n_losses` at each of `config.n_batch_sizes`
  (`"n_sensitivity"`).

  Raises:
    ConfigError: a bad mode, loss spec, seed count or batch size, naming the field.
  """
  plan.check_fields(config, choices={"mode": MODES})
  if config.mode == "sweep":
    specs, batch_sizes = plan.parse_losses(config, example="free,tau=0.5"), [config.batch_size]
  else:
    specs = plan.parse_losses(config, example="free,tau=0.1", field="n_losses")
    try:
      batch_sizes = [int(b) for b in plan.split_list(config.n_batch_sizes, name="n_batch_sizes")]
    except ValueError as error:
      raise plan.ConfigError(f"config.n_batch_sizes must list ints: {error}") from error
  return plan.plan(config, order=("batch_size", "spec", "seed"),
                   axes={"batch_size": batch_sizes}, specs=specs)


def check_config(config: ml_collections.ConfigDict) -> None:
  """Every check of `config` that needs no data: each field's type and range, the dataset,
  recipe and backbone names, the loss specs and their fit with the objective.

  Raises:
    ConfigError: naming the first bad field.
  """
  plan.check_fields(
      config, positive=("epochs", "batch_size", "projection_hidden_dim", "projection_dim",
                        "knn_k", "log_every"),
      non_negative=("width", "view_size", "probe_epochs", "eval_every_epochs",
                    "checkpoint_every", "warmup_epochs", "num_devices"),
      positive_numbers=("learning_rate", "knn_tau"),
      non_negative_numbers=("momentum", "weight_decay"),
      choices={"mode": MODES, "objective": OBJECTIVES,
               "negatives": ("all", "cross"), "lr_scaling": ("linear", "none"),
               "optimizer": tuple(optim.OPTIMIZERS)})
  forms = simclr.FORMS if config.objective == "supcon" else ("",)
  if config.form not in forms:
    raise plan.ConfigError(
        f"config.form must be one of {', '.join(map(repr, forms))} with "
        f"config.objective={config.objective!r}, got {config.form!r}.")
  runs = plan_runs(config)
  with plan.config_errors():
    data.get_info(config.dataset)
    if config.recipe and config.recipe not in augment.RECIPES:
      raise ValueError(f"config.recipe: unknown recipe {config.recipe!r}; known: "
                       f"{sorted(augment.RECIPES)}")
    model = make_model(config)
  for run in runs:  # the objective's own checks (SupCon: an InfoNCE spec, negatives="all")
    assert run.loss is not None  # every run of the plan is a loss's
    loss = run.loss.build(losses.num_candidates(run["batch_size"], negatives=config.negatives))
    with plan.config_errors(f"config.objective={config.objective!r}: "):
      make_loss_fn(config, model, loss, augment_fn=None)


def check_data(config: ml_collections.ConfigDict, runs: list[plan.Run], mesh) -> None:
  """What the devices and the data decide: each batch size splits over `mesh`, and the
  dataset is prepared (an unprepared TFDS dataset stops here with how to prepare it).

  Raises:
    ConfigError: naming the field or the dataset.
  """
  info = data.get_info(config.dataset)
  with plan.config_errors():  # includes data.DatasetNotPreparedError
    for batch_size in sorted({run["batch_size"] for run in runs}):
      sharding.check_batch_size(batch_size, mesh, name="config.batch_size")
      data.steps_per_epoch(info.name, training_split(config),
                           batch_size=_host_batch(batch_size), data_dir=config.data_dir or None)


def make_mesh(config: ml_collections.ConfigDict):
  """The mesh of `config.num_devices` devices (0: all)."""
  return sharding.make_mesh(jax.devices()[:config.num_devices] if config.num_devices else None)


def training_split(config: ml_collections.ConfigDict) -> str:
  """The split the runs train on: the dataset's pretraining split for SimCLR (its unlabelled
  examples where it has them), its labelled training split for SupCon."""
  info = data.get_info(config.dataset)
  return info.pretrain_split if form(config) is None else info.train_split


def _host_batch(batch_size: int) -> int:
  return batch_size // jax.process_count()



def make_model(config: ml_collections.ConfigDict):
  """The config's encoder with its projection head (`models.ContrastiveModel`)."""
  return models.make_contrastive_model(
      config.backbone, width=config.width or None,
      projection_hidden_dim=config.projection_hidden_dim, projection_dim=config.projection_dim)


def make_optimizer(config: ml_collections.ConfigDict, *, batch_size: int, steps_per_epoch: int):
  """The config's optimiser for `batch_size` (linear learning-rate scaling if asked)."""
  scale = batch_size / 256 if config.lr_scaling == "linear" else 1.0
  total = config.epochs * steps_per_epoch
  return optim.make_optimizer(
      name=config.optimizer, learning_rate=config.learning_rate * scale, total_steps=total,
      warmup_steps=min(config.warmup_epochs * steps_per_epoch, total),
      momentum=config.momentum, weight_decay=config.weight_decay)


def make_train_step(config: ml_collections.ConfigDict, model, loss: losses.Loss, mesh,
                    augment_fn):
  """The sharded train step of `config.objective` (`make_loss_fn`,
  `training.make_train_step`)."""
  return step.make_train_step(make_loss_fn(config, model, loss, augment_fn), mesh=mesh)


def make_loss_fn(config: ml_collections.ConfigDict, model, loss: losses.Loss, augment_fn):
  """The `loss_fn` of `config.objective` (`objectives.simclr.make_simclr_loss`: SimCLR, or
  SupCon in `config.form`)."""
  return simclr.make_simclr_loss(model, loss=loss, augment=augment_fn,
                                 negatives=config.negatives, form=form(config))


def form(config: ml_collections.ConfigDict) -> str | None:
  """The `form` of `objectives.simclr.make_simclr_loss` for `config`: `config.form` for
  SupCon, None for SimCLR (which takes no labels, and `config.form` "")."""
  return config.form if config.objective == "supcon" else None



class Trainer:
  """What the runs of one config share: images, model, compiled steps and evaluation."""

  def __init__(self, config: ml_collections.ConfigDict, mesh):
    self.config, self.mesh = config, mesh
    self.images = load_images(config)
    self.model = make_model(config)
    dummy = self.images.dummy_batch()
    self.init = jax.jit(lambda key: self.model.init(key, dummy, train=False))
    self.feature_fn = simclr.make_feature_fn(self.model)
    self._steps: dict = {}
    self._optimizers: dict = {}

  def steps_per_epoch(self, batch_size: int) -> int:
    info = self.images.info
    return data.steps_per_epoch(info.name, training_split(self.config),
                                batch_size=_host_batch(batch_size), data_dir=self.images.data_dir)

  def optimizer(self, batch_size: int):
    # One optax object per batch size: the compiled step is reused across seeds only if the
    # state's (static) optimiser is the same object.
    if batch_size not in self._optimizers:
      self._optimizers[batch_size] = make_optimizer(
          self.config, batch_size=batch_size, steps_per_epoch=self.steps_per_epoch(batch_size))
    return self._optimizers[batch_size]

  def train_step(self, loss: losses.Loss):
    if loss.spec not in self._steps:
      self._steps[loss.spec] = make_train_step(self.config, self.model, loss, self.mesh,
                                               self.images.augment)
    return self._steps[loss.spec]

  def features(self, train_state, images):
    model_params = train_state.params["model"]
    return simclr.embed(self.feature_fn, model_params, train_state.model_state, images,
                        preprocess=self.images.center)

  def held_out_set(self, train_state) -> held_out.HeldOut:
    """The backbone features (those kNN reads) of the test split's views (`Images.held_out_set`)."""
    model_params, model_state = train_state.params["model"], train_state.model_state
    return self.images.held_out_set(
        lambda views: simclr.embed(self.feature_fn, model_params, model_state, views))

  def evaluate(self, train_state) -> dict[str, float]:
    """kNN top-1 on backbone features; alignment (two views) and uniformity of test features."""
    images = self.images
    train_features = self.features(train_state, images.train_images)
    test_features = self.features(train_state, images.test_images)
    top1 = knn.knn_top1(train_features, images.train_labels, test_features, images.test_labels,
                        num_classes=images.info.num_classes, k=self.config.knn_k,
                        tau=self.config.knn_tau)
    subset = images.test_images[:512]
    view1, view2 = images.augment(jax.random.key(0), subset)
    model_params, model_state = train_state.params["model"], train_state.model_state
    align = geometry.alignment(self.feature_fn(model_params, model_state, view1),
                               self.feature_fn(model_params, model_state, view2))
    return {"knn_top1": top1, "alignment": float(align),
            "uniformity": float(geometry.uniformity(test_features[:1024]))}

  def linear_probe(self, train_state, seed: int) -> float:
    """Top-1 of logistic regression (`tfcl_jax.evaluation.logistic`) on frozen features."""
    images = self.images
    features = jnp.concatenate([self.features(train_state, images.train_images),
                                self.features(train_state, images.test_images)])
    features = (features - features.mean(0)) / (features.std(0) + 1e-6)
    labels = jnp.concatenate([jnp.asarray(images.train_labels),
                              jnp.asarray(images.test_labels)])
    n_train = len(images.train_labels)
    classifier = logistic.fit_logistic_regression(
        features, labels, num_classes=images.info.num_classes,
        train_indices=jnp.arange(n_train), key=jax.random.key(seed),
        epochs=self.config.probe_epochs, learning_rate=0.01)
    predictions = logistic.predict(classifier, features[n_train:])
    return float(jnp.mean(predictions == labels[n_train:]))

  def train(self, run: plan.Run, workdir: str) -> dict:
    """Trains one (spec, seed, batch size) run in its own directory (`sweep.train_run`);
    returns its results."""
    c = self.config
    batch_size = run["batch_size"]
    steps_per_epoch = self.steps_per_epoch(batch_size)
    num_steps = c.epochs * steps_per_epoch

    def trainable(loss, keys, mesh) -> sweep.Trainable:
      del mesh  # the sweep's: the steps compile once per loss
      variables = self.init(keys[0])
      initial = state.create_train_state(
          model_params=variables["params"],
          model_state=state.model_state(variables),
          loss_params=loss.params, tx=self.optimizer(batch_size))

      def batches(start_step):
        return data.make_loader(self.images.info.name, training_split(c),
                                batch_size=_host_batch(batch_size), seed=run.seed,
                                num_epochs=c.epochs, data_dir=self.images.data_dir,
                                start_step=start_step)

      def result(trained: sweep.Trained) -> dict:
        evaluation = trained.evaluations
        row = {"batch_size": batch_size, "knn_top1": float(evaluation["knn_top1"][-1]),
               # the last epoch's mean: one step's loss is noisy
               "final_loss": float(np.mean(trained.metrics["loss"][-steps_per_epoch:])),
               "steps": num_steps,
               **{f"knn_top1@{int(step)}": float(value) for step, value in
                  zip(evaluation["step"], evaluation["knn_top1"], strict=True)}}
        if c.probe_epochs:
          row["linear_top1"] = self.linear_probe(trained.state, run.seed)
        return row

      return sweep.Trainable(
          initial, self.train_step(loss), batches, num_steps=num_steps, result=result,
          options={"checkpoint_every": c.checkpoint_every,
                   "eval_every": c.eval_every_epochs * steps_per_epoch, "eval_fn": self.evaluate,
                   "examples_per_step": batch_size}, held_out=self.held_out_set)

    return sweep.train_run(
        c, run, workdir, build=trainable, keys=2, mesh=self.mesh, plan_fields=PLAN_FIELDS,
        num_candidates=losses.num_candidates(batch_size, negatives=c.negatives))

