"""benchmarks/device_bench.py and benchmarks/timing.py run on the CPU at small sizes: the
variants they time are the same loss, the floor is the three products' count, and every row
of the table is filled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import device_bench, loss_bench, timing
from tfcl_jax import losses, mappings


def test_dense_baseline_is_the_same_loss_as_info_nce():
  z1 = jax.random.normal(jax.random.key(0), (48, 16))
  z2 = z1 + 0.5 * jax.random.normal(jax.random.key(1), (48, 16))
  for spec in ("free", "tau=0.1"):
    mapping = mappings.from_spec(spec)
    np.testing.assert_allclose(device_bench.dense_nt_xent(z1, z2, mapping=mapping),
                               losses.info_nce(z1, z2, mapping=mapping, negatives="all"),
                               rtol=1e-5)


def test_floor_products_are_the_losses_three_products():
  z1, z2 = jnp.ones((6, 4)), 2 * jnp.ones((6, 4))
  for mode, rows in (("all", 12), ("cross", 6)):
    products = timing.floor_products(z1, z2, mode)
    shapes = [fn(*args).shape for fn, args in products.values()]
    assert shapes == [(rows, rows), (rows, 4), (rows, 4)]
  assert timing.multiply_adds("all", 10, 3) == (12 * 100 * 3, 8 * 100 * 3)
  assert timing.measure_floor(z1, z2, "cross", repeats=2, min_seconds=0.0) > 0


def test_device_bench_fills_every_jax_cell_on_cpu(capsys):
  rows = device_bench.main(["--sizes", "32", "--dims", "24", "--dtypes", "float32", "bfloat16",
                            "--repeats", "2", "--floor_repeats", "2", "--no_torch",
                            "--blocks", "16"])
  assert [(row["n"], row["dtype"]) for row in rows] == [(32, "float32"), (32, "bfloat16")]
  for row in rows:
    for name in ("dense XLA", "tiled XLA", "Pallas", "tiled XLA, block 16"):
      median, memory, _ = row["variants"][name]
      assert median > 0 and memory > 0, (name, row)
    assert row["floor"] > 0
  out = capsys.readouterr().out
  assert "| 32 | 24 | bfloat16 |" in out and "Ratios of medians" in out
  assert "tiled XLA with block 16 / the default call" in out


def test_device_bench_skips_what_exceeds_the_memory_bound():
  (row,) = device_bench.main(["--sizes", "600", "--dims", "8", "--dtypes", "float32",
                              "--repeats", "1", "--floor_repeats", "1", "--no_torch",
                              "--max_gib", "0.001"])
  assert row["variants"]["dense XLA"][0] is None
  assert "skipped" in row["variants"]["dense XLA"][2]
  assert "interpreted on CPU" in row["variants"]["Pallas"][2]  # 600 > --pallas_cpu_max


def test_loss_bench_prints_its_tables(capsys):
  loss_bench.main(["--sizes", "64", "--repeats", "1", "--floor_repeats", "1",
                   "--min_seconds", "0", "--no_torch", "--optax_max_gib", "0"])
  out = capsys.readouterr().out
  assert "loss / tile limit" in out and "| 64 |" in out


def test_kernel_resources_finds_each_triton_kernel_and_its_options():
  from benchmarks import kernel_resources

  kernels = kernel_resources.triton_modules("free", "two-tower", 256, 64, jnp.float32)
  assert [k["name"] for k in kernels] == ["info_nce_lse", "info_nce_lse", "info_nce_lse_row_grad",
                                           "info_nce_lse_col_grad"]
  for kernel in kernels:
    assert kernel["ir"].startswith(f"module @{kernel['name']}") and "tt.func" in kernel["ir"]
    assert (kernel["num_warps"], kernel["num_stages"]) == (8, 2)
