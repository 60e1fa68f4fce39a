"""Every loss and every experiment's train step lowers for GPUs (`cuda`) and TPUs from this CPU
host (`tfcl_jax.training.lowering`), nothing is run: the Pallas path as Triton kernels (their
custom calls, not Pallas's interpreter), nothing in float64, no host callbacks or CPU-only
calls. Sizes are those users run: N up to 2^17, D = 128 and 768, float32 and bfloat16."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from tfcl_jax import augment, losses, mappings, models
from tfcl_jax.training import lowering, sharding, state

PLATFORMS = ("cuda", "tpu")
MAPPINGS = {
    "tau": mappings.temperature(0.1),
    "free": mappings.temperature_free(),
    "learnable": mappings.learnable_temperature(tau=0.07),
    "clip": mappings.learnable_temperature(tau=0.07, max_scale=100.0),
    "dynamic": mappings.dynamic_temperature(0.1, 0.2),
    "annealed": mappings.from_spec("anneal=cosine:0.5:0.1:1000").bind(step=jnp.int32(10)),
}
MODES = {
    "all": dict(negatives="all"),
    "cross": dict(negatives="cross"),
    "two-tower": dict(negatives="cross", symmetric=True),
    "cross+bank": dict(negatives="cross", bank=True),
    "two-tower+bank": dict(negatives="cross", symmetric=True, bank=True),
}
# Triton kernels in loss + gradient: the in-batch forward and gradient kernels, and for a bank
# its forward and row-gradient kernels once per anchor side.
KERNELS = {"all": 2, "cross": 3, "two-tower": 4, "cross+bank": 5, "two-tower+bank": 8}
BANK = 4096


def _check(report: lowering.LoweringReport, *, kernels: int = 0):
  assert report.problems() == [], report.problems()
  assert report.triton_kernels == kernels, report.custom_calls
  if kernels:  # the grid is in the kernel, not a loop of Pallas's interpreter
    assert "stablehlo.while" not in report.text


def _info_nce_report(mapping, mode, implementation, n, d, dtype, platform):
  mode = dict(MODES[mode])
  bank = mode.pop("bank", False)

  def loss(z1, z2, mapping, *extra):
    return losses.info_nce(z1, z2, mapping=mapping, implementation=implementation,
                           extra_negatives=extra[0] if extra else None, **mode)

  view = jax.ShapeDtypeStruct((n, d), dtype)
  args = (view, view, mapping) + ((jax.ShapeDtypeStruct((BANK, d), dtype),) if bank else ())
  grad = jax.value_and_grad(loss, argnums=(0, 1, 2), allow_int=True)  # an int step: no gradient
  return lowering.inspect(lowering.lower(grad, *args, platform=platform), platform=platform)


CASES = [(name, mode, implementation, platform) for name in MAPPINGS for mode in MODES
         for implementation in ("xla", "pallas") for platform in PLATFORMS]


@pytest.mark.parametrize("name, mode, implementation, platform", CASES,
                         ids=["-".join(case) for case in CASES])
def test_info_nce_every_mapping_and_mode_lowers(name, mode, implementation, platform):
  report = _info_nce_report(MAPPINGS[name], mode, implementation, 1000, 768, jnp.float32,
                            platform)
  kernels = KERNELS[mode] if implementation == "pallas" and platform == "cuda" else 0
  _check(report, kernels=kernels)


SIZES = [(n, d, dtype) for n in (1000, 4096, 2**17) for d in (128, 768)
         for dtype in (jnp.float32, jnp.bfloat16)]


@pytest.mark.parametrize("n, d, dtype", SIZES,
                         ids=[f"{n}x{d}-{jnp.dtype(t).name}" for n, d, t in SIZES])
def test_info_nce_every_size_lowers(n, d, dtype):
  mode = ("all", "cross", "two-tower")[SIZES.index((n, d, dtype)) % 3]
  for implementation in ("xla", "pallas"):
    for platform in PLATFORMS:
      report = _info_nce_report(MAPPINGS["free"], mode, implementation, n, d, dtype, platform)
      _check(report, kernels=KERNELS[mode] if (implementation, platform) == ("pallas", "cuda")
             else 0)


def test_pallas_is_interpreted_when_lowered_for_the_cpu():
  report = _info_nce_report(MAPPINGS["clip"], "two-tower", "pallas", 1000, 128, jnp.float32,
                            "cpu")
  assert report.triton_kernels == 0 and "stablehlo.while" in report.text


def test_default_tiles_follow_the_platform_lowered_for():
  # 8192 rows: tiles of 512 on CPU, of 4096 on GPU and TPU (losses.auto_block_size).
  for platform, tile in (("cpu", 512), ("cuda", 4096), ("tpu", 4096)):
    report = _info_nce_report(MAPPINGS["free"], "cross", "xla", 8192, 128, jnp.float32,
                              platform)
    assert f"tensor<{tile}x{tile}xf32>" in report.text, platform
    assert "tensor<8192x8192xf32>" not in report.text


@pytest.mark.parametrize("platform", PLATFORMS)
def test_sigmoid_and_supervised_losses_lower(platform):
  view = jax.ShapeDtypeStruct((4096, 768), jnp.bfloat16)
  for spec in ("sigmoid/free", "sigmoid/tau=0.5/learn_b=prior",
               "sigmoid/learnable=0.1/learn_b=siglip", "sigmoid/dynamic=0.1:0.2"):
    loss = losses.from_spec(spec, num_candidates=4096)
    for negatives in ("all", "cross"):
      def fn(z1, z2, params, loss=loss, negatives=negatives):
        return loss(z1, z2, params=params, negatives=negatives)

      lowered = lowering.lower(jax.value_and_grad(fn, argnums=(0, 1, 2)), view, view,
                               loss.params, platform=platform)
      _check(lowering.inspect(lowered, platform=platform))
  for n in (1000, 4096):
    for name in ("tau", "free", "clip"):
      def supervised(z, mapping):
        labels = jnp.arange(z.shape[0]) % 100
        return losses.supervised_info_nce(z, labels, mapping=mapping)

      lowered = lowering.lower(jax.value_and_grad(supervised, argnums=(0, 1)),
                               jax.ShapeDtypeStruct((n, 128), jnp.float32), MAPPINGS[name],
                               platform=platform)
      _check(lowering.inspect(lowered, platform=platform))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_sharded_losses_lower_on_eight_devices(platform):
  mesh = sharding.make_mesh(jax.devices()[:8])
  view = jax.ShapeDtypeStruct((4096, 256), jnp.float32,
                              sharding=NamedSharding(mesh, PartitionSpec("data")))
  for strategy in losses.STRATEGIES:
    for mode in ("all", "two-tower"):
      def info_nce(z1, z2, mapping, strategy=strategy, mode=mode):
        return losses.info_nce_on_mesh(z1, z2, mesh=mesh, mapping=mapping, strategy=strategy,
                                       **MODES[mode])

      def sigmoid(z1, z2, mapping, strategy=strategy):
        return losses.sigmoid_loss_on_mesh(z1, z2, mesh=mesh, mapping=mapping,
                                           strategy=strategy)

      for fn in (info_nce, sigmoid):
        lowered = lowering.lower(jax.value_and_grad(fn, argnums=(0, 1, 2)), view, view,
                                 MAPPINGS["clip"], platform=platform)
        report = lowering.inspect(lowered, platform=platform)
        _check(report)
        collective = "collective_permute" if strategy == "ring" else "all_gather"
        assert collective in report.text, (strategy, fn.__name__)


# -- each experiment's real train step ------------------------------------------------------


def _abstract(tree):
  return jax.eval_shape(lambda: tree)


def _lower_step(train_step, initial, batch, platform):
  """The experiment's jitted step (its shardings and donation) lowered for `platform`."""
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  lowered = lowering.lower(train_step.jitted, initial, _abstract(batch), key,
                           platform=platform)
  report = lowering.inspect(lowered, platform=platform)
  _check(report)
  return report


def _simclr(config_module, platform):
  from experiments import simclr_trainer  # noqa: PLC0415

  config = config_module.get_config()
  info, recipe, view_size = simclr_trainer.views(config)
  model = simclr_trainer.make_model(config)
  loss = losses.from_spec("free", num_candidates=2 * config.batch_size - 1)
  mesh = sharding.make_mesh()
  train_step = simclr_trainer.make_train_step(
      config, model, loss, mesh, functools.partial(augment.two_views, recipe=recipe,
                                                   out_size=view_size))

  def initial():
    views = jnp.zeros((2, *info.example_shape(view_size)), jnp.float32)
    variables = model.init(jax.random.key(0), views, train=False)
    tx = simclr_trainer.make_optimizer(config, batch_size=config.batch_size, steps_per_epoch=10)
    return state.create_train_state(
        model_params=variables["params"],
        model_state={k: v for k, v in variables.items() if k != "params"},
        mapping_params=loss.params, tx=tx)

  batch = {"image": np.zeros((config.batch_size, *info.example_shape()), np.uint8),
           "label": np.zeros((config.batch_size,), np.int32)}
  return _lower_step(train_step, jax.eval_shape(initial), batch, platform)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_simclr_resnet18_steps_lower_at_32_and_128_pixels(platform):
  from experiments.configs import simclr_cifar10, simclr_imagenette  # noqa: PLC0415

  for config_module, side in ((simclr_cifar10, 32), (simclr_imagenette, 128)):
    report = _simclr(config_module, platform)
    assert f"tensor<512x{side}x{side}x3xf32>" in report.text  # two views of 256 images


@pytest.mark.parametrize("platform", PLATFORMS)
def test_msc_step_lowers(platform):
  from experiments import msc, simclr_trainer  # noqa: PLC0415
  from experiments.configs import msc_cifar10  # noqa: PLC0415
  from tfcl_jax.anomaly import msc as msc_lib  # noqa: PLC0415

  config = msc_cifar10.get_config()
  info, recipe, view_size = simclr_trainer.views(config)
  encoder = models.make_backbone(config.backbone, width=config.width or None)
  mapping = mappings.from_spec("free")
  train_step = msc.make_train_step(
      config, encoder, mapping, sharding.make_mesh(),
      functools.partial(augment.two_views, recipe=recipe, out_size=view_size))

  def initial():
    views = jnp.zeros((2, *info.example_shape(view_size)), jnp.float32)
    variables = encoder.init(jax.random.key(0), views, train=False)
    params = {"model": variables["params"], "mapping": mapping.params}
    model_state = {k: v for k, v in variables.items() if k != "params"}
    features = encoder.apply(variables, views, train=False)
    return state.create_train_state(
        model_params=variables["params"],
        model_state={**model_state, msc_lib.CENTER_KEY: msc_lib.center(features)},
        mapping_params=mapping.params, tx=msc.make_optimizer(config, params, total_steps=10))

  batch = {"image": np.zeros((config.batch_size, *info.example_shape()), np.uint8)}
  _lower_step(train_step, jax.eval_shape(initial), batch, platform)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_grace_citeseer_step_lowers(platform):
  from experiments import grace  # noqa: PLC0415
  from experiments.configs import grace_citeseer  # noqa: PLC0415

  config = grace_citeseer.get_config()  # real CiteSeer, from the shared Planetoid files
  graph, batch = grace.load_graph(config)
  run = grace.Run("free", 0)
  model, objective, initial, _ = grace.build(config, graph, batch, run)
  mesh = sharding.make_mesh(jax.devices()[:config.num_devices])
  train_step = grace.make_train_step(config, model, objective, mesh)
  report = _lower_step(train_step, _abstract(initial), batch, platform)
  assert f"tensor<{graph.num_nodes}x" in report.text


@pytest.mark.parametrize("platform", PLATFORMS)
def test_dcrec_step_lowers_at_movielens_100k_shapes(platform):
  from experiments import dcrec  # noqa: PLC0415
  from experiments.configs import dcrec_ml100k  # noqa: PLC0415
  from tfcl_jax.data import movielens, sequences  # noqa: PLC0415
  from tfcl_jax.objectives import dcrec as dcrec_objective  # noqa: PLC0415

  # ML-100K's sizes (943 users, 1,682 items, ~100,000 ratings), random interactions.
  rng = np.random.default_rng(0)
  users = np.repeat(np.arange(943), 106)
  ratings = movielens.Ratings(user=users, item=rng.integers(0, 1682, users.size),
                              rating=np.ones(users.size, np.float32),
                              timestamp=np.arange(users.size), source="random")
  config = dcrec_ml100k.get_config()
  data = sequences.build_sequences(ratings, max_length=config.max_length)
  graphs = dcrec_objective.make_graphs(data, k=config.top_k, phase="train")
  model = dcrec.make_model(config, data)
  objective = losses.from_spec("free", num_candidates=config.batch_size)
  mesh = sharding.make_mesh(jax.devices()[:config.num_devices])
  train_step = dcrec.make_train_step(config, model, objective, graphs, mesh)
  example = next(dcrec.epoch_batches(data.train, batch_size=config.batch_size, seed=0, start=0,
                                     num_steps=1))
  initial = jax.eval_shape(functools.partial(
      dcrec.initial_state, config, model, objective, example, num_steps=10), jax.random.key(0))
  _lower_step(train_step, initial, example, platform)
