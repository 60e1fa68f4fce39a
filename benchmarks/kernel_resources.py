r"""The fused InfoNCE kernels compiled for NVIDIA GPUs on any host: registers, spills, shared memory

`info_nce(..., implementation="pallas")` with its gradient is lowered for `cuda` (no GPU
needed: JAX lowers for the platform it is asked for); each Pallas kernel's Triton IR is taken
from the lowering and compiled by the `triton` package for the GPU architectures below, down to
a cubin (Triton's own `ptxas`), whose resource usage `cuobjdump` reports. A kernel that spills
registers to local memory (`STACK` > 0) or needs more shared memory than the architecture
grants a block would run slowly or not at all; this shows it without the GPU.

What it does not show: speed (that needs the GPU: `python -m benchmarks.device_bench`), and
XLA's own Triton build may differ from the `triton` package's in version and passes.

Needs `pip install triton` (Linux x86_64; the wheel carries `ptxas` and `cuobjdump`).

Run: python -m benchmarks.kernel_resources
     python -m benchmarks.kernel_resources --dims 128 768 --mappings free learnable=0.07
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import jax
import jax.numpy as jnp

from tfcl_jax import losses, mappings
from tfcl_jax.training.lowering import lower

# Largest shared memory one block may use (bytes), per compute capability.
SHARED_LIMIT = {75: 65536, 80: 166912, 86: 101376, 89: 101376, 90: 232448}
MODES = {"cross": dict(negatives="cross"), "two-tower": dict(negatives="cross", symmetric=True),
         "all": dict(negatives="all")}


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
    name = re.match(r"module @(\w+)", ir).group(1)
    warps, stages = options[name]
    kernels.append({"name": name, "ir": ir, "num_warps": warps, "num_stages": stages})
  return kernels


def compile_kernel(kernel: dict, capability: int) -> dict:
  """Compiles one kernel's Triton IR to a cubin for `sm_<capability>`; its resource usage."""
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
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    report = subprocess.run([tool, "--dump-resource-usage", cubin], capture_output=True,
                            text=True, check=True).stdout
  registers, stack = re.search(r"REG:(\d+).*?STACK:(\d+)", report).groups()
  shared = int(compiled.metadata.shared)
  return {"registers": int(registers), "spill_bytes": int(stack), "shared": shared,
          "fits": shared <= SHARED_LIMIT[capability]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--mappings", nargs="*", default=["free", "tau=0.1", "learnable=0.07",
                                                        "dynamic=0.1:0.2"])
  parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
  parser.add_argument("--dims", type=int, nargs="*", default=[128, 256, 768])
  parser.add_argument("--rows", type=int, default=4096)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--capabilities", type=int, nargs="*", default=[75, 80, 90],
                      choices=sorted(SHARED_LIMIT))
  args = parser.parse_args()
  os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
  import triton  # noqa: PLC0415

  print(f"jax {jax.__version__}, triton {triton.__version__} (compiling offline), "
        f"N = {args.rows}, {args.dtype}, loss + gradient lowered for cuda")
  print("| mapping | mode | D | kernel | warps | stages | "
        + " | ".join(f"sm_{c} regs / spill B / smem KiB" for c in args.capabilities) + " |")
  print("|---" * (6 + len(args.capabilities)) + "|")
  worst = {"registers": 0, "spill_bytes": 0, "shared": 0, "fits": True}
  for spec in args.mappings:
    for mode in args.modes:
      for d in args.dims:
        for kernel in triton_modules(spec, mode, args.rows, d, jnp.dtype(args.dtype)):
          cells = []
          for capability in args.capabilities:
            usage = compile_kernel(kernel, capability)
            worst = {"registers": max(worst["registers"], usage["registers"]),
                     "spill_bytes": max(worst["spill_bytes"], usage["spill_bytes"]),
                     "shared": max(worst["shared"], usage["shared"]),
                     "fits": worst["fits"] and usage["fits"]}
            cells.append(f"{usage['registers']} / {usage['spill_bytes']} / "
                         f"{usage['shared'] / 1024:g}{'' if usage['fits'] else ' (too much)'}")
          print(f"| {spec} | {mode} | {d} | {kernel['name']} | {kernel['num_warps']} | "
                f"{kernel['num_stages']} | " + " | ".join(cells) + " |", flush=True)
  print(f"\nWorst over every kernel and architecture: {worst['registers']} registers, "
        f"{worst['spill_bytes']} bytes spilled, {worst['shared'] / 1024:g} KiB shared memory; "
        f"{'every kernel fits' if worst['fits'] else 'SOME KERNEL EXCEEDS its shared memory'}.")


if __name__ == "__main__":
  main()
