"""The engine's tile products, read from programs lowered for GPUs (`cuda`) and TPUs on this CPU
host (`training.lowering.matrix_products`), nothing run: every tile product takes the inputs'
own dtype (bfloat16 or float16 operands accumulated in float32; float32 and float64 keep theirs),
in every loss family, mode and mapping, single-device and sharded; and the products'
multiply-adds, counted from the program's shapes and loop trip counts, are what docs/losses.md
states: per tile, one product forward and three backward, two backward on the diagonal tiles of
`negatives="all"`, whose symmetric matrix is tiled once above the diagonal. The default run
reads the programs for TPUs (and a quick few mappings and dtypes); those for GPUs and the rest
are marked heavy.
"""

from __future__ import annotations

import collections

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from tests.helpers import dense_info_nce
from tests.helpers.marks import widest
from tfcl_jax import losses, mappings
from tfcl_jax.losses._engine import _blocks
from tfcl_jax.training import lowering

N, D, BANK = 16384, 256, 4096
PLATFORMS = ("cuda", "tpu")
LEARNABLE = mappings.learnable_temperature(tau=0.07)
MAPPINGS = {
    "free": mappings.temperature_free(),  # a closed form of exp(f)
    "tau": mappings.temperature(0.1),
    "learnable": LEARNABLE.bind(params=LEARNABLE.params),  # the generic path: autodiff of f
    "dynamic": mappings.dynamic_temperature(0.1, 0.2),
    "calibrated": mappings.calibrated_free(),  # one more forward pass: the batch's scale
}


def _view(dtype, rows=N):
  return jax.ShapeDtypeStruct((rows, D), dtype)


def _tile_products(fn, *args, platform):
  """The products of `fn`'s loss and gradient that multiply rows of `D` entries (the tiles'),
  as (operand dtypes, result dtype) -> multiply-adds over every execution."""
  grad = jax.value_and_grad(fn, argnums=tuple(range(len(args))))
  found = collections.Counter()
  for product in lowering.matrix_products(lowering.lower(grad, *args, platform=platform)):
    if D in product.shapes[0] or D in product.shapes[1]:
      found[product.operands, product.result] += product.total
  return found


def _losses(mapping):
  """Every family and mode as `(name, fn, arguments)` for views of a dtype."""
  def info_nce(**kwargs):
    return lambda a, b: losses.info_nce(a, b, mapping=mapping, **kwargs)

  return {
      "all": (info_nce(negatives="all"), 2),
      "cross": (info_nce(), 2),
      "two-tower": (info_nce(symmetric=True), 2),
      "cross+bank": (lambda a, b, k: losses.info_nce(a, b, mapping=mapping, extra_negatives=k),
                     3),
      "sigmoid": (lambda a, b: losses.sigmoid_loss(a, b, mapping=mapping), 2),
      "supcon": (lambda a: losses.supervised_info_nce(
          a, jnp.arange(N) % 100, mapping=mapping, form="supcon"), 1),
  }


def _arguments(count, dtype):
  return (_view(dtype), _view(dtype), _view(dtype, BANK))[:count]


@pytest.mark.parametrize("platform", widest(*PLATFORMS, quick=("tpu",)))
@pytest.mark.parametrize("mapping", widest(*sorted(MAPPINGS), quick=("free", "learnable")))
@pytest.mark.parametrize("dtype", widest("bfloat16", "float16", quick=("bfloat16",)))
def test_every_tile_product_takes_16_bit_operands_and_accumulates_in_float32(platform, mapping,
                                                                             dtype):
  for name, (fn, count) in _losses(MAPPINGS[mapping]).items():
    found = _tile_products(fn, *_arguments(count, jnp.dtype(dtype)), platform=platform)
    short = {"bfloat16": "bf16", "float16": "f16"}[dtype]
    assert set(found) == {((short, short), "f32")}, (name, dict(found))


@pytest.mark.parametrize("platform", widest(*PLATFORMS, quick=("tpu",)))
def test_float32_and_float64_inputs_keep_their_own_operands(platform):
  for name, (fn, count) in _losses(MAPPINGS["free"]).items():
    found = _tile_products(fn, *_arguments(count, jnp.float32), platform=platform)
    assert set(found) == {(("f32", "f32"), "f32")}, (name, dict(found))
  with jax.enable_x64(True):
    small = jax.ShapeDtypeStruct((512, D), jnp.float64)
    found = _tile_products(lambda a, b: losses.info_nce(a, b, negatives="all"), small, small,
                           platform=platform)
    assert set(found) == {(("f64", "f64"), "f64")}


@pytest.mark.parametrize("platform", widest(*PLATFORMS, quick=("tpu",)))
@pytest.mark.parametrize("dtype", widest("bfloat16", "float32", quick=("bfloat16",)))
def test_the_products_multiply_adds_are_those_docs_losses_states(platform, dtype):
  """At N = 16384, D = 256: `b` the tile side (`losses.auto_block_size` for the platform),
  `"all"` (`M = 2N` rows, `T = M / b` tiles a side) `(2 T^2 + T) b^2 D = 8 N^2 D + 2 N b D`;
  `cross` and CLIP's two-tower loss `4 N^2 D`; a bank of `K` rows `3 N K D` more (its tiles
  take no column gradient); SigLIP `4 N^2 D`; SupCon two symmetric reductions over `N` rows,
  `2 (2 N^2 D + N b D)`; a batch-scaled mapping one more forward over the tiles."""
  backend = {"cuda": "gpu", "tpu": "tpu"}[platform]
  block_all = losses.auto_block_size(2 * N, 2 * N, backend)
  block_n = losses.auto_block_size(N, N, backend)
  tiles = 2 * N // block_all
  expected = {
      "all": (2 * tiles**2 + tiles) * block_all**2 * D,
      "cross": 4 * N * N * D,
      "two-tower": 4 * N * N * D,
      "cross+bank": 4 * N * N * D + 3 * N * BANK * D,
      "sigmoid": 4 * N * N * D,
      "supcon": 2 * (2 * N * N * D + N * block_n * D),
  }
  assert expected["all"] == 8 * N * N * D + 2 * N * block_all * D
  for name, (fn, count) in _losses(MAPPINGS["free"]).items():
    found = _tile_products(fn, *_arguments(count, jnp.dtype(dtype)), platform=platform)
    assert sum(found.values()) == expected[name], (name, sum(found.values()) / (N * N * D))
  # The batch scale's pass: the forward products once more (`"all"`: T (T + 1) / 2 tiles).
  fn, count = _losses(MAPPINGS["calibrated"])["all"]
  found = _tile_products(fn, *_arguments(count, jnp.dtype(dtype)), platform=platform)
  assert sum(found.values()) == expected["all"] + tiles * (tiles + 1) // 2 * block_all**2 * D


@pytest.mark.parametrize("platform", widest(*PLATFORMS, quick=("tpu",)))
@pytest.mark.parametrize("strategy", ["all_gather", "ring"])
def test_the_sharded_forms_take_16_bit_operands(platform, strategy):
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  view = _view(jnp.bfloat16, 8 * 1024)
  for kwargs in (dict(negatives="all"), dict(symmetric=True), dict(negatives="cross")):
    def loss(a, b, kwargs=kwargs):
      return losses.info_nce_on_mesh(a, b, mesh=mesh, axis_name="data", strategy=strategy,
                                     **kwargs)

    found = _tile_products(loss, view, view, platform=platform)
    assert set(found) == {(("bf16", "bf16"), "f32")}, (kwargs, dict(found))
    def sigmoid(a, b):
      return losses.sigmoid_loss_on_mesh(a, b, mesh=mesh, axis_name="data", strategy=strategy)

  assert set(_tile_products(sigmoid, view, view, platform=platform)) == {
      (("bf16", "bf16"), "f32")}


def test_a_bfloat16_batch_against_a_float32_bank_takes_float32_unit_rows():
  found = _tile_products(
      lambda a, b, k: losses.info_nce(a, b, extra_negatives=k),
      _view(jnp.bfloat16), _view(jnp.bfloat16), _view(jnp.float32, BANK), platform="cuda")
  assert set(found) == {(("bf16", "bf16"), "f32"), (("f32", "f32"), "f32")}
  assert found[("f32", "f32"), "f32"] == 3 * N * BANK * D  # the bank's tiles only


def test_on_a_cpu_negatives_all_is_one_scan_its_diagonal_tiles_whole():
  """docs/losses.md: on a CPU the tiles on and above the diagonal of `"all"` share one scan (the
  diagonal tiles computed whole, 4 products each): `(2 T^2 + 2 T) b^2 D = 8 N^2 D + 4 N b D`,
  one tile loop forward and one backward; on GPU and TPU the diagonal tiles take a scan of
  their own (two loops each way)."""
  view = _view(jnp.float32)
  fn = _losses(MAPPINGS["free"])["all"][0]
  block = losses.auto_block_size(2 * N, 2 * N, "cpu")
  tiles = 2 * N // block
  found = _tile_products(fn, view, view, platform="cpu")
  assert sum(found.values()) == (2 * tiles**2 + 2 * tiles) * block**2 * D
  assert sum(found.values()) == 8 * N * N * D + 4 * N * block * D
  grad = jax.value_and_grad(fn, argnums=(0, 1))
  loops = {platform: lowering.lower(grad, view, view, platform=platform).as_text().count(
      "stablehlo.while") for platform in ("cpu", "cuda", "tpu")}
  assert loops == {"cpu": 2, "cuda": 4, "tpu": 4}


@pytest.mark.parametrize("apart", widest(False, True, quick=(True,)))  # False: every CPU test
@pytest.mark.parametrize("block_size", widest(3, 4, 7, quick=(4,)))
def test_both_places_of_the_diagonal_tiles_equal_dense_autodiff(apart, block_size, monkeypatch):
  """`negatives="all"` with the diagonal tiles in the one scan (a CPU's choice) and in a scan
  of their own (GPU's and TPU's), run on a CPU host: loss and gradients of a closed form, a
  fixed, a learnable and a dynamic temperature against autodiff of the dense `[2N, 2N]`
  logits, with tiles that divide the rows and tiles that do not."""
  monkeypatch.setitem(_blocks._DIAGONAL_APART, "cpu", apart)
  rng = np.random.default_rng(7)
  z1 = rng.normal(size=(11, 6))
  z2 = z1 + 0.3 * rng.normal(size=z1.shape)
  with jax.enable_x64(True):
    learnable = mappings.learnable_temperature(tau=0.07)  # its `t` in float64
    logits_of = {
        "free": (mappings.temperature_free(), lambda c: jnp.log1p(c) - jnp.log1p(-c)),
        "tau": (mappings.temperature(0.1), lambda c: c / 0.1),
        "learnable": (learnable.bind(params=learnable.params),
                      lambda c: c * jnp.exp(learnable.params["t"])),
        "dynamic": (mappings.dynamic_temperature(0.1, 0.3), lambda c: c / jax.lax.stop_gradient(
            0.1 + 0.1 * (1 + jnp.cos(jnp.pi * (1 + c))))),
    }
    @jax.jit
    def run(z1, z2):
      out = {}
      for name, (mapping, reference) in logits_of.items():
        def ours(a, b, mapping=mapping):
          return losses.info_nce(a, b, mapping=mapping, negatives="all", block_size=block_size)

        def dense(a, b, reference=reference):
          return dense_info_nce.row_losses(a, b, reference, "all").mean()

        out[name] = (jax.value_and_grad(ours, argnums=(0, 1))(z1, z2),
                     jax.value_and_grad(dense, argnums=(0, 1))(z1, z2))
      return out

    for name, (got, expected) in run(z1, z2).items():
      chex.assert_trees_all_close(got, expected, rtol=1e-9, atol=1e-11, custom_message=name)
