"""`benchmarks/sass.py` reads a SASS listing as written here by hand, and
`benchmarks/kernel_resources.py` compiles the fused kernels for sm_80 and sm_90 on this CPU host
(skipped without the `triton` package): no kernel spills or exceeds its shared memory, the
variants that promise no fence (the default among them) have no fence and no global atomic, the
atomic variant's sit in its tile loop, and Hopper's warpgroup MMAs are at least 64 columns
wide."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from benchmarks import kernel_resources, sass
from tfcl_jax.losses._kernels import _triton_tiles

LISTING = """
        code for sm_90a
                Function : example
        /*0000*/                   LDC R1, c[0x0][0x28] ;         /* 0x00000a00ff017b82 */
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;
        /*0020*/                   MEMBAR.ALL.CTA ;
        /*0030*/                   MEMBAR.ALL.GPU ;
        /*0040*/                   ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU PT, RZ, desc[UR6][R8.64], R3 ;
        /*0050*/                   CCTL.IVALL ;
        /*0060*/               @P0 BRA 0x20 ;
        /*0070*/                   HGMMA.64x64x8.F32.TF32 R24, gdesc[UR8], RZ, !UPT ;
        /*0080*/                   RED.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR6][R2.64], R5 ;
        /*0090*/                   ERRBAR;
        /*00a0*/              @!P1 BRA 0x80 ;
        /*00b0*/                   EXIT ;
        /*00c0*/                   BRA 0xc0;
"""


def test_sass_summary_counts_mma_fences_atomics_and_their_loops():
  summary = sass.parse(LISTING)
  assert summary.mma == {"HGMMA.64x128x16.F32.BF16": 1, "HGMMA.64x64x8.F32.TF32": 1}
  assert summary.narrowest_warpgroup_mma() == (64, 64)
  # MEMBAR.ALL.CTA (every warpgroup MMA's) is no fence here; the branch to itself no loop.
  assert summary.loops == 2
  assert summary.fences == (("MEMBAR.ALL.GPU", 1), ("CCTL.IVALL", 1), ("ERRBAR", 1))
  assert summary.atomics == (("ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU", 1),
                             ("RED.E.ADD.F32.FTZ.RN.STRONG.GPU", 1))
  assert summary.in_loops("fences") == 3 and summary.in_loops("fences", depth=2) == 0
  assert sass.describe(summary, "atomics") == "2 (2 in loops)"
  outside = sass.parse(LISTING.replace("@P0 BRA 0x20", "@P0 BRA 0xb0").replace(
      "@!P1 BRA 0x80", "@!P1 BRA 0xb0"))
  assert outside.loops == 0 and outside.in_loops("fences") == 0


def test_each_kernel_of_each_variant_is_found_with_its_launch_options():
  # The default: pair forwards with partial sums where a closed form allows, separate row and
  # column gradient kernels.
  default = {("free", "two-tower"): ["info_nce_lse_two_sided", "info_nce_lse_row_grad",
                                     "info_nce_lse_col_grad"],
             ("learnable=0.07", "two-tower"): ["info_nce_lse", "info_nce_lse",
                                               "info_nce_lse_row_grad", "info_nce_lse_col_grad"],
             ("free", "all"): ["info_nce_lse_symmetric", "info_nce_lse_row_grad"],
             ("tau=0.1", "cross"): ["info_nce_lse", "info_nce_lse_row_grad",
                                    "info_nce_lse_col_grad"]}
  pairs = {("free", "all"): ["info_nce_lse_symmetric", "info_nce_lse_symmetric_grad"]}
  separate = {("free", "all"): ["info_nce_lse", "info_nce_lse_row_grad"]}
  found = {}
  for variant, names in (("default", default), ("atomic", pairs), ("separate", separate)):
    for (spec, mode), expected in names.items():
      with kernel_resources.column_side(variant):
        found[variant, spec, mode] = kernel_resources.triton_modules(spec, mode, 256, 64,
                                                                     jnp.float32)
      assert [k["name"] for k in found[variant, spec, mode]] == expected, (variant, spec, mode)
  bfloat16 = kernel_resources.triton_modules("free", "two-tower", 256, 64, jnp.bfloat16)
  for kernels, width in ((found["default", "free", "two-tower"], 4), (bfloat16, 2)):
    for kernel in kernels:
      assert kernel["ir"].startswith(f"module @{kernel['name']}") and "tt.func" in kernel["ir"]
      family = "backward" if "grad" in kernel["name"] else "forward"
      launch = _triton_tiles.LAUNCH[family, width]
      assert (kernel["num_warps"], kernel["num_stages"]) == (launch.num_warps,
                                                             launch.num_stages)
    # bfloat16 inputs: the products take bfloat16 operands (raw rows), float32 otherwise.
    assert ("bf16" in kernels[0]["ir"]) == (width == 2)


def _compiled(**kwargs) -> list[dict]:
  pytest.importorskip("triton")
  return list(kernel_resources.report(specs=["free"], capabilities=[80, 90], **kwargs))


def _default_float32(spec: str, mode: str, dim: int) -> list[dict]:
  """The default variant's kernels of `spec` in `mode`, float32, N = 4096, on sm_80 and sm_90."""
  pytest.importorskip("triton")
  return list(kernel_resources.report(specs=[spec], modes=[mode], dims=[dim], rows=4096,
                                      dtype="float32", capabilities=[80, 90],
                                      variants=["default"]))


def _default_bfloat16(spec: str, mode: str, dim: int) -> list[dict]:
  """`_default_float32` with bfloat16 inputs."""
  pytest.importorskip("triton")
  return list(kernel_resources.report(specs=[spec], modes=[mode], dims=[dim], rows=4096,
                                      dtype="bfloat16", capabilities=[80, 90],
                                      variants=["default"]))


def _check(rows: list[dict]):
  assert rows
  for row in rows:
    where = (row["variant"], row["mode"], row["kernel"], row["capability"])
    assert row["spill_bytes"] == 0 and row["fits"], where
    assert row["sass"].mma, where  # on tensor cores
    if kernel_resources.promises_no_fence(row["variant"]):
      assert not row["sass"].fences and not row["sass"].atomics, where
    if row["capability"] == 90:
      assert row["sass"].narrowest_warpgroup_mma()[1] >= 64, where
    assert kernel_resources.problems(row) == [], where


@pytest.mark.heavy  # six compilations for two GPUs: CI's heavy step
def test_every_variant_of_all_compiles_without_spills_or_unpromised_fences():
  rows = _compiled(modes=["all"], dims=[128], rows=1024, dtype="float32",
                   variants=["separate", "partials", "atomic"])
  _check(rows)
  atomic = [row for row in rows if row["variant"] == "atomic" and "grad" in row["kernel"]]
  assert atomic and all(row["sass"].in_loops("atomics") for row in atomic)


def test_the_default_two_tower_kernels_in_bfloat16_have_no_fence():
  rows = _compiled(modes=["two-tower"], dims=[256], rows=1024, dtype="bfloat16",
                   variants=["default"])
  assert {row["kernel"] for row in rows} == {"info_nce_lse_two_sided", "info_nce_lse_row_grad",
                                             "info_nce_lse_col_grad"}
  _check(rows)


def test_the_default_float32_gradient_kernel_at_d256_spills_on_no_gpu():
  # D = 256 walked in steps of 64 with the tile's products in steps of 32 (`Launch.block_k`):
  # in steps of 64 this kernel spilled 56 bytes on sm_90 at N = 4096; with 4 warps on sm_80,
  # 40 (`LAUNCH_BEFORE_HOPPER` takes 8 there).
  rows = _default_float32("free", "all", 256)
  grads = {row["capability"]: row for row in rows if row["kernel"] == "info_nce_lse_row_grad"}
  assert grads[80]["num_warps"] == 8 and grads[90]["num_warps"] == 4
  _check(rows)


@pytest.mark.heavy  # six compilations for two GPUs: CI's heavy step
def test_the_float32_forward_without_a_closed_form_spills_on_no_gpu():
  # A learnt temperature: the online logsumexp forward. With 3 stages it spilled 88 bytes on
  # sm_80 at D = 128 (`LAUNCH_BEFORE_HOPPER` takes 2 there).
  rows = _default_float32("learnable=0.07", "cross", 128)
  forwards = {row["capability"]: row for row in rows if row["kernel"] == "info_nce_lse"}
  assert forwards[80]["num_stages"] == 2 and forwards[90]["num_stages"] == 3
  _check(rows)


@pytest.mark.heavy  # four compilations for two GPUs: CI's heavy step
def test_the_gradient_kernel_of_eq11_with_a_scale_spills_on_no_gpu():
  # `learnable_free` (Eq. 11 times a learnt scale; a solved scale the same): no closed form, so
  # the tile takes the mapping's `jax.vjp`. Traced as `log1p(c) - log1p(-c)`, the gradient
  # kernels spilled 376-680 bytes on sm_90 at D = 128-256 (`cross`); the kernels trace Eq. 11
  # in its kernel form (`mappings.Mapping.kernel_form`: one log of the odds, the
  # derivative in closed form), and NT-Xent's spills none.
  rows = _default_float32("learnable_free=100", "all", 256)
  assert {row["kernel"] for row in rows} == {"info_nce_lse", "info_nce_lse_row_grad"}
  _check(rows)


@pytest.mark.heavy  # six compilations for two GPUs: CI's heavy step
def test_the_bfloat16_gradient_kernels_before_hopper_spill_none():
  # A fixed temperature, `cross`, D = 256: with 4 warps on sm_80 the column gradient kernel
  # spilled 24 bytes (up to 200 at D = 768); `LAUNCH_BEFORE_HOPPER` takes 8 warps there, while
  # sm_90 keeps one warpgroup (8 would split its MMAs to 64 x 32).
  rows = _default_bfloat16("tau=0.07", "cross", 256)
  grads = [row for row in rows if "grad" in row["kernel"]]
  assert {(row["capability"], row["num_warps"]) for row in grads} == {(80, 8), (90, 4)}
  _check(rows)
