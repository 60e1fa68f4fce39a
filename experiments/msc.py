"""Mean-Shifted Contrastive anomaly detection with fixed or temperature-free InfoNCE: Table 4.

  python -m experiments.msc --config=experiments/configs/msc_digits.py --workdir=DIR \
    [--config.losses=tau=0.25,free --config.seeds=3 --config.classes=0,1,2]

One normal class at a time (MSC's protocol; the others are the anomalies). Without
`--config.init_checkpoint`, first pretrains the encoder without labels with SimCLR
(`experiments/simclr_trainer.py`, in `DIR/pretrain`). Then per (mapping, seed, normal class)
(`config.losses`: InfoNCE specs, i.e. mappings):
the center of the normal training features, MSC fine-tuning with `tfcl_jax.training` (BatchNorm
in inference mode, optional frozen modules), and the ROC-AUC of the kNN score on the test
split. Writes `DIR/results.csv`, `DIR/results.md` (Table 4 layout) and `DIR/roc_auc.png`
(`experiments/msc_report.py`). Every check that can fail runs before the first step.
"""

from __future__ import annotations

import os

import jax
import ml_collections
import numpy as np

from experiments import cli, msc_report, runner, simclr_trainer
from tfcl_jax import data, mappings, models
from tfcl_jax.anomaly import msc, scores, weights
from tfcl_jax.objectives import msc as msc_objective
from tfcl_jax.objectives import simclr
from tfcl_jax.training import loop, optim, sharding, state, step

PRETRAIN_DIR = "pretrain"
_IGNORED_ON_RESUME = ("resume", "progress")
# Fields that only choose which runs exist: a workdir may be rerun with other values.
PLAN_FIELDS = ("losses", "mappings", "seeds", "classes")
_NOT_IN_RUN_RECORD = PLAN_FIELDS + _IGNORED_ON_RESUME
_PRETRAIN_FIELDS = ("dataset", "data_dir", "backbone", "width", "recipe", "view_size", "devices",
                    "progress")


ConfigError = runner.ConfigError


Run = runner.Run


def parse_classes(text, num_classes: int) -> list[int]:
  """`"all"` or a comma list of class indices in `[0, num_classes)`."""
  if str(text).strip() == "all":
    return list(range(num_classes))
  classes = []
  for item in runner.split_list(text, name="classes"):
    try:
      index = int(item)
    except ValueError:
      raise ValueError(f"config.classes must be 'all' or class indices, got {item!r}.") from None
    if not 0 <= index < num_classes:
      raise ValueError(
          f"config.classes: class {index} is out of range; the dataset has classes 0.."
          f"{num_classes - 1}.")
    classes.append(index)
  return list(dict.fromkeys(classes))


def plan_runs(config: ml_collections.ConfigDict) -> list[Run]:
  """The (spec, normal class, seed) runs, after checking the specs (InfoNCE only: MSC's loss
  takes a mapping), seeds and classes."""
  specs = runner.loss_specs(config, example="tau=0.25,free")
  not_mappings = [spec for spec in specs if spec.startswith("sigmoid/")]
  if not_mappings:
    raise ValueError(f"config.losses: MSC fine-tunes with its InfoNCE loss and takes mapping "
                     f"specs (free, tau=0.25, ...), got {not_mappings}.")
  classes = parse_classes(config.classes, data.get_info(config.dataset).num_classes)
  return runner.plan(config, order=("spec", "normal_class", "seed"),
                     axes={"normal_class": classes}, specs=specs)


def _frozen(config) -> list[str]:
  return [name.strip() for name in str(config.frozen).split(",") if name.strip()]


def make_optimizer(config: ml_collections.ConfigDict, params, *, total_steps: int):
  """The config's fine-tuning optimiser, the `config.frozen` modules of `params` frozen."""
  tx = optim.make_optimizer(
      name=config.optimizer, learning_rate=config.learning_rate, total_steps=total_steps,
      schedule=config.schedule, momentum=config.momentum, weight_decay=config.weight_decay)
  return msc.freeze(tx, params, frozen=_frozen(config))


def make_train_step(config: ml_collections.ConfigDict, encoder, mapping: mappings.Mapping, mesh,
                    augment_fn):
  """MSC's sharded fine-tuning step (`objectives.msc`, `training.make_train_step`)."""
  loss_fn = msc_objective.make_msc_loss(encoder, mapping=mapping, augment=augment_fn,
                                        angular=config.angular)
  return step.make_train_step(loss_fn, mesh=mesh)


class Experiment:
  """What the runs share: images, encoder, pretrained variables, optimiser, compiled steps."""

  def __init__(self, config: ml_collections.ConfigDict, mesh):
    self.config, self.mesh = config, mesh
    self.images = simclr_trainer.load_images(config)
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

  def check(self, runs: list[Run]) -> None:
    """Class sizes, batch size, frozen names: everything the data and model decide."""
    c = self.config
    sharding.check_batch_size(c.batch_size, self.mesh, name="config.batch_size")
    runner.check_positive_ints(c, "epochs", "knn_k", "batch_size")
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
    params = {"model": self.template["params"], "mapping": {}}
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

  def features(self, params, model_state, images) -> jax.Array:
    model_state = {k: v for k, v in model_state.items() if k != msc.CENTER_KEY}
    return simclr.embed(self.feature_fn, params, model_state, images,
                        preprocess=self.images.center)

  def roc_auc(self, params, model_state, normal_class: int) -> float:
    """ROC-AUC of the kNN score, anomalies (every other class) positive, MSC's evaluation."""
    normal = self.images.train_images[self.images.train_labels == normal_class]
    bank = self.features(params, model_state, normal)
    query = self.features(params, model_state, self.images.test_images)
    distance = scores.knn_score(bank, query, k=self.config.knn_k, squared=self.config.squared)
    return float(scores.roc_auc(self.images.test_labels != normal_class, distance))

  def pretrained_auc(self, normal_class: int) -> float:
    if normal_class not in self._pretrained_auc:
      model_state = {k: v for k, v in self.variables.items() if k != "params"}
      self._pretrained_auc[normal_class] = self.roc_auc(
          self.variables["params"], model_state, normal_class)
    return self._pretrained_auc[normal_class]

  def optimizer(self, params):
    # One optax object for every run: the compiled step is reused only for the same (static) tx.
    if self._tx is None:
      self._tx = make_optimizer(self.config, params, total_steps=self.max_steps)
    return self._tx

  def train_step(self, mapping: mappings.Mapping):
    if mapping.spec not in self._steps:
      self._steps[mapping.spec] = make_train_step(self.config, self.encoder, mapping, self.mesh,
                                                  self.images.augment)
    return self._steps[mapping.spec]

  def batches(self, images: np.ndarray, *, seed: int, start_step: int):
    """Shuffled batches of the normal class through grain, as `data.make_loader` makes them."""
    import grain  # noqa: PLC0415  (the `data` extra, as in tfcl_jax.data)

    seed = int(np.random.SeedSequence(seed).generate_state(1)[0])
    dataset = grain.MapDataset.source(images).shuffle(seed=seed).batch(
        self.config.batch_size // jax.process_count(), drop_remainder=True)
    dataset = dataset.repeat(self.config.epochs)[start_step:]
    return ({"image": batch} for batch in dataset)

  def run(self, run: Run, workdir: str) -> dict:
    """Fine-tunes one (mapping, seed, normal class) run in its own directory; its results."""
    c = self.config
    mapping = mappings.from_spec(run.spec)
    normal_class = run["normal_class"]
    normal = self.images.train_images[self.images.train_labels == normal_class]
    model_state = {k: v for k, v in self.variables.items() if k != "params"}
    # The center of the whole normal class (every host the same); batches from this host's part.
    center = msc.center(self.features(self.variables["params"], model_state, normal))
    num_normal = len(normal)
    if jax.process_count() > 1:
      normal = normal[jax.process_index()::jax.process_count()]
    initial = state.create_train_state(
        model_params=self.variables["params"],
        model_state={**model_state, msc.CENTER_KEY: center},
        mapping_params=mapping.params, tx=self.optimizer(
            {"model": self.variables["params"], "mapping": mapping.params}))
    steps_per_epoch = len(normal) // (c.batch_size // jax.process_count())
    num_steps = c.epochs * steps_per_epoch
    record = runner.without_added(
        {k: v for k, v in c.to_dict().items() if k not in _NOT_IN_RUN_RECORD})
    record.update(run.record())

    def evaluate(train_state):
      return {"roc_auc": self.roc_auc(train_state.params["model"], train_state.model_state,
                                      normal_class)}

    loop.train(
        initial, train_step=self.train_step(mapping),
        batches=lambda start: self.batches(normal, seed=run.seed, start_step=start),
        num_steps=num_steps,
        workdir=run.directory(workdir), key=jax.random.key(run.seed), mesh=self.mesh,
        config=record, resume=c.resume, eval_every=c.eval_every_epochs * steps_per_epoch,
        eval_fn=evaluate, log_every=c.log_every, examples_per_step=c.batch_size,
        progress=c.progress, desc=run.label())
    evaluation = loop.read_csv(os.path.join(run.directory(workdir), loop.EVAL_FILE))
    metrics = loop.read_csv(os.path.join(run.directory(workdir), loop.METRICS_FILE))
    return {"mapping": run.spec, "seed": run.seed, "class": normal_class,
            "roc_auc": float(evaluation["roc_auc"][-1]),
            "roc_auc_pretrained": self.pretrained_auc(normal_class),
            "final_loss": float(np.mean(metrics["loss"][-steps_per_epoch:])),
            "final_center_cos": float(np.mean(metrics["center_cos"][-steps_per_epoch:])),
            "num_normal_train": num_normal, "steps": num_steps}


def pretrain_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config.pretrain` (a SimCLR config) with the encoder and data fields of `config`."""
  pretrain = ml_collections.ConfigDict(config.pretrain.to_dict())
  for field in _PRETRAIN_FIELDS:
    pretrain[field] = config[field]
  pretrain.resume = config.resume
  specs = runner.split_list(runner.renamed(pretrain, "losses", "mappings"),
                            name="pretrain.losses")
  if len(specs) != 1 or pretrain.seeds != 1:
    raise ValueError("config.pretrain must train one encoder: one loss and seeds = 1, got "
                     f"losses={','.join(specs)!r}, seeds={pretrain.seeds}.")
  pretrain.mode = "sweep"
  return pretrain


def pretrain(config: ml_collections.ConfigDict, workdir: str) -> str:
  """Pretrains the encoder without labels (SimCLR experiment) unless done; its run directory."""
  pretrain_cfg = pretrain_config(config)
  directory = os.path.join(workdir, PRETRAIN_DIR)
  (run,) = simclr_trainer.plan_runs(pretrain_cfg)
  if not runner.finished(run, directory):
    mesh = sharding.make_mesh(jax.devices()[:config.devices] if config.devices else None)
    try:
      simclr_trainer.check_config(pretrain_cfg, mesh)
      runner.prepare(directory, pretrain_cfg, runs=[run], plan_fields=simclr_trainer.PLAN_FIELDS)
    except (ValueError, TypeError) as error:
      raise ConfigError(f"pretraining: {error}") from error
    trainer = simclr_trainer.Trainer(pretrain_cfg, mesh)
    runner.run_all([run], lambda r: trainer.run(r, directory), workdir=directory,
                   progress=pretrain_cfg.progress, desc="pretraining")
  return run.directory(directory)


def check_config(config: ml_collections.ConfigDict, workdir: str, mesh) -> tuple[list, Experiment]:
  """Every check that can fail before training: specs, classes, data, checkpoint, workdir."""
  runs = plan_runs(config)
  models.make_backbone(config.backbone)
  if not config.init_checkpoint:
    pretrain_config(config)
  experiment = Experiment(config, mesh)
  experiment.check(runs)
  if config.init_checkpoint:
    experiment.load(config.init_checkpoint)
  runner.prepare(workdir, config, runs=runs, plan_fields=PLAN_FIELDS, outputs=(PRETRAIN_DIR,))
  return runs, experiment


def run_experiment(config: ml_collections.ConfigDict, workdir: str) -> list[dict]:
  """Checks everything, pretrains if needed, fine-tunes every run not yet done, writes results."""
  mesh = sharding.make_mesh(jax.devices()[:config.devices] if config.devices else None)
  try:
    runs, experiment = check_config(config, workdir, mesh)
  except (ValueError, TypeError, FileNotFoundError) as error:
    raise ConfigError(str(error)) from error
  if experiment.variables is None:
    experiment.load(pretrain(config, workdir))
  return runner.run_all(
      runs, lambda run: experiment.run(run, workdir), workdir=workdir,
      progress=config.progress, desc="MSC runs",
      write_tables=lambda results: msc_report.write(
          results, workdir, dataset=config.dataset, figures=len(results) == len(runs)))


if __name__ == "__main__":
  cli.run_main(run_experiment, user_errors=(ConfigError,),
               usage="pass --config=experiments/configs/msc_digits.py --workdir=DIR")
