"""MSC's runs: one normal class at a time, fine-tuned from a pretrained encoder; the sweep.

Without `config.init_checkpoint`, the encoder is first pretrained without labels with SimCLR
(`experiments.framework.pretraining`, in `DIR/pretrain`). Then per (loss, seed, normal class): the
center of the normal training features, MSC fine-tuning with `tfcl_jax.training` (BatchNorm in
inference mode, optional frozen modules), and the ROC-AUC of the kNN score on the test split.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.framework import images, lowering, plan, pretraining, sweep, tables
from experiments.msc import report
from tfcl_jax import augment, data, losses, models
from tfcl_jax.anomaly import msc, scores, weights
from tfcl_jax.objectives import msc as msc_objective
from tfcl_jax.objectives import simclr
from tfcl_jax.training import optim, sharding, state, step

PRETRAIN_DIR = "pretrain"
# The normal classes: they choose which runs exist, as `losses` does.
PLAN_FIELDS = ("classes",)
_PRETRAIN_FIELDS = ("dataset", "data_dir", "backbone", "width", "recipe", "view_size",
                    "num_devices", "progress", "resume")


def parse_classes(text, num_classes: int) -> list[int]:
  """`"all"` or a comma list of class indices in `[0, num_classes)`."""
  if str(text).strip() == "all":
    return list(range(num_classes))
  classes = []
  for item in plan.split_list(text, name="classes"):
    try:
      index = int(item)
    except ValueError:
      raise plan.ConfigError(f"config.classes must be 'all' or class indices, got {item!r}."
                             ) from None
    if not 0 <= index < num_classes:
      raise plan.ConfigError(
          f"config.classes: class {index} is out of range; the dataset has classes 0.."
          f"{num_classes - 1}.")
    classes.append(index)
  return list(dict.fromkeys(classes))


def plan_runs(config: ml_collections.ConfigDict) -> list[plan.Run]:
  """The (spec, normal class, seed) runs, after checking the specs (InfoNCE only: MSC's
  objective is its InfoNCE), seeds and classes.

  Raises:
    ConfigError: naming the field.
  """
  specs = plan.parse_losses(config, example="tau=0.25,free")
  with plan.config_errors("config.losses: "):
    candidates = losses.num_candidates(config.batch_size, negatives="all")
    pairwise = [parsed.spec for parsed in specs if not parsed.build(candidates).softmax]
  if pairwise:
    raise plan.ConfigError(f"config.losses: MSC fine-tunes with its InfoNCE loss (free, "
                           f"tau=0.25, ...), got {pairwise}.")
  with plan.config_errors():
    num_classes = data.get_info(config.dataset).num_classes
  classes = parse_classes(config.classes, num_classes)
  return plan.plan(config, order=("spec", "normal_class", "seed"),
                   axes={"normal_class": classes}, specs=specs)


def check_config(config: ml_collections.ConfigDict) -> None:
  """Every check of `config` that needs no data: each field's type and range, the losses,
  classes and backbone, and the pretraining config (SimCLR's `check_config`) when there is
  no `init_checkpoint`.

  Raises:
    ConfigError: naming the first bad field.
  """
  plan.check_fields(
      config, positive=("epochs", "batch_size", "knn_k", "log_every"),
      non_negative=("width", "view_size", "eval_every_epochs", "num_devices"),
      positive_numbers=("learning_rate",), non_negative_numbers=("momentum", "weight_decay"),
      choices={"optimizer": tuple(optim.OPTIMIZERS)})
  plan_runs(config)
  with plan.config_errors():
    models.make_backbone(config.backbone)
  if not config.init_checkpoint:
    pretrain = pretrain_config(config)
    with plan.config_errors("pretraining: "):
      pretraining.check_config(pretrain)


def _frozen(config) -> list[str]:
  return [name.strip() for name in str(config.frozen).split(",") if name.strip()]


def make_optimizer(config: ml_collections.ConfigDict, params, *, total_steps: int):
  """The config's fine-tuning optimiser, the `config.frozen` modules of `params` frozen."""
  tx = optim.make_optimizer(
      name=config.optimizer, learning_rate=config.learning_rate, total_steps=total_steps,
      schedule=config.schedule, momentum=config.momentum, weight_decay=config.weight_decay)
  return msc.freeze(tx, params, frozen=_frozen(config))


def make_train_step(config: ml_collections.ConfigDict, encoder, loss: losses.Loss, mesh,
                    augment_fn):
  """MSC's sharded fine-tuning step (`objectives.msc`, `training.make_train_step`)."""
  loss_fn = msc_objective.make_msc_loss(encoder, loss=loss, augment=augment_fn,
                                        angular=config.angular)
  return step.make_train_step(loss_fn, mesh=mesh)


class Trainer:
  """What the runs share: images, encoder, pretrained variables, optimiser, compiled steps."""

  def __init__(self, config: ml_collections.ConfigDict, mesh):
    self.config, self.mesh = config, mesh
    self.images = images.load_images(config)
    self.encoder = models.make_backbone(config.backbone, width=config.width or None)
    dummy = self.images.dummy_batch()
    self.template = jax.eval_shape(
        lambda: self.encoder.init(jax.random.key(0), dummy, train=False))
    self.feature_fn = jax.jit(
        lambda params, model_state, images: self.encoder.apply(
            {"params": params, **model_state}, images, train=False))
    self.variables = None
    self._steps: dict = {}
    self._tx = None
    self._pretrained_auc: dict[int, float] = {}
    self.max_steps = 1

  # -- checks ---------------------------------------------------------------------------------

  def check(self, runs: list[plan.Run]) -> None:
    """Class sizes, batch size, frozen names: everything the data and model decide."""
    c = self.config
    sharding.check_batch_size(c.batch_size, self.mesh, name="config.batch_size")
    host_batch = c.batch_size // jax.process_count()
    info = self.images.info
    for normal_class in sorted({run["normal_class"] for run in runs}):
      count = int(np.sum(self.images.train_labels == normal_class))
      # A cosine schedule spans the largest class's run (MSC's own schedule is constant).
      self.max_steps = max(self.max_steps, c.epochs * (count // jax.process_count() // host_batch))
      if count == 0:
        raise ValueError(f"normal class {normal_class} has no examples in "
                         f"{info.name}:{info.train_split}; nothing to fine-tune on.")
      if count < max(c.batch_size, c.knn_k):
        raise ValueError(
            f"normal class {normal_class} has {count} training examples, fewer than "
            f"config.batch_size = {c.batch_size} or config.knn_k = {c.knn_k}.")
      test_normal = int(np.sum(self.images.test_labels == normal_class))
      if test_normal in (0, len(self.images.test_labels)):
        raise ValueError(
            f"the test split {info.name}:{info.test_split} needs normal and anomalous "
            f"examples for ROC-AUC; class {normal_class} has {test_normal} of "
            f"{len(self.images.test_labels)}.")
    params = {"model": self.template["params"], "loss": {}}
    msc.freeze(optim.make_optimizer(name="sgd", learning_rate=1.0, total_steps=1), params,
               frozen=_frozen(c))

  def load(self, path: str) -> None:
    """The pretrained encoder variables (`CheckpointMismatchError` when they do not fit)."""
    submodule = self.config.init_submodule or None
    if self.config.init_submodule == "auto":
      try:
        self.variables = weights.load_variables(path, self.template, submodule="backbone")
        return
      except weights.CheckpointMismatchError as error:
        backbone_error = error  # maybe a bare-encoder checkpoint; try it whole below
      try:
        self.variables = weights.load_variables(path, self.template)
        return
      except weights.CheckpointMismatchError as error:
        raise weights.CheckpointMismatchError(
            f"as a SimCLR run's backbone: {backbone_error} || as a bare encoder: {error}"
        ) from None
    self.variables = weights.load_variables(path, self.template, submodule=submodule)

  # -- pieces of a run ------------------------------------------------------------------------

  def features(self, params, model_state, images, *, preprocess=True) -> jax.Array:
    """The encoder's features of `images` (their center views unless `preprocess` is False)."""
    model_state = {k: v for k, v in model_state.items() if k != msc.CENTER_KEY}
    return simclr.embed(self.feature_fn, params, model_state, images,
                        preprocess=self.images.center if preprocess else None)

  def held_out_set(self, train_state):
    """The encoder's features (those the kNN score reads) of the test split's views
    (`images.Images.held_out_set`), its labels unused."""
    params, model_state = train_state.params["model"], train_state.model_state
    return self.images.held_out_set(
        lambda views: self.features(params, model_state, views, preprocess=False))

  def roc_auc(self, params, model_state, normal_class: int) -> float:
    """ROC-AUC of the kNN score, anomalies (every other class) positive, MSC's evaluation."""
    normal = self.images.train_images[self.images.train_labels == normal_class]
    bank = self.features(params, model_state, normal)
    query = self.features(params, model_state, self.images.test_images)
    distance = scores.knn_score(bank, query, k=self.config.knn_k, squared=self.config.squared)
    return float(scores.roc_auc(self.images.test_labels != normal_class, distance))

  def pretrained_auc(self, normal_class: int) -> float:
    if normal_class not in self._pretrained_auc:
      model_state = state.model_state(self.variables)
      self._pretrained_auc[normal_class] = self.roc_auc(
          self.variables["params"], model_state, normal_class)
    return self._pretrained_auc[normal_class]

  def optimizer(self, params):
    # One optax object for every run: the compiled step is reused only for the same (static) tx.
    if self._tx is None:
      self._tx = make_optimizer(self.config, params, total_steps=self.max_steps)
    return self._tx

  def train_step(self, loss: losses.Loss):
    if loss.spec not in self._steps:
      self._steps[loss.spec] = make_train_step(self.config, self.encoder, loss, self.mesh,
                                                  self.images.augment)
    return self._steps[loss.spec]

  def batches(self, images: np.ndarray, *, seed: int, start_step: int):
    """Shuffled batches of the normal class through grain, as `data.make_loader` makes them."""
    import grain  # noqa: PLC0415  (the `data` extra, as in tfcl_jax.data)

    seed = int(np.random.SeedSequence(seed).generate_state(1)[0])
    dataset = grain.MapDataset.source(images).shuffle(seed=seed).batch(
        self.config.batch_size // jax.process_count(), drop_remainder=True)
    dataset = dataset.repeat(self.config.epochs)[start_step:]
    return ({"image": batch} for batch in dataset)

  def train(self, run: plan.Run, workdir: str) -> dict:
    """Fine-tunes one (loss, seed, normal class) run in its own directory (the encoder
    pretrained first where it is not yet); its results."""
    c = self.config
    if self.variables is None:
      self.load(pretrain(c, workdir))
    normal_class = run["normal_class"]
    normal = self.images.train_images[self.images.train_labels == normal_class]
    num_normal = len(normal)
    if jax.process_count() > 1:  # batches from this host's part
      normal = normal[jax.process_index()::jax.process_count()]
    steps_per_epoch = len(normal) // (c.batch_size // jax.process_count())

    def build(loss: losses.Loss, keys, mesh) -> sweep.Trainable:
      del keys, mesh  # one key, the training key (`sweep.train_run`); the trainer's mesh
      model_state = state.model_state(self.variables)
      # The center of the whole normal class (every host the same).
      center = msc.center(self.features(
          self.variables["params"], model_state,
          self.images.train_images[self.images.train_labels == normal_class]))
      initial = state.create_train_state(
          model_params=self.variables["params"],
          model_state={**model_state, msc.CENTER_KEY: center},
          loss_params=loss.params, tx=self.optimizer(
              {"model": self.variables["params"], "loss": loss.params}))

      def evaluate(train_state):
        return {"roc_auc": self.roc_auc(train_state.params["model"], train_state.model_state,
                                        normal_class)}

      def result(trained: sweep.Trained) -> dict:
        last_epoch = slice(-steps_per_epoch, None)
        return {"normal_class": normal_class,
                "roc_auc": float(trained.evaluations["roc_auc"][-1]),
                "roc_auc_pretrained": self.pretrained_auc(normal_class),
                "final_loss": float(np.mean(trained.metrics["loss"][last_epoch])),
                "final_center_cos": float(np.mean(trained.metrics["center_cos"][last_epoch])),
                "num_normal_train": num_normal, "steps": c.epochs * steps_per_epoch}

      return sweep.Trainable(
          initial, self.train_step(loss),
          lambda start: self.batches(normal, seed=run.seed, start_step=start),
          num_steps=c.epochs * steps_per_epoch, result=result,
          options={"eval_every": c.eval_every_epochs * steps_per_epoch, "eval_fn": evaluate,
                   "examples_per_step": c.batch_size}, held_out=self.held_out_set)

    # MSC's InfoNCE scores each view against every other view of the batch (`negatives="all"`).
    return sweep.train_run(
        c, run, workdir, num_candidates=losses.num_candidates(c.batch_size, negatives="all"),
        build=build, keys=1, mesh=self.mesh, plan_fields=PLAN_FIELDS)


def pretrain_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config.pretrain` (a SimCLR config) with the encoder and data fields of `config`.

  Raises:
    ConfigError: `config.pretrain` does not train one encoder (one loss, one seed).
  """
  pretrain = ml_collections.ConfigDict(config.pretrain.to_dict())
  for field in _PRETRAIN_FIELDS:
    pretrain[field] = config[field]
  specs = plan.split_list(pretrain.losses, name="pretrain.losses")
  if len(specs) != 1 or pretrain.seeds != 1:
    raise plan.ConfigError("config.pretrain must train one encoder: one loss and seeds = 1, "
                           f"got losses={','.join(specs)!r}, seeds={pretrain.seeds}.")
  pretrain.mode = "sweep"
  return pretrain


def pretrain(config: ml_collections.ConfigDict, workdir: str) -> str:
  """Pretrains the encoder without labels (SimCLR's sweep of one run in `workdir/pretrain`)
  unless done; its run directory."""
  pretrain_cfg = pretrain_config(config)
  directory = os.path.join(workdir, PRETRAIN_DIR)
  (run,) = pretraining.plan_runs(pretrain_cfg)
  if not sweep.finished(run, directory):
    mesh = pretraining.make_mesh(pretrain_cfg)
    with plan.config_errors("pretraining: "):
      pretraining.check_data(pretrain_cfg, [run], mesh)
    trainer = pretraining.Trainer(pretrain_cfg, mesh)
    sweep.sweep(pretrain_cfg, directory, runs=[run], plan_fields=pretraining.PLAN_FIELDS,
                train_run=lambda r: trainer.train(r, directory), desc="pretraining")
  return run.directory(directory)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       command: str | None = None) -> list[dict]:
  """Fine-tunes every run of `config` (`check_config` passed) not yet finished in `workdir`,
  after the checks the data, devices and checkpoint decide; pretrains first where needed;
  writes `results.csv`, `results.md` (recording `command`, default the one running) and
  `roc_auc.png` (`report.write`).

  Raises:
    ConfigError: a class too small, a batch that does not split over the devices, a
      checkpoint that does not fit the encoder, or a workdir made with another config.
  """
  command = tables.command_line() if command is None else command
  mesh = pretraining.make_mesh(config)
  runs = plan_runs(config)
  with plan.config_errors():  # a checkpoint that is absent or does not fit the encoder too
    experiment = Trainer(config, mesh)
    experiment.check(runs)
    if config.init_checkpoint:
      experiment.load(config.init_checkpoint)
  return sweep.sweep(
      config, workdir, runs=runs, plan_fields=PLAN_FIELDS, outputs=(PRETRAIN_DIR,),
      train_run=lambda run: experiment.train(run, workdir), desc="MSC runs",
      write_tables=lambda results: report.write(
          results, workdir, config=config, command=command,
          figures=len(results) == len(runs)))


def abstract_step(config: ml_collections.ConfigDict, mesh, *, spec: str = "free"):
  """The fine-tuning step with abstract `(state, batch, key)` (`framework.lowering`) on
  `config`'s encoder, no data."""
  info, recipe, view_size = images.views(config)
  encoder = models.make_backbone(config.backbone, width=config.width or None)
  loss = losses.from_spec(spec, num_candidates=losses.num_candidates(config.batch_size,
                                                                     negatives="all"))
  train_step = make_train_step(config, encoder, loss, mesh, functools.partial(
      augment.two_views, recipe=recipe, out_size=view_size))

  def initial():
    views = jnp.zeros((2, *info.example_shape(view_size)), jnp.float32)
    variables = encoder.init(jax.random.key(0), views, train=False)
    params = {"model": variables["params"], "loss": loss.params}
    model_state = state.model_state(variables)
    features = encoder.apply(variables, views, train=False)
    return state.create_train_state(
        model_params=variables["params"],
        model_state={**model_state, msc.CENTER_KEY: msc.center(features)},
        loss_params=loss.params, tx=make_optimizer(config, params, total_steps=10))

  batch = {"image": jax.ShapeDtypeStruct((config.batch_size, *info.example_shape()), jnp.uint8)}
  return train_step.jitted, (jax.eval_shape(initial), batch, lowering.key())
