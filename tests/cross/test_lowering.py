"""Every loss and every experiment's train step lowers for GPUs (`cuda`) and TPUs from this CPU
host (`tfcl_jax.training.lowering`), nothing is run: the Pallas path as compiled kernels
(Triton's on `cuda`, Mosaic's on `tpu`: their custom calls, not Pallas's interpreter), nothing
in float64, no host callbacks or CPU-only calls; the kernels also with `jax_enable_x64` on.
Sizes are those users run: N up to 2^17, D = 128 and 768, float32 and bfloat16. The experiments'
whole steps and all but a quick few cases of each matrix are marked heavy (CI's second step runs
them)."""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from experiments import registry
from experiments.framework import cli
from tests.helpers.marks import widest, widest_cases
from tfcl_jax import losses, mappings
from tfcl_jax.training import lowering, sharding

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLATFORMS = ("cuda", "tpu")
MAPPINGS = {
    "tau": mappings.temperature(0.1),
    "free": mappings.temperature_free(),
    "learnable": mappings.learnable_temperature(tau=0.07),
    "clip": mappings.learnable_temperature(tau=0.07, max_scale=100.0),
    "dynamic": mappings.dynamic_temperature(0.1, 0.2),
    "annealed": mappings.from_spec("anneal=cosine:0.5:0.1:1000").bind(step=jnp.int32(10)),
    "learnable_free": mappings.learnable_free(max_scale=100.0),
    "free_n": mappings.n_aware_free(num_candidates=1999),
}
MODES = {
    "all": dict(negatives="all"),
    "cross": dict(negatives="cross"),
    "two-tower": dict(negatives="cross", symmetric=True),
    "cross+bank": dict(negatives="cross", bank=True),
    "two-tower+bank": dict(negatives="cross", symmetric=True, bank=True),
}
# Kernels in loss + gradient on TPUs (Mosaic): the in-batch forward (one per direction) and the
# row and column gradient kernels, and for a bank its forward and row-gradient kernels once per
# anchor side.
KERNELS = {"all": 2, "cross": 3, "two-tower": 4, "cross+bank": 5, "two-tower+bank": 8}
BANK = 4096


def expected_kernels(mode: str, platform: str, mapping) -> int:
  """`KERNELS` on TPUs. On GPUs (Triton, `_triton_tiles.COLUMN_SIDE`'s default: tiles that
  serve both their sides forward, separate row and column kernels backward) the same, except
  that with a closed form (`Mapping.exp_form`) one forward kernel serves both directions of the
  two-tower loss."""
  closed_form = mapping.exp_form(jnp.float32) is not None
  paired = platform != "tpu" and closed_form and mode.startswith("two-tower")
  return KERNELS[mode] - paired


def _check(report: lowering.LoweringReport, *, kernels: int = 0, x64: bool = False):
  if x64:  # Python floats become float64 scalars, converted where used; no float64 array
    assert report.problems() in ([], [f"{report.float64} float64 tensor types"])
    assert not re.search(r"tensor<[0-9x]+xf64>", report.text)
  else:
    assert report.problems() == [], report.problems()
  assert report.kernels == kernels, report.custom_calls
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


# The mapping is code inside the tile, the mode the kernels around it: each mapping lowers in two
# modes, the k-th mapping in mode k for GPUs and in mode k + 2 for TPUs (cyclically), both by each
# implementation. Every mapping and every mode is so lowered for both platforms by both
# implementations, and every mode with three or four mappings. The kernels lower with
# `jax_enable_x64` on for every other mapping (x64 in the id): every mode on each platform, and
# every platform in each mode, both ways.
_MODE_NAMES = list(MODES)
CASES = [(name, _MODE_NAMES[(k + shift) % len(MODES)], implementation, platform,
          implementation == "pallas" and k % 2 == 1)
         for k, name in enumerate(MAPPINGS)
         for shift, platform in zip((0, 2), PLATFORMS, strict=True)
         for implementation in ("xla", "pallas")]
# The default run's few: the kernels for each platform (x64 on and off, the paired two-tower
# forward on GPUs), a bank, and the XLA path.
QUICK_CASES = [("tau", "all", "pallas", "cuda", False),
               ("free_n", "two-tower", "pallas", "cuda", True),
               ("dynamic", "cross", "pallas", "tpu", False),
               ("clip", "all", "pallas", "tpu", True),
               ("free", "cross+bank", "xla", "tpu", False)]


@pytest.mark.parametrize("name, mode, implementation, platform, x64",
                         widest_cases(*CASES, quick=QUICK_CASES),
                         ids=["-".join(case[:4]) + ("-x64" if case[4] else "") for case in CASES])
def test_info_nce_every_mapping_and_mode_lowers(name, mode, implementation, platform, x64):
  with jax.enable_x64(x64):
    report = _info_nce_report(MAPPINGS[name], mode, implementation, 1000, 768, jnp.float32,
                              platform)
  _check(report, kernels=expected_kernels(mode, platform, MAPPINGS[name])
         if implementation == "pallas" else 0, x64=x64)


SIZES = [(n, d, dtype) for n in (1000, 4096, 2**17) for d in (128, 768)
         for dtype in (jnp.float32, jnp.bfloat16)]


def _size_platform(index: int) -> str:
  """The platform the `index`-th size lowers for: each N for both, each D and each dtype for
  both (D = 128 in float32 and D = 768 in bfloat16 for GPUs, the other two for TPUs)."""
  return PLATFORMS[(index + index // 2) % 2]


# The default run's one: the largest N.
@pytest.mark.parametrize("n, d, dtype", widest_cases(*SIZES, quick=[(2**17, 128, jnp.float32)]),
                         ids=[f"{n}x{d}-{jnp.dtype(t).name}" for n, d, t in SIZES])
def test_info_nce_every_size_lowers(n, d, dtype):
  index = SIZES.index((n, d, dtype))
  mode, platform = ("all", "cross", "two-tower")[index % 3], _size_platform(index)
  # The kernels with x64 on at (1000, 768), (4096, 128), (2^17, 768), both dtypes: each N, D,
  # dtype and platform.
  x64 = (index // 2 + index // 4) % 2 == 1
  for implementation in ("xla", "pallas"):
    x64_here = x64 and implementation == "pallas"
    with jax.enable_x64(x64_here):
      report = _info_nce_report(MAPPINGS["free"], mode, implementation, n, d, dtype, platform)
    _check(report, kernels=expected_kernels(mode, platform, MAPPINGS["free"])
           if implementation == "pallas" else 0, x64=x64_here)


def test_pallas_is_interpreted_when_lowered_for_the_cpu():
  report = _info_nce_report(MAPPINGS["clip"], "two-tower", "pallas", 1000, 128, jnp.float32,
                            "cpu")
  assert report.kernels == 0 and "stablehlo.while" in report.text


def test_default_tiles_follow_the_platform_lowered_for():
  # 8192 rows: tiles of 512 on CPU, of 4096 on GPU and TPU (losses.auto_block_size).
  for platform, tile in (("cpu", 512), ("cuda", 4096), ("tpu", 4096)):
    report = _info_nce_report(MAPPINGS["free"], "cross", "xla", 8192, 128, jnp.float32,
                              platform)
    assert f"tensor<{tile}x{tile}xf32>" in report.text, platform
    assert "tensor<8192x8192xf32>" not in report.text


SIGMOID_SPECS = ("sigmoid/free", "sigmoid/tau=0.5/learn_b=prior",
                 "sigmoid/learnable=0.1/learn_b=siglip", "sigmoid/dynamic=0.1:0.2")


# The default run's two: each loss lowered for both platforms.
@pytest.mark.parametrize("n, d, dtype", widest_cases(*SIZES, quick=SIZES[:2]),
                         ids=[f"{n}x{d}-{jnp.dtype(t).name}" for n, d, t in SIZES])
def test_sigmoid_and_supervised_losses_lower(n, d, dtype):
  index = SIZES.index((n, d, dtype))
  view = jax.ShapeDtypeStruct((n, d), dtype)
  spec, negatives = SIGMOID_SPECS[index % 4], ("all", "cross")[index % 2]
  loss = losses.from_spec(spec, num_candidates=n)

  def sigmoid(z1, z2, params):
    return loss(z1, z2, params=params, negatives=negatives)

  def supervised(z, mapping):
    return losses.supervised_info_nce(z, jnp.arange(z.shape[0]) % 100, mapping=mapping)

  mapping = MAPPINGS[("tau", "free", "clip")[index % 3]]
  # One platform each, swapped from size to size: every spec, negatives, mapping and N lowers for
  # both.
  first = (index % 4 + index // 4) % 2
  sigmoid_platform, supervised_platform = PLATFORMS[first], PLATFORMS[1 - first]
  _check(lowering.inspect(lowering.lower(jax.value_and_grad(sigmoid, argnums=(0, 1, 2)),
                                         view, view, loss.params, platform=sigmoid_platform),
                          platform=sigmoid_platform))
  _check(lowering.inspect(lowering.lower(jax.value_and_grad(supervised, argnums=(0, 1)),
                                         view, mapping, platform=supervised_platform),
                          platform=supervised_platform))


@pytest.mark.parametrize("platform", widest(*PLATFORMS, quick=("tpu",)))
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


def _lower_step(name, config, mesh, platform, **options):
  """Experiment `name`'s jitted step (its shardings and donation, `Experiment.abstract_step`)
  lowered for `platform`."""
  train_step, inputs = registry.get(name).abstract_step(config, mesh, **options)
  report = lowering.inspect(lowering.lower(train_step, *inputs, platform=platform),
                            platform=platform)
  _check(report)
  return report


@pytest.mark.heavy  # an experiment's whole step: in CI's heavy run
@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("module", registry.modules())  # found without importing them
def test_every_experiments_step_lowers_at_its_first_config(module, platform):
  """Each registered experiment with an `abstract_step`, at its first config: a new experiment's
  step is lowered here without a test of its own (the tests below add the sizes users run)."""
  experiment = registry.load(module)
  if experiment.abstract_step is None:
    pytest.skip(f"{module} has no train step to lower")
  config = cli.load_config(os.path.join(ROOT, experiment.configs[0]))
  devices = jax.devices()[:config.num_devices] if config.get("num_devices") else None
  try:
    _lower_step(experiment.name, config, sharding.make_mesh(devices), platform)
  except FileNotFoundError as error:
    if not experiment.reads_files:
      raise
    pytest.skip(f"{experiment.configs[0]} names files that are absent here: {error}")


@pytest.mark.heavy  # an experiment's whole step: in CI's heavy run
@pytest.mark.parametrize("platform", PLATFORMS)
def test_simclr_resnet18_steps_lower_at_32_and_128_pixels(platform):
  from experiments.configs import simclr_cifar10, simclr_imagenette  # noqa: PLC0415

  for config_module, side in ((simclr_cifar10, 32), (simclr_imagenette, 128)):
    report = _lower_step("simclr", config_module.get_config(), sharding.make_mesh(), platform)
    assert f"tensor<512x{side}x{side}x3xf32>" in report.text  # two views of 256 images


@pytest.mark.heavy  # an experiment's whole step: in CI's heavy run
@pytest.mark.parametrize("platform", PLATFORMS)
def test_msc_step_lowers(platform):
  from experiments.configs import msc_cifar10  # noqa: PLC0415

  _lower_step("msc", msc_cifar10.get_config(), sharding.make_mesh(), platform)


@pytest.mark.heavy  # an experiment's whole step: in CI's heavy run
@pytest.mark.parametrize("platform", PLATFORMS)
def test_grace_citeseer_step_lowers(platform):
  from experiments.configs import grace_citeseer  # noqa: PLC0415

  config = grace_citeseer.get_config()  # real CiteSeer, from the shared Planetoid files
  if not os.path.isdir(config.data_dir):
    pytest.skip(f"Planetoid files not found at {config.data_dir}")
  mesh = sharding.make_mesh(jax.devices()[:config.num_devices])
  report = _lower_step("grace", config, mesh, platform)
  assert "tensor<3327x" in report.text  # CiteSeer's nodes


@pytest.mark.heavy  # an experiment's whole step: in CI's heavy run
@pytest.mark.parametrize("platform", PLATFORMS)
def test_dcrec_step_lowers_at_movielens_100k_shapes(platform):
  from experiments.configs import dcrec_ml100k  # noqa: PLC0415

  config = dcrec_ml100k.get_config()
  mesh = sharding.make_mesh(jax.devices()[:config.num_devices])
  _lower_step("dcrec", config, mesh, platform)


@pytest.mark.heavy  # an experiment's whole step: in CI's heavy run
@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("form", ["supcon", "ntxent"])
def test_supcon_steps_lower(platform, form):
  from experiments.configs import supcon_mnist1d  # noqa: PLC0415

  config = supcon_mnist1d.get_config()
  config.form = form
  report = _lower_step("simclr", config, sharding.make_mesh(), platform, spec="learnable=0.07")
  assert "tensor<512x40x1xf32>" in report.text  # two views of 256 signals


@pytest.mark.heavy  # an experiment's whole step: in CI's heavy run
@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("preset, spec", [("tutorial", "clip:learnable=0.07:100"),
                                          ("tutorial", "dot+logq"),
                                          ("features", "sigmoid/learnable=0.1/learn_b=siglip")])
def test_retrieval_steps_lower(platform, preset, spec):
  from experiments.configs import retrieval_ml100k  # noqa: PLC0415

  config = retrieval_ml100k.get_config(preset)
  report = _lower_step("retrieval", config, sharding.make_mesh(), platform, spec=spec)
  assert f"tensor<{config.batch_size}xi32>" in report.text  # the batch's user rows
