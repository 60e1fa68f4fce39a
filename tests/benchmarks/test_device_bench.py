"""benchmarks/device_bench.py and benchmarks/timing.py run on the CPU at small sizes: the
contenders are the same loss, the float64 reference is the loss, the floor's products cover the
matrix in bounded chunks, every table is filled and written, an out-of-memory contender is
reported and the rest go on."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import device_bench, device_variants, loss_bench, timing
from tests.helpers.marks import widest
from tfcl_jax import losses, mappings


@pytest.mark.parametrize("loss", widest("ntxent", "clip", "cross", quick=("cross",)))
def test_dense_baselines_are_the_same_loss_as_info_nce(loss):
  z1 = jax.random.normal(jax.random.key(0), (48, 16))
  z2 = z1 + 0.5 * jax.random.normal(jax.random.key(1), (48, 16))
  for spec in ("free", "tau=0.1"):
    mapping = mappings.from_spec(spec)
    np.testing.assert_allclose(
        device_variants.dense_info_nce(z1, z2, mapping=mapping, loss=loss),
        losses.info_nce(z1, z2, mapping=mapping, **device_variants.LOSSES[loss]), rtol=1e-5)


def test_float64_reference_is_numpy_nt_xent_and_its_gradient():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
  value, (da, db, _) = device_variants.reference_loss(a, b, "tau=0.5", "ntxent")

  def numpy_loss(a, b):
    u = np.concatenate([a, b])
    u = u / np.linalg.norm(u, axis=1, keepdims=True)
    logits = u @ u.T / 0.5
    np.fill_diagonal(logits, -np.inf)
    positive = (np.arange(12) + 6) % 12
    return np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(12), positive])

  assert value.dtype == np.float64
  np.testing.assert_allclose(value, numpy_loss(a, b), rtol=1e-12)
  step = 1e-6  # central differences in float64
  a_plus, a_minus = a.copy(), a.copy()
  a_plus[2, 3] += step
  a_minus[2, 3] -= step
  numeric = (numpy_loss(a_plus, b) - numpy_loss(a_minus, b)) / (2 * step)
  np.testing.assert_allclose(da[2, 3], numeric, rtol=1e-6)
  assert db.shape == b.shape


def test_floor_products_cover_the_matrix_in_bounded_chunks():
  z1, z2 = jnp.ones((6, 4)), 2 * jnp.ones((6, 4))
  for mode, rows in (("all", 12), ("cross", 6)):
    products, chunks = timing.floor_products(z1, z2, mode)  # one chunk: the whole matrix
    shapes = [fn(*args).shape for fn, args in products.values()]
    assert shapes == [(rows, rows), (rows, 4), (rows, 4)] and chunks == 1
  # At most 16 bytes of S per chunk: 12 columns of float32 fit one row per chunk.
  products, chunks = timing.floor_products(z1, z2, "all", chunk_bytes=48)
  assert [fn(*args).shape for fn, args in products.values()] == [(1, 12), (1, 4), (12, 4)]
  assert chunks == 12
  assert timing.chunk_rows(2**18, 2**18, 4, 2**31) == 2048  # N = 2^17, "all": 2 GiB chunks
  assert timing.multiply_adds("all", 10, 3) == (12 * 100 * 3, 8 * 100 * 3)
  assert timing.measure_floor(z1, z2, "cross", repeats=2, min_seconds=0.0) > 0


def _run(tmp_path, *extra):
  return device_bench.main(["--out", str(tmp_path), "--sizes", "32", "--check_sizes", "24",
                            "--sweep_sizes", "32", "--sweep_dtypes", "float32", "--dim", "24",
                            "--blocks", "16", "--unrolls", "2", "--launches", "16:4:2",
                            "--repeats", "1",
                            "--floor_repeats", "1", "--max_seconds", "0.1",
                            "--pallas_cpu_max", "32", "--no_torch", "--no_inf_cl",
                            "--check_mappings", "tau=0.07", *extra])


@pytest.mark.heavy
def test_device_bench_fills_every_table_on_cpu_and_writes_it(tmp_path, capsys):
  results = _run(tmp_path)
  assert list(results) == list(device_bench.SUITES)
  for row in results["correctness"]:
    assert row["note"] == "" and row["loss_error"] < 1e-5, row
    assert row["grad_error"] < (1e-5 if row["dtype"] == "float32" else 2e-2), row
  for loss in ("ntxent", "clip"):
    rows = results[loss]
    assert [(row["n"], row["dtype"]) for row in rows] == [(32, "float32"), (32, "bfloat16")]
    for row in rows:
      for name in ("dense XLA", "tiled XLA", "Pallas"):
        median, memory, note = row["variants"][name]
        assert median > 0 and memory > 0 and note == "", (loss, name, row)
      assert row["floor"] > 0
  (sweep,) = results["sweep"]
  assert set(sweep["variants"]) == {"tiled XLA", "tiled XLA, block 16", "tiled XLA, unroll 2",
                                    "tiled XLA, diagonal apart", "tiled XLA, diagonal in one scan",
                                    "Pallas", "Pallas, 16:4:2"}
  out = capsys.readouterr().out
  written = (tmp_path / "device_bench.md").read_text()
  for title in ("Correctness against float64", "ntxent (free)", "clip (tau=0.07)",
                "Sweep: the fastest per N"):
    assert title in out and title in written
  assert "| 32 | bfloat16 |" in written
  # The sweep's winners in the form of the tables they would replace.
  assert "_blocks._BLOCKS['gpu'] = ((None, " in written
  assert "_blocks._DIAGONAL_APART['cpu'] = " in written
  assert "LAUNCH['backward', 4] = Launch(16, " in written


def test_the_unroll_option_sets_the_engines_tile_loops_and_restores_them():
  z = jax.ShapeDtypeStruct((512, 16), jnp.float32)

  def scan_unrolls():  # the tile loops' `unroll`, read from the program's text
    text = str(jax.make_jaxpr(jax.grad(lambda a, b: losses.info_nce(a, b, block_size=128)))(z, z))
    return set(re.findall(r"unroll=(\d+)", text))

  with device_variants.kernel_options(unroll=2):
    assert scan_unrolls() == {"2"}
  assert scan_unrolls() == {"1"}


def test_the_diagonal_option_places_the_diagonal_tiles_and_restores_the_table():
  z = jax.ShapeDtypeStruct((256, 16), jnp.float32)

  def tile_loops():  # scans over tiles in the CPU program's loss + gradient
    grad = jax.grad(lambda a, b: losses.info_nce(a, b, negatives="all", block_size=128))
    return jax.jit(grad).lower(z, z).as_text().count("stablehlo.while")

  assert tile_loops() == 2  # a CPU's default: the diagonal tiles in the one scan, each way
  with device_variants.kernel_options(diagonal_apart=True):
    assert tile_loops() == 4
  assert tile_loops() == 2


def test_device_bench_reports_out_of_memory_and_goes_on(tmp_path, monkeypatch):
  build = device_variants.build_jax

  def dense_runs_out(loss_fn, launch, *args, **kwargs):
    if getattr(loss_fn, "func", None) is device_variants._dense:  # noqa: SLF001
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
    return build(loss_fn, launch, *args, **kwargs)

  monkeypatch.setattr(device_variants, "build_jax", dense_runs_out)
  results = _run(tmp_path, "--suite", "ntxent", "--dtypes", "float32")
  (row,) = results["ntxent"]
  assert row["variants"]["dense XLA"] == (None, None, "OOM")
  assert row["variants"]["tiled XLA"][0] > 0
  assert "OOM" in (tmp_path / "device_bench.md").read_text()


def test_device_bench_skips_sizes_past_its_time_budget_and_says_so(tmp_path):
  results = _run(tmp_path, "--suite", "ntxent", "--budget_minutes", "0")
  assert results["ntxent"] == []
  assert "ntxent, N = 32, float32: skipped" in (tmp_path / "device_bench.md").read_text()


def test_device_bench_skips_what_exceeds_the_memory_bound(tmp_path):
  results = _run(tmp_path, "--suite", "ntxent", "--dtypes", "float32", "--max_gib", "1e-9",
                 "--sizes", "600")
  (row,) = results["ntxent"]
  assert row["variants"]["dense XLA"][0] is None
  assert "skipped" in row["variants"]["dense XLA"][2]
  assert "interpreted on CPU" in row["variants"]["Pallas"][2]  # 600 > --pallas_cpu_max


def test_loss_bench_prints_its_tables(capsys):
  loss_bench.main(["--sizes", "64", "--repeats", "1", "--floor_repeats", "1",
                   "--min_seconds", "0", "--no_torch", "--optax_max_gib", "0"])
  out = capsys.readouterr().out
  assert "loss / tile limit" in out and "| 64 |" in out
  bfloat16 = out.split("bfloat16 inputs / float32 inputs")[1].splitlines()
  assert bfloat16[3].startswith("| 64 | ") and bfloat16[3].count("|") == 5


@pytest.mark.heavy
def test_quick_suite_checks_times_and_names_the_winners_on_cpu(tmp_path, capsys):
  results = device_bench.main(["--out", str(tmp_path), "--suite", "quick", "--quick_n", "32",
                               "--quick_check_n", "24", "--dim", "24", "--dtypes", "float32",
                               "--quick_variants", "partials", "--quick_launches",
                               "16/4", "--repeats", "1", "--floor_repeats", "1",
                               "--max_seconds", "0.1", "--pallas_cpu_max", "32", "--no_torch",
                               "--no_inf_cl"])
  rows = results["quick"]
  assert [(row["dtype"], row["loss"]) for row in rows] == [("float32", "ntxent"),
                                                          ("float32", "clip")]
  names = ["tiled XLA", "Pallas partials", "Pallas default, 16/4"]
  for row in rows:
    assert list(row["checked"]) == names and row["floor"] > 0
    for name in names:
      errors, note = row["checked"][name]
      assert note == "" and max(errors) < 1e-5, (row["loss"], name, errors)
      assert row["timed"][name][0] > 0, (row["loss"], name)
  written = (tmp_path / "device_bench.md").read_text()
  assert "Quick suite: N = 32, D = 24" in written
  assert "| float32 | clip | Pallas partials |" in written
  assert "float32: fastest Pallas " in written and "COLUMN_SIDE = {'forward': " in written
  assert "Winning rows" in capsys.readouterr().out
