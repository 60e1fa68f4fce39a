"""MSC anomaly detection (tfcl_jax.anomaly, experiments.msc): NumPy, scikit-learn, invariants."""

from __future__ import annotations

import dataclasses
import os

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from sklearn import metrics

from experiments import msc as msc_experiment
from experiments.configs import msc_digits
from experiments.framework import held_out, plan
from experiments.msc import train as msc_train
from tfcl_jax import mappings, models
from tfcl_jax.anomaly import msc, scores, torchvision_resnet, weights
from tfcl_jax.objectives import msc as msc_objective
from tfcl_jax.training import checkpoint, optim, sharding, state, step

# -- ROC-AUC and the kNN score --------------------------------------------------------------------


@pytest.mark.parametrize("n, positives, levels", [(200, 37, 1000), (64, 32, 5), (31, 1, 3)])
def test_roc_auc_matches_sklearn_with_ties(n, positives, levels):
  rng = np.random.default_rng(n)
  labels = np.zeros(n, bool)
  labels[rng.choice(n, positives, replace=False)] = True
  # Few distinct levels make many ties between positives and negatives.
  score_values = rng.integers(0, levels, n).astype(np.float32) + 0.5 * labels
  expected = metrics.roc_auc_score(labels, score_values)
  np.testing.assert_allclose(float(scores.roc_auc(labels, score_values)), expected, atol=1e-6)
  np.testing.assert_allclose(float(scores.roc_auc(labels.astype(np.int32), score_values)),
                             expected, atol=1e-6)


def test_roc_auc_invariants_and_errors():
  labels = np.array([0, 0, 1, 1, 1], bool)
  values = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
  assert float(scores.roc_auc(labels, values)) == 1.0
  assert float(scores.roc_auc(labels, -values)) == 0.0
  assert float(scores.roc_auc(labels, np.zeros(5))) == 0.5  # all tied
  with pytest.raises(ValueError, match="both positive and negative"):
    scores.roc_auc(np.ones(5, bool), values)
  with pytest.raises(ValueError, match="same shape"):
    scores.roc_auc(labels, values[:4])
  with pytest.raises(ValueError, match="NaN"):
    scores.roc_auc(labels, np.array([0.1, np.nan, 0.3, 0.4, 0.5]))
  with pytest.raises(ValueError, match="0/1"):
    scores.roc_auc(np.array([0, 2, 1, 1, 1]), values)


@pytest.mark.parametrize("squared", [True, False])
def test_knn_score_matches_numpy_brute_force(squared):
  rng = np.random.default_rng(1)
  bank = rng.normal(size=(50, 8)).astype(np.float32)
  query = rng.normal(size=(13, 8)).astype(np.float32)
  distance = np.linalg.norm(query[:, None] - bank[None], axis=-1)
  nearest = np.sort(distance**2 if squared else distance, axis=1)[:, :2]
  np.testing.assert_allclose(scores.knn_score(bank, query, k=2, squared=squared, chunk_size=4),
                             nearest.sum(1), rtol=1e-4, atol=1e-4)


def test_knn_score_errors():
  with pytest.raises(ValueError, match="k must be"):
    scores.knn_score(np.ones((2, 3), np.float32), np.ones((1, 3), np.float32), k=3)
  with pytest.raises(ValueError, match="same feature size"):
    scores.knn_score(np.ones((2, 3), np.float32), np.ones((1, 4), np.float32))
  with pytest.raises(TypeError, match="bank"):
    scores.knn_score(np.ones((2, 3), np.int32), np.ones((1, 3), np.float32))


# -- center and loss ------------------------------------------------------------------------------


def _normalize(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_center_is_normalised_mean_of_unit_features_and_scale_invariant():
  rng = np.random.default_rng(2)
  features = rng.normal(size=(20, 6)).astype(np.float32) + 1.0
  expected = _normalize(_normalize(features).mean(0))
  np.testing.assert_allclose(msc.center(features), expected, rtol=1e-5, atol=1e-6)
  scaled = features * rng.uniform(0.1, 10, size=(20, 1)).astype(np.float32)
  np.testing.assert_allclose(msc.center(scaled), expected, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="M = 0"):
    msc.center(np.zeros((0, 6), np.float32))
  with pytest.raises(ValueError, match="NaN"):
    msc.center(np.array([[np.nan, 1.0], [0.0, 1.0]], np.float32))
  with pytest.raises(ValueError, match="no direction"):
    msc.center(np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32))


def _msc_reference(out_1, out_2, center, logit):
  """MSC's `run_epoch` + `contrastive_loss` (Reiss & Hoshen's code) in NumPy, any logit mapping."""
  out_1, out_2 = _normalize(out_1) - center, _normalize(out_2) - center
  angular = (out_1**2).sum(1).mean() + (out_2**2).sum(1).mean()
  u1, u2 = _normalize(out_1), _normalize(out_2)
  out = np.concatenate([u1, u2])
  similarity = np.exp(logit(out @ out.T))
  off_diagonal = similarity[~np.eye(len(out), dtype=bool)].reshape(len(out), -1)
  positive = np.exp(logit((u1 * u2).sum(-1)))
  positive = np.concatenate([positive, positive])
  return -np.log(positive / off_diagonal.sum(-1)).mean() + angular


@pytest.mark.parametrize("spec, logit", [
    ("tau=0.25", lambda cos: cos / 0.25),
    # 2 artanh(cos), Eq. 11; the diagonal (cos = 1) gives inf and is masked out like MSC's.
    ("free", lambda cos: np.log1p(cos) - np.log1p(-np.minimum(cos, 1 - 1e-12))),
])
def test_msc_loss_matches_reference_code_in_numpy(spec, logit):
  rng = np.random.default_rng(3)
  z1 = rng.normal(size=(6, 5))
  z2 = z1 + 0.3 * rng.normal(size=(6, 5))
  center = _normalize(_normalize(z1).mean(0))
  expected = _msc_reference(z1, z2, center, logit)
  loss = msc.msc_loss(jnp.asarray(z1, jnp.float32), jnp.asarray(z2, jnp.float32),
                      center=jnp.asarray(center, jnp.float32), mapping=mappings.from_spec(spec))
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
  angular = msc.angular_center_loss(z1.astype(np.float32), z2.astype(np.float32),
                                    center=center.astype(np.float32))
  no_angular = msc.msc_loss(jnp.asarray(z1, jnp.float32), jnp.asarray(z2, jnp.float32),
                            center=jnp.asarray(center, jnp.float32),
                            mapping=mappings.from_spec(spec), angular=False)
  np.testing.assert_allclose(float(no_angular + angular), expected, rtol=1e-5)
  with pytest.raises(ValueError, match="center must have shape"):
    msc.msc_loss(z1.astype(np.float32), z2.astype(np.float32), center=np.ones(4, np.float32))


class _TinyEncoder(nn.Module):
  """Dense-BN-ReLU-Dense: BatchNorm statistics to keep, two modules to freeze or train."""

  @nn.compact
  def __call__(self, x, *, train):
    x = nn.Dense(8, name="first")(x.reshape(x.shape[0], -1))
    x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.5, name="norm")(x))
    return nn.Dense(6, name="last")(x)


def _noise(key, images):
  keys = jax.random.split(key)
  return tuple(images + 0.1 * jax.random.normal(k, images.shape) for k in keys)


def test_msc_train_step_keeps_batchnorm_statistics_and_frozen_modules():
  encoder = _TinyEncoder()
  images = jax.random.normal(jax.random.key(0), (8, 4, 4, 1)) + 1.0
  variables = encoder.init(jax.random.key(1), images, train=False)
  # Non-trivial running statistics: training-mode BatchNorm would move them.
  variables = {"params": variables["params"], "batch_stats": {"norm": {
      "mean": jnp.full((8,), 0.3), "var": jnp.full((8,), 2.0)}}}
  features = encoder.apply(variables, images, train=False)
  center = msc.center(features)
  mapping = mappings.temperature(0.25)
  loss_fn = msc_objective.make_msc_loss(encoder, loss=mapping, augment=_noise)
  model_state = {"batch_stats": variables["batch_stats"], msc.CENTER_KEY: center}
  params = {"model": variables["params"], "loss": {}}
  # The experiment's optimiser: weight decay must not reach the frozen modules either.
  tx = msc.freeze(optim.make_optimizer(name="sgd", learning_rate=0.1, total_steps=10,
                                       weight_decay=0.1, momentum=0.0),
                  params, frozen=["first", "norm"])
  initial = state.create_train_state(model_params=variables["params"], model_state=model_state,
                                     tx=tx)
  mesh = sharding.make_mesh(jax.devices()[:1])
  train_step = step.make_train_step(loss_fn, mesh=mesh, donate=False)
  key = jax.random.key(2)
  new_state, step_metrics = train_step(initial, {"image": images}, key)

  # The loss is msc_loss of eval-mode features of the two views the step drew.
  view1, view2 = _noise(jax.random.fold_in(key, 0), images)
  expected = msc.msc_loss(encoder.apply(variables, view1, train=False),
                          encoder.apply(variables, view2, train=False), center=center,
                          mapping=mapping)
  np.testing.assert_allclose(float(step_metrics["loss"]), float(expected), rtol=1e-5)
  chex.assert_trees_all_equal(new_state.model_state, initial.model_state)
  chex.assert_trees_all_equal(new_state.params["model"]["first"], variables["params"]["first"])
  chex.assert_trees_all_equal(new_state.params["model"]["norm"], variables["params"]["norm"])
  last = new_state.params["model"]["last"]["kernel"]
  assert np.abs(last - variables["params"]["last"]["kernel"]).max() > 0
  with pytest.raises(ValueError, match="not modules of the encoder"):
    msc.freeze(optax.sgd(0.1), params, frozen=["layer9"])


# -- checkpoints and torchvision weights ----------------------------------------------------------


def _small_cnn_variables(width, *, contrastive=False):
  model = (models.make_contrastive_model("small_cnn", width=width, projection_hidden_dim=4,
                                         projection_dim=2)
           if contrastive else models.make_backbone("small_cnn", width=width))
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)), train=False))
  rng = np.random.default_rng(width)

  def draw(path, leaf):
    values = rng.normal(size=leaf.shape).astype(leaf.dtype)
    # BatchNorm variances must be positive.
    return np.abs(values) + 0.5 if jax.tree_util.keystr(path).endswith("['var']") else values

  return jax.tree_util.tree_map_with_path(draw, shapes), shapes


def test_load_variables_roundtrip_and_mismatch(tmp_path):
  variables, template = _small_cnn_variables(4)
  path = weights.save_variables(str(tmp_path / "encoder"), variables)
  chex.assert_trees_all_equal(weights.load_variables(path, template), variables)
  _, wider = _small_cnn_variables(8)
  with pytest.raises(weights.CheckpointMismatchError, match=r"shape mismatch: \['batch_stats'\]"):
    weights.load_variables(path, wider)
  with pytest.raises(weights.CheckpointMismatchError, match="missing"):
    weights.load_variables(path, {**template, "params": {**template["params"], "extra": {
        "kernel": jax.ShapeDtypeStruct((2,), jnp.float32)}}})
  with pytest.raises(FileNotFoundError, match="does not exist"):
    weights.load_variables(str(tmp_path / "nowhere"), template)
  with pytest.raises(ValueError, match="already exists"):
    weights.save_variables(path, variables)


def test_load_backbone_from_a_training_run_checkpoint(tmp_path):
  variables, _ = _small_cnn_variables(4, contrastive=True)
  run_state = state.create_train_state(
      model_params=variables["params"], model_state={"batch_stats": variables["batch_stats"]},
      tx=optax.sgd(0.1))
  checkpoint.save(checkpoint.make_manager(str(tmp_path / "run" / "checkpoints")), run_state)
  _, backbone_template = _small_cnn_variables(4)
  loaded = weights.load_variables(str(tmp_path / "run"), backbone_template, submodule="backbone")
  chex.assert_trees_all_equal(loaded["params"], variables["params"]["backbone"])
  chex.assert_trees_all_equal(loaded["batch_stats"], variables["batch_stats"]["backbone"])


def _torchvision_resnet18_state_dict(width, rng):
  """Key names and shapes of torchvision's resnet18().state_dict(), written out independently."""
  entries = {"conv1.weight": (width, 3, 7, 7)}

  def batch_norm(prefix, channels):
    for name in ("weight", "bias", "running_mean", "running_var"):
      entries[f"{prefix}.{name}"] = (channels,)
    entries[f"{prefix}.num_batches_tracked"] = ()

  batch_norm("bn1", width)
  channels_in = width
  for stage in range(4):
    channels = width * 2**stage
    for block in range(2):
      prefix = f"layer{stage + 1}.{block}"
      entries[f"{prefix}.conv1.weight"] = (channels, channels_in, 3, 3)
      batch_norm(f"{prefix}.bn1", channels)
      entries[f"{prefix}.conv2.weight"] = (channels, channels, 3, 3)
      batch_norm(f"{prefix}.bn2", channels)
      if block == 0 and stage > 0:
        entries[f"{prefix}.downsample.0.weight"] = (channels, channels_in, 1, 1)
        batch_norm(f"{prefix}.downsample.1", channels)
      channels_in = channels
  entries["fc.weight"], entries["fc.bias"] = (1000, 8 * width), (1000,)
  return {key: rng.normal(size=shape).astype(np.float32) for key, shape in entries.items()}


def test_torchvision_resnet18_conversion_fits_our_resnet18():
  rng = np.random.default_rng(4)
  state_dict = _torchvision_resnet18_state_dict(8, rng)
  variables = torchvision_resnet.convert(state_dict)
  model = models.ResNet18(stem="imagenet", width=8)
  template = jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False))
  weights.check_variables(variables, template)  # every name and shape, no extra or missing
  np.testing.assert_array_equal(variables["batch_stats"]["BasicBlock_2"]["BatchNorm_2"]["var"],
                                state_dict["layer2.0.downsample.1.running_var"])
  np.testing.assert_array_equal(variables["params"]["BasicBlock_7"]["BatchNorm_1"]["scale"],
                                state_dict["layer4.1.bn2.weight"])
  # Layout: a PyTorch 3x3 convolution (cross-correlation, padding 1) in NumPy against Flax's.
  weight = state_dict["layer1.0.conv1.weight"]
  x = rng.normal(size=(1, 5, 5, 8)).astype(np.float32)
  padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  expected = np.zeros((1, 5, 5, 8), np.float32)
  for i in range(5):
    for j in range(5):
      expected[0, i, j] = np.einsum("hwc,ochw->o", padded[0, i:i + 3, j:j + 3], weight)
  kernel = variables["params"]["BasicBlock_0"]["Conv_0"]["kernel"]
  flax_out = nn.Conv(8, (3, 3), use_bias=False).apply({"params": {"kernel": kernel}}, x)
  np.testing.assert_allclose(flax_out, expected, rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match="Bottleneck"):
    torchvision_resnet.convert({"layer1.0.conv3.weight": np.zeros((4, 4, 1, 1))})
  with pytest.raises(weights.CheckpointMismatchError, match="missing"):
    stem_only = {"conv1.weight": state_dict["conv1.weight"]}
    weights.check_variables(torchvision_resnet.convert(stem_only), template)


# -- experiment: bad input stops before training ---------------------------------------------------


def _config(**overrides):
  config = msc_digits.get_config()
  config.progress = False
  config.num_devices = 1
  for name, value in overrides.items():
    config[name] = value
  return config


def _run(config, workdir):
  """What `python -m experiments.msc` does: `check_config`, then `train_and_evaluate`."""
  msc_experiment.check_config(config)
  return msc_experiment.train_and_evaluate(config, workdir)


@pytest.mark.parametrize("overrides, message", [
    ({"classes": "3,10"}, "class 10 is out of range"),
    ({"losses": "tau=-1"}, "config.losses: .*tau"),
    ({"losses": "free,sigmoid/free"}, "MSC fine-tunes with its InfoNCE loss"),
    ({"knn_k": 0}, "config.knn_k must be an int >= 1"),
    ({"backbone": "vgg"}, "backbone must be one of"),
])
def test_experiment_rejects_bad_configs_without_data(tmp_path, overrides, message):
  with pytest.raises(plan.ConfigError, match=message):
    _run(_config(**overrides), str(tmp_path / "a"))
  assert not os.path.exists(tmp_path / "a")


def test_the_pretraining_config_is_checked_as_simclr_checks_it():
  config = _config()
  config.pretrain.epochs = 0
  with pytest.raises(plan.ConfigError, match="^pretraining: config.epochs must be an int >= 1"):
    msc_experiment.check_config(config)
  config = _config()
  config.pretrain.seeds = 2
  with pytest.raises(plan.ConfigError, match="config.pretrain must train one encoder"):
    msc_experiment.check_config(config)
  config.init_checkpoint = "/an/encoder"  # no pretraining: its config is not read
  msc_experiment.check_config(config)


def test_experiment_rejects_empty_normal_class():
  mesh = sharding.make_mesh(jax.devices()[:1])
  experiment = msc_train.Trainer(_config(), mesh)
  labels = experiment.images.train_labels
  experiment.images = dataclasses.replace(experiment.images,
                                          train_labels=np.where(labels == 3, 4, labels))
  with pytest.raises(ValueError, match="normal class 3 has no examples"):
    experiment.check([plan.Run("free", 0, (("normal_class", 3),))])


def test_experiment_rejects_mismatched_checkpoint_before_training(tmp_path):
  variables, _ = _small_cnn_variables(4)
  path = weights.save_variables(str(tmp_path / "encoder4"), variables)
  workdir = tmp_path / "work"
  with pytest.raises(plan.ConfigError, match="does not match the model"):
    _run(_config(init_checkpoint=path, width=16), str(workdir))
  assert not os.path.exists(workdir / "runs") and not os.path.exists(workdir / "pretrain")


def test_experiment_end_to_end_from_a_checkpoint_and_resume(tmp_path):
  variables, _ = _small_cnn_variables(4)
  path = weights.save_variables(str(tmp_path / "encoder4"), variables)
  config = _config(init_checkpoint=path, width=4, classes="0", losses="free", seeds=1,
                   epochs=1)
  workdir = str(tmp_path / "work")
  results = _run(config, workdir)
  assert [(r["spec"], r["seed"], r["normal_class"]) for r in results] == [("free", 0, 0)]
  assert 0.0 <= results[0]["roc_auc"] <= 1.0 and results[0]["steps"] == 142 // 32
  with open(os.path.join(workdir, "results.csv")) as f:
    header = f.readline().strip().split(",")
  assert header[:4] == ["spec", "seed", "normal_class", "roc_auc"]
  # The label-free scores of the test split (every class, labels unused) by fraction of the
  # 4 steps: 10% and 25% at step 1, 50% at step 2, the end at step 4; LiDAR among them.
  scores = held_out.columns(os.path.join(workdir, "runs", "free", "normal_class_0", "seed0"), 4)
  assert {held_out.column(n, f) for n in ("lidar", "rankme") for f in held_out.FRACTIONS
          } <= set(header) & set(scores)
  assert scores["label_free/rankme@10%"] == scores["label_free/rankme@25%"]
  assert results[0]["label_free/lidar"] == scores["label_free/lidar"]
  table = open(os.path.join(workdir, "results.md")).read()
  assert "| free |" in table and "| pretrained (no MSC) |" in table
  assert os.path.getsize(os.path.join(workdir, "roc_auc.png")) > 0
  config.resume = False
  with pytest.raises(plan.ConfigError, match="already holds"):
    _run(config, workdir)
  config.resume = True
  assert _run(config, workdir) == results  # nothing retrained
