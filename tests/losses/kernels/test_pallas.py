"""The fused kernels (`info_nce(..., implementation="pallas")`, interpreted on CPU) against the
XLA engine and a NumPy reference: values and gradients (embeddings and the mapping's parameters),
ragged N and D, D held whole and in chunks, masks, extra negatives, every mapping with scalar
parameters, bfloat16 inputs (raw rows in the kernels), with `jax_enable_x64` off and on (float64
inputs refused); the Triton backend (GPUs, what a CPU runs) and the Mosaic backend (TPUs, forced
here); and the refusal, naming the XLA path, where Pallas's Triton backend is missing."""

from __future__ import annotations

import collections
import contextlib
import functools
import subprocess
import sys
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.marks import widest_cases
from tfcl_jax import losses, mappings, schedules
from tfcl_jax.losses._kernels import _kernel_tpu, _pallas, _triton_blocks, _triton_tiles

# 37 rows in blocks of 16 (ragged, padded inside); D = 70, padded with zeros to 128 and held
# whole; WIDE = 300 is walked in chunks (of 64 in float32, of 128 for bfloat16 inputs).
N, D, BANK, WIDE = 37, 70, 19, 300
SCHEDULE = schedules.linear(tau_start=0.5, tau_end=0.1, steps=10)

# Built where they are used: under `jax_enable_x64` a parameter is float64.
MAPPINGS = {
    "tau": lambda: mappings.temperature(0.2),
    "free": mappings.temperature_free,
    "learnable": lambda: mappings.learnable_temperature(tau=0.3),
    "learnable_capped": lambda: mappings.learnable_temperature(tau=0.001, max_scale=100.0),
    "dynamic": lambda: mappings.dynamic_temperature(0.1, 0.2),
    "annealed": lambda: mappings.annealed_temperature(SCHEDULE).bind(step=3),
}
MODES = {
    "cross": dict(negatives="cross"),
    "symmetric": dict(negatives="cross", symmetric=True),
    "all": dict(negatives="all"),
    "all-masked": dict(negatives="all", masked=True),
    "cross-masked-bank": dict(negatives="cross", masked=True, bank=True),
    "symmetric-bank": dict(negatives="cross", symmetric=True, bank=True),
    "all-bank": dict(negatives="all", bank=True),
}


def _views(dtype=jnp.float32, dim=D, rows=N):
  z1 = jax.random.normal(jax.random.key(0), (rows, dim), jnp.float32)
  z2 = z1 + 0.8 * jax.random.normal(jax.random.key(1), (rows, dim), jnp.float32)
  bank = jax.random.normal(jax.random.key(2), (BANK, dim), jnp.float32)
  return z1.astype(dtype), z2.astype(dtype), (jnp.arange(rows) % 5) != 2, bank.astype(dtype)


VARIANTS = _triton_tiles.COLUMN_SIDES  # how the Triton kernels send a tile's column side
_SEEN = collections.Counter()


def _settings(cases):
  """Each case with its `(variant, x64)`: a mode's cases take the variants in turn across the
  float32 lists below (with the bfloat16 cases', chosen by hand, a covering design: every
  variant meets every mode, closed forms and generic mappings, bfloat16;
  `test_the_cases_cover_every_variant` checks it) and `jax_enable_x64` is on in every other
  case of a list (float32 tile math and int32 indices with it too)."""
  out = []
  for k, case in enumerate(cases):
    out.append((*case, VARIANTS[_SEEN[case[1]] % len(VARIANTS)], k % 2 == 1))
    _SEEN[case[1]] += 1
  return out


def _with_x64(cases):
  return [(*case, k % 2 == 1) for k, case in enumerate(cases)]


def _ids(cases):
  return ["-".join(str(x) for x in case[:-1]) + ("-x64" if case[-1] else "") for case in cases]


@contextlib.contextmanager
def _setting(variant: str, x64: bool):
  with jax.enable_x64(x64), mock.patch.dict(_triton_tiles.COLUMN_SIDE, forward=variant,
                                            backward=variant):
    yield


def _pallas_equals_xla(name, mode, *, rows=N, dtype=jnp.float32, dim=D, atol=1e-5, rtol=1e-5):
  """Values and gradients (both views, the mapping's parameters) of `rows` pairs (one in five
  masked) in `mode`, Pallas against the XLA engine; `(got, expected)`."""
  z1, z2, where, bank = _views(dtype, dim, rows)
  grad = jax.jit(_grad(MODES[mode], where, bank), static_argnums=3)
  expected, got = (grad(z1, z2, MAPPINGS[name](), implementation)
                   for implementation in ("xla", "pallas"))
  chex.assert_trees_all_close(got, expected, atol=atol, rtol=rtol)
  return got, expected


def _kwargs(mode, where, bank):
  mode = dict(mode)
  if mode.pop("masked", False):
    mode["where"] = where
  if mode.pop("bank", False):
    mode["extra_negatives"] = bank
    mode["extra_where"] = jnp.arange(BANK) % 4 != 1
  return mode


def _grad(mode, where, bank):
  """The value and the gradients of both views and of the mapping's params (a step, an integer,
  takes none)."""
  def loss(a, b, params, mapping, implementation):
    return losses.info_nce(a, b, mapping=mapping.bind(params=params), block_size=16,
                           implementation=implementation, **_kwargs(mode, where, bank))

  grad = jax.value_and_grad(loss, argnums=(0, 1, 2))
  return lambda a, b, mapping, implementation: grad(a, b, mapping.params, mapping, implementation)


# Every mapping on the two hardest modes (masked NT-Xent; the two-tower loss with a bank),
# every mode under the learnable mapping (its parameter's gradient takes every path).
CASES = _settings([(name, "all-masked") for name in MAPPINGS]
                  + [(name, "symmetric-bank") for name in MAPPINGS if name != "learnable"]
                  + [("learnable", mode) for mode in MODES if mode != "all-masked"])


@pytest.mark.heavy
@pytest.mark.parametrize("name, mode, variant, x64", CASES, ids=_ids(CASES))
def test_pallas_equals_xla_values_and_gradients(name, mode, variant, x64):
  with _setting(variant, x64):
    _pallas_equals_xla(name, mode)


# Tiles that serve both their sides: `all`'s pairs of blocks once each (an even number of
# blocks has pairs at distance nb / 2, formed by one program of the two), the two-tower loss's
# columns from the row pass (closed forms: tau, free); mappings with and without a closed form.
EVEN_CASES = _settings([("free", "all", 48), ("learnable", "all-masked", 64),
                       ("tau", "symmetric", 64), ("dynamic", "cross-masked-bank", 64),
                       ("free", "symmetric", 16), ("tau", "all", 64), ("free", "cross", 64)])


# The default run's two: `all`'s pairs of blocks, the one-directional loss's columns.
@pytest.mark.parametrize("name, mode, rows, variant, x64",
                         widest_cases(*EVEN_CASES, quick=[EVEN_CASES[0], EVEN_CASES[6]]),
                         ids=_ids(EVEN_CASES))
def test_pallas_equals_xla_on_even_numbers_of_blocks(name, mode, rows, variant, x64):
  with _setting(variant, x64):
    _pallas_equals_xla(name, mode, rows=rows)


# The TPU kernels (blocks of 128 rows: 37 rows padded to one block, 150 to two).
TPU_CASES = _with_x64([(name, "all-masked", N) for name in ("free", "learnable_capped", "annealed")]
                      + [("learnable", mode, 150) for mode in ("cross", "symmetric-bank",
                                                               "all-bank")]
                      + [("dynamic", "cross-masked-bank", 150)])


# The default run's two: one block masked with a closed form, two blocks with a bank and x64.
@pytest.mark.parametrize("name, mode, rows, x64",
                         widest_cases(*TPU_CASES, quick=[TPU_CASES[0], TPU_CASES[5]]),
                         ids=_ids(TPU_CASES))
def test_tpu_kernels_equal_xla_values_and_gradients(name, mode, rows, x64, monkeypatch):
  monkeypatch.setattr(_pallas, "pallas_reduce",
                      functools.partial(_pallas.pallas_reduce, backend="mosaic_tpu"))
  with jax.enable_x64(x64):
    _pallas_equals_xla(name, mode, rows=rows)


@pytest.mark.parametrize("x64", [False, True])
def test_a_traced_temperature_closed_over_by_the_map_gets_its_gradient(x64):
  # A schedule evaluated outside the loss: the mapping closes over a traced tau (float64 with
  # x64 on: the kernels take it in float32).
  z1, z2, _, _ = _views()

  def loss(tau, implementation):
    return losses.info_nce(z1, z2, mapping=mappings.temperature(tau), negatives="all",
                           block_size=16, implementation=implementation)

  with jax.enable_x64(x64):
    expected, got = (jax.jit(jax.value_and_grad(loss), static_argnums=1)(0.3, implementation)
                     for implementation in ("xla", "pallas"))
  chex.assert_trees_all_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("negatives", ["all", "cross"])
def test_float64_inputs_are_refused_naming_the_xla_implementation(negatives):
  with jax.enable_x64(True):
    z1, z2, _, _ = _views(jnp.float64)
    with pytest.raises(ValueError, match="float64.*implementation='xla'"):
      losses.info_nce(z1, z2, negatives=negatives, implementation="pallas", block_size=16)
    with pytest.raises(ValueError, match="float64.*implementation='xla'"):
      losses.info_nce(z1.astype(jnp.float32), z2, negatives="cross", implementation="pallas",
                      block_size=16)


# bfloat16 inputs reach the Triton kernels raw (bfloat16 products, float32 inverse norms),
# except against a bank (unit rows there): every mode, ragged D and chunked D.
# Per variant: `all` and the two-tower loss, each with a closed form and a generic mapping.
BF16_CASES = _with_x64([
    ("free", "symmetric", D, "separate"), ("learnable", "symmetric-bank", WIDE, "separate"),
    ("tau", "all-masked", D, "separate"), ("learnable", "all-bank", D, "separate"),
    ("free", "symmetric-bank", D, "partials"), ("dynamic", "symmetric", WIDE, "partials"),
    ("free", "all-bank", D, "partials"), ("learnable", "all-masked", D, "partials"),
    ("free", "symmetric", WIDE, "atomic"), ("learnable", "symmetric", D, "atomic"),
    ("tau", "all-bank", WIDE, "atomic"), ("dynamic", "all", D, "atomic"),
    ("dynamic", "cross-masked-bank", D, "atomic"), ("learnable", "cross", D, "atomic")])


@pytest.mark.heavy
@pytest.mark.parametrize("name, mode, dim, variant, x64", BF16_CASES, ids=_ids(BF16_CASES))
def test_bfloat16_inputs_equal_the_xla_engine(name, mode, dim, variant, x64):
  with _setting(variant, x64):
    # Gradients within bfloat16's rounding (the kernels' tile cotangents are bfloat16 in the
    # products)...
    got, expected = _pallas_equals_xla(name, mode, dtype=jnp.bfloat16, dim=dim, atol=2e-3,
                                       rtol=2e-2)
  assert got[1][0].dtype == jnp.bfloat16
  # ... and the loss as exact as float32's.
  np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)


def test_bfloat16_cosines_are_not_rounded_to_bfloat16():
  # NumPy float64 on the bfloat16 inputs: the kernels' loss agrees to float32's precision,
  # where rounding the unit rows to bfloat16 would move it by ~1e-3.
  z1, z2, _, _ = _views(jnp.bfloat16)
  u = np.concatenate([z1, z2]).astype(np.float64)
  u /= np.linalg.norm(u, axis=1, keepdims=True)
  logits = (u @ u.T) / 0.2
  np.fill_diagonal(logits, -np.inf)
  positive = (np.arange(2 * N) + N) % (2 * N)
  lse = np.log(np.exp(logits).sum(axis=1))
  expected = np.mean(lse - logits[np.arange(2 * N), positive])
  got = losses.info_nce(z1, z2, mapping=MAPPINGS["tau"](), negatives="all",
                        implementation="pallas", block_size=16)
  np.testing.assert_allclose(got, expected, rtol=2e-6)


def test_zero_rows_in_bfloat16_have_finite_gradients_like_the_xla_engine():
  z1, z2, _, _ = _views(jnp.bfloat16)
  z1 = z1.at[4].set(0.0)
  grad = jax.jit(_grad(MODES["all"], None, None), static_argnums=3)
  expected, got = (grad(z1, z2, MAPPINGS["learnable"](), implementation)
                   for implementation in ("xla", "pallas"))
  chex.assert_tree_all_finite(got)
  # The zero row's gradient is the others' scaled by 1 / floor = 2^40: its bfloat16
  # rounding is measured against its own size.
  zero_row, expected_row = (np.asarray(g[1][0][4], np.float32) for g in (got, expected))
  assert np.max(np.abs(zero_row - expected_row)) < 0.1 * np.max(np.abs(expected_row))
  others = [(g[0], g[1][0].at[4].set(0), g[1][1], g[1][2]) for g in (got, expected)]
  chex.assert_trees_all_close(*others, atol=2e-3, rtol=2e-2)


WIDE_CASES = _settings([("learnable", "all"), ("learnable", "symmetric"), ("free", "all")])


@pytest.mark.parametrize("name, mode, variant, x64",
                         widest_cases(*WIDE_CASES, quick=WIDE_CASES[2:]), ids=_ids(WIDE_CASES))
def test_wide_float32_embeddings_in_chunks_equal_the_xla_engine(name, mode, variant, x64):
  with _setting(variant, x64):
    _pallas_equals_xla(name, mode, dim=WIDE)


def test_the_cases_cover_every_variant():
  # Each variant meets every mode, and, where a tile can serve both its sides, a closed form
  # (pair forwards) and a generic mapping (pair backwards only) in float32 and bfloat16.
  triton = ([(n, m, "float32", v) for n, m, v, _ in CASES + WIDE_CASES]
            + [(n, m, "float32", v) for n, m, _, v, _ in EVEN_CASES]
            + [(n, m, "bfloat16", v) for n, m, _, v, _ in BF16_CASES])
  met = {(variant, mode) for _, mode, _, variant in triton}
  assert met == {(v, m) for v in VARIANTS for m in MODES}, sorted(met)
  closed = {(variant, MODES[mode]["negatives"], MODES[mode].get("symmetric", False),
             name in ("tau", "free"), dtype) for name, mode, dtype, variant in triton}
  for variant in VARIANTS:
    for paired in (("all", False), ("cross", True)):
      for dtype in ("float32", "bfloat16"):
        assert {(variant, *paired, True, dtype), (variant, *paired, False, dtype)} <= closed, (
            variant, paired, dtype)


def test_pallas_equals_numpy_nt_xent():
  z1, z2, _, _ = _views()
  u = np.concatenate([z1, z2]).astype(np.float64)
  u /= np.linalg.norm(u, axis=1, keepdims=True)
  logits = np.log1p(u @ u.T) - np.log1p(-np.clip(u @ u.T, -1, 1 - 1e-12))  # 2 artanh
  np.fill_diagonal(logits, -np.inf)
  positive = (np.arange(2 * N) + N) % (2 * N)
  lse = np.log(np.exp(logits).sum(axis=1))
  expected = np.mean(lse - logits[np.arange(2 * N), positive])
  got = losses.info_nce(z1, z2, negatives="all", implementation="pallas", block_size=16)
  np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_tiles_are_powers_of_two_on_gpus_and_lane_multiples_on_tpus():
  for rows, dim, block_size in [(37, 70, 16), (1000, 128, None), (4096, 768, None),
                                (2**17, 256, 1000), (5, 3, None)]:
    for dtype, width in ((jnp.float32, 4), (jnp.bfloat16, 2)):
      tiles = _triton_tiles.tiles(rows, rows, dim, block_size, dtype)
      whole = max(16, 1 << (dim - 1).bit_length())  # D rounded up to a power of two
      for family in _triton_tiles.ROLES:
        launch, table = getattr(tiles, family), _triton_tiles.LAUNCH[family, width]
        assert launch.block & (launch.block - 1) == 0 and launch.block_d & (launch.block_d - 1) == 0
        assert min(launch.block, launch.block_d) >= _triton_tiles.SMALLEST_BLOCK
        # D held whole (one product per tile) up to the family's step, in steps beyond.
        assert launch.block_d == min(whole, table.block_d)
        assert tiles.dim % launch.block_d == 0 and tiles.block % launch.block == 0
        assert launch.block <= (table.block if block_size is None else max(block_size, 16))
      assert dim <= tiles.padded_dim(dim) < dim + max(whole, 64)
    tpu = _kernel_tpu.tiles(rows, rows, dim, block_size)
    assert tpu.block % 128 == 0 and tpu.padded_dim(dim) == dim


def test_splits_give_every_sm_two_programs_where_the_columns_allow():
  # 264 programs: two per SM of an H100 or H200.
  for rows, cols, parts in [(64, 64, 8), (128, 128, 4), (264, 512, 1), (32, 3, 1), (16, 4, 4)]:
    assert _triton_tiles.splits(rows, cols, 264) == parts
    assert cols % parts == 0


def test_bad_implementation_block_size_and_unsupported_mapping():
  z1, z2, _, _ = _views()
  with pytest.raises(ValueError, match="implementation"):
    losses.info_nce(z1, z2, implementation="triton")
  with pytest.raises(ValueError, match="block_size must be >= 16"):
    losses.info_nce(z1, z2, implementation="pallas", block_size=8)
  vector_params = mappings.Mapping("vec", lambda c, p, s: c * p["w"][0], {"w": jnp.ones(2)})
  with pytest.raises(ValueError, match="params are scalars"):
    losses.info_nce(z1, z2, mapping=vector_params.bind(params=vector_params.params),
                    implementation="pallas")
  table = jnp.array([2.0, 0.5])
  closes_over_array = mappings.Mapping("table", lambda c, p, s: c * table[0] + table[1])
  with pytest.raises(ValueError, match="closes over scalars only"):
    jax.jit(lambda a, b: losses.info_nce(a, b, mapping=closes_over_array, block_size=16,
                                         implementation="pallas"))(z1, z2)


# -- without Pallas's Triton backend (deprecated from jax 0.11.2, to be removed) ---------------


@pytest.fixture
def triton_check():
  """`_triton_blocks.unavailable` decided afresh in the test, and afresh after it."""
  _triton_blocks.unavailable.cache_clear()
  yield
  _triton_blocks.unavailable.cache_clear()


def test_tfcl_jax_imports_and_runs_xla_without_pallas_triton():
  # A fresh process whose jax has no Pallas Triton backend (its import fails).
  code = ("import sys; sys.modules['jax.experimental.pallas.triton'] = None\n"
          "import jax\nfrom tfcl_jax import losses\n"
          "z = jax.random.normal(jax.random.key(0), (8, 4))\n"
          "print(float(losses.info_nce(z, z + 1.0)))\n")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stderr
  assert np.isfinite(float(result.stdout.split()[-1]))


def test_without_pallas_triton_the_kernels_are_refused_naming_xla(monkeypatch, triton_check):
  monkeypatch.setitem(sys.modules, _triton_blocks.TRITON, None)  # its import fails
  z1, z2, _, _ = _views()
  for platform in ("gpu", "cpu"):
    _triton_blocks.unavailable.cache_clear()
    monkeypatch.setattr(jax, "default_backend", lambda platform=platform: platform)
    with pytest.raises(ValueError, match=r"cannot import jax\.experimental\.pallas\.triton.* "
                                         r"Use implementation='xla' \(the default\)"):
      losses.info_nce(z1, z2, implementation="pallas", block_size=16)


def test_a_gpu_where_pallas_triton_cannot_compile_refuses_the_kernels(monkeypatch, triton_check):
  # JAX's default backend said to be a GPU: the check compiles a Triton kernel for the device
  # it has, a CPU, where no compiled Pallas kernel lowers (a real failure to lower).
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  z1, z2, _, _ = _views()
  with pytest.raises(ValueError, match=r"cannot compile a kernel with jax\.experimental\.pallas"
                                       r"\.triton on .* Use implementation='xla'"):
    losses.info_nce(z1, z2, implementation="pallas", block_size=16)


def test_on_tpus_a_missing_triton_backend_leaves_the_mosaic_kernels(monkeypatch, triton_check):
  monkeypatch.setitem(sys.modules, _triton_blocks.TRITON, None)
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  z1, z2, _, _ = _views()
  got = losses.info_nce(z1, z2, negatives="all", implementation="pallas")  # interpreted here
  np.testing.assert_allclose(got, losses.info_nce(z1, z2, negatives="all"), rtol=1e-5)
