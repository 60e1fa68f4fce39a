r"""The fused InfoNCE kernels compiled for NVIDIA GPUs on any host: registers, spills, shared
memory, tensor-core instructions, fences and atomics, per kernel and architecture.

`info_nce(..., implementation="pallas")` with its gradient is lowered for `cuda` (no GPU
needed: JAX lowers for the platform it is asked for) with each way of sending a tile's column
side (`_triton_tiles.COLUMN_SIDE`: `--variants`); each Pallas kernel's Triton IR is taken from
the lowering and compiled by the `triton` package for the GPU architectures below, down to a
cubin (Triton's own `ptxas`). `cuobjdump` reports its registers and spills (`STACK` > 0: local
memory) and disassembles it (`-sass`), from which `benchmarks/sass.py` reads the tensor-core
instructions (Hopper's `HGMMA.64xNxK` per warpgroup, Ampere's `HMMA` per warp), the fences and
global atomics, and how many of those sit inside a loop (a backward branch). A kernel that spills,
needs more shared memory than the architecture grants a block, issues narrow MMAs or fences
inside its tile loop would run slowly or not at all; this shows it without the GPU.

What it does not show: speed (that needs the GPU: `python -m benchmarks.device_bench`), and
XLA's own Triton build may differ from the `triton` package's in version and passes.

Needs `pip install triton` (Linux x86_64; the wheel carries `ptxas` and `cuobjdump`).

Run: python -m benchmarks.kernel_resources                     # free mapping, every mode
     python -m benchmarks.kernel_resources --dtype bfloat16 --dims 256 --variants separate
     python -m benchmarks.kernel_resources --mappings free learnable=0.07 --dims 128 768
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import tempfile

import jax
import jax.numpy as jnp

from benchmarks import sass
from tfcl_jax import losses, mappings
from tfcl_jax.losses._kernels import _triton_tiles  # the benchmark sets the kernels' column side
from tfcl_jax.training.lowering import lower

# Largest shared memory one block may use (bytes), per compute capability.
SHARED_LIMIT = {75: 65536, 80: 166912, 86: 101376, 89: 101376, 90: 232448}
MODES = {"cross": dict(negatives="cross"), "two-tower": dict(negatives="cross", symmetric=True),
         "all": dict(negatives="all")}
# Variants that promise no fence and no global atomic anywhere.
FENCE_FREE = ("separate", "partials")
VARIANTS = ("default", *_triton_tiles.COLUMN_SIDES)


def promises_no_fence(variant: str) -> bool:
  """Whether `variant` ("default": `_triton_tiles.COLUMN_SIDE` as it is) has no atomics."""
  if variant == "default":
    return all(side in FENCE_FREE for side in _triton_tiles.COLUMN_SIDE.values())
  return variant in FENCE_FREE


@contextlib.contextmanager
def column_side(variant: str):
  """The kernels traced with `variant` (`_triton_tiles.COLUMN_SIDES`) forward and backward;
  "default" leaves `_triton_tiles.COLUMN_SIDE` as it is."""
  saved = dict(_triton_tiles.COLUMN_SIDE)
  if variant != "default":
    _triton_tiles.COLUMN_SIDE.update(forward=variant, backward=variant)
  try:
    yield
  finally:
    _triton_tiles.COLUMN_SIDE.update(saved)


def triton_modules(spec: str, mode: str, n: int, d: int, dtype) -> list[dict]:
  """Each Triton kernel of loss + gradient lowered for `cuda`: name, IR text, warps, stages."""
  from jax._src.pallas.triton import lowering  # noqa: PLC0415

  modules = []
  lower_module = lowering.lower_jaxpr_to_triton_module

  def record(*args, **kwargs):
    result = lower_module(*args, **kwargs)
    modules.append(result.module.operation.get_asm())
    return result

  mapping = mappings.from_spec(spec)

  def loss(a, b, mapping):
    return losses.info_nce(a, b, mapping=mapping, implementation="pallas", **MODES[mode])

  shape = jax.ShapeDtypeStruct((n, d), dtype)
  lowering.lower_jaxpr_to_triton_module = record
  try:
    text = lower(jax.value_and_grad(loss, argnums=(0, 1, 2)), shape, shape, mapping,
                 platform="cuda").as_text()
  finally:
    lowering.lower_jaxpr_to_triton_module = lower_module
  # Each custom call's compiler options, by kernel name (the module's symbol).
  options = {name: (int(warps), int(stages)) for name, stages, warps in re.findall(
      r'name = "(\w+)", num_stages = (\d+) : i32, num_warps = (\d+)', text)}
  kernels = []
  for ir in modules:
    match = re.match(r"module @(\w+)", ir)
    assert match is not None, ir[:100]
    name = match.group(1)
    warps, stages = options[name]
    kernels.append({"name": name, "ir": ir, "num_warps": warps, "num_stages": stages})
  return kernels


def _tool(name: str) -> str:
  import triton  # noqa: PLC0415

  return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_kernel(kernel: dict, capability: int) -> dict:
  """Compiles one kernel's Triton IR to a cubin for `sm_<capability>`: its resource usage and
  its SASS `sass.Summary`."""
  import triton  # noqa: PLC0415
  from triton.backends.compiler import GPUTarget  # noqa: PLC0415

  with tempfile.TemporaryDirectory() as folder:
    source = os.path.join(folder, "kernel.ttir")
    with open(source, "w") as f:
      f.write(kernel["ir"])
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32),
                              options={"num_warps": kernel["num_warps"],
                                       "num_stages": kernel["num_stages"]})
    cubin = os.path.join(folder, "kernel.cubin")
    with open(cubin, "wb") as f:
      f.write(compiled.asm["cubin"])
    report = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", cubin],
                            capture_output=True, text=True, check=True).stdout
    code = subprocess.run([_tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True,
                          check=True).stdout
  usage = re.search(r"REG:(\d+).*?STACK:(\d+)", report)
  assert usage is not None, report
  shared = int(compiled.metadata.shared)
  return {"registers": int(usage.group(1)), "spill_bytes": int(usage.group(2)),
          "shared": shared, "fits": shared <= SHARED_LIMIT[capability],
          "sass": sass.parse(code)}


def report(*, specs, modes, dims, rows: int, dtype, capabilities, variants):
  """Yields one row per kernel, variant and architecture (a dict: the kernel's name and launch,
  `compile_kernel`'s fields) for loss + gradient of each mapping spec, mode and `D`."""
  for variant in variants:
    for spec in specs:
      for mode in modes:
        for d in dims:
          for capability in capabilities:  # traced per GPU: its launches (`for_capability`)
            with column_side(variant), _triton_tiles.for_capability(capability):
              kernels = triton_modules(spec, mode, rows, d, jnp.dtype(dtype))
            for kernel in kernels:
              yield {"variant": variant, "spec": spec, "mode": mode, "d": d,
                     "kernel": kernel["name"], "num_warps": kernel["num_warps"],
                     "num_stages": kernel["num_stages"], "capability": capability,
                     **compile_kernel(kernel, capability)}


HEADER = ("| variant | mapping | mode | D | kernel | warps/stages | sm | regs | spill B | smem KiB "
          "| MMA (per instruction) | fences (in loops) | atomics (in loops) |")


def markdown_row(row: dict) -> str:
  summary = row["sass"]
  smem = f"{row['shared'] / 1024:g}" + ("" if row["fits"] else " (too much)")
  return (f"| {row['variant']} | {row['spec']} | {row['mode']} | {row['d']} | {row['kernel']} | "
          f"{row['num_warps']}/{row['num_stages']} | {row['capability']} | {row['registers']} | "
          f"{row['spill_bytes']} | {smem} | {sass.describe_mma(summary)} | "
          f"{sass.describe(summary, 'fences')} | {sass.describe(summary, 'atomics')} |")


def problems(row: dict) -> list[str]:
  """What a kernel breaks: spills, too much shared memory, a fence or atomic in a loop of a
  variant that promises none, or (sm_90) a warpgroup MMA narrower than 64 columns."""
  found, summary = [], row["sass"]
  if row["spill_bytes"]:
    found.append(f"{row['spill_bytes']} bytes spilled")
  if not row["fits"]:
    found.append("too much shared memory")
  if promises_no_fence(row["variant"]) and (summary.fences or summary.atomics):
    found.append(f"{len(summary.fences)} fences, {len(summary.atomics)} atomics")
  narrowest = summary.narrowest_warpgroup_mma()
  if narrowest is not None and narrowest[1] < 64:
    found.append(f"HGMMA {narrowest[0]}x{narrowest[1]}")
  return found


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--mappings", nargs="*", default=["free"])
  parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
  parser.add_argument("--dims", type=int, nargs="*", default=[256])
  parser.add_argument("--rows", type=int, default=16384)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--capabilities", type=int, nargs="*", default=[80, 90],
                      choices=sorted(SHARED_LIMIT))
  parser.add_argument("--variants", nargs="*", default=list(_triton_tiles.COLUMN_SIDES),
                      choices=VARIANTS)
  args = parser.parse_args(argv)
  os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
  import triton  # noqa: PLC0415

  print(f"jax {jax.__version__}, triton {triton.__version__} (compiling offline), "
        f"N = {args.rows}, {args.dtype}, loss + gradient lowered for cuda; default column side "
        f"{_triton_tiles.COLUMN_SIDE}")
  print(HEADER)
  print("|---" * (HEADER.count("|") - 1) + "|")
  rows, bad = [], []
  for row in report(specs=args.mappings, modes=args.modes, dims=args.dims, rows=args.rows,
                    dtype=args.dtype, capabilities=args.capabilities, variants=args.variants):
    print(markdown_row(row), flush=True)
    rows.append(row)
    bad += [f"{row['variant']} {row['mode']} D={row['d']} {row['kernel']} sm_{row['capability']}: "
            + ", ".join(found) for found in [problems(row)] if found]
  worst = max(rows, key=lambda r: r["registers"]) if rows else None
  print(f"\n{len(rows)} compiled kernels; at most {worst and worst['registers']} registers, "
        f"{max((r['spill_bytes'] for r in rows), default=0)} bytes spilled, "
        f"{max((r['shared'] for r in rows), default=0) / 1024:g} KiB shared memory.")
  print("Problems: " + ("none" if not bad else "\n  " + "\n  ".join(bad)))
  return rows


if __name__ == "__main__":
  main()
