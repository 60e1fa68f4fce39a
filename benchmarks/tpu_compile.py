r"""InfoNCE and each experiment's train step compiled for a TPU on any host: does it compile,
how much memory does XLA plan for it, how many Mosaic kernels does it hold.

libtpu compiles for a TPU topology ahead of time without TPU hardware
(`jax.experimental.topologies`): the program is lowered for `tpu` and compiled by the TPU
compiler itself, Mosaic kernels (`implementation="pallas"`) included, on this CPU host. The
memory is XLA's plan for the compiled program (`memory_analysis`: temporaries, arguments and
outputs per device). Nothing runs: speed needs the TPU (`benchmarks/device_bench.py`).

Needs libtpu: `pip install "jax[tpu]"` (the same jax version); the script sets
`JAX_PLATFORMS=cpu` so that libtpu is used only as a compiler.

Run: python -m benchmarks.tpu_compile                      (TPU v5e, 2x2 chips)
     python -m benchmarks.tpu_compile --topology v6e:2x2 --no_steps
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from tfcl_jax import losses, mappings  # noqa: E402
from tfcl_jax.training import lowering, sharding  # noqa: E402

MODES = {"all": dict(negatives="all"), "cross": dict(negatives="cross"),
         "two-tower": dict(negatives="cross", symmetric=True)}


def compile_report(fn, inputs) -> dict:
  """Lowers `fn` for `tpu`, compiles it with libtpu; seconds, memory and kernels."""
  start = time.perf_counter()
  lowered = lowering.lower(fn, *inputs, platform="tpu")
  report = lowering.inspect(lowered, platform="tpu")
  memory = lowered.compile().memory_analysis()
  return {"seconds": time.perf_counter() - start, "kernels": report.kernels,
          "problems": report.problems(),
          "temp_gib": memory.temp_size_in_bytes / 2**30,
          "io_gib": (memory.argument_size_in_bytes + memory.output_size_in_bytes) / 2**30}


def loss_case(mesh, spec: str, mode: str, implementation: str, n: int, d: int, dtype: str):
  replicated = NamedSharding(mesh, PartitionSpec())
  mapping = mappings.from_spec(spec)

  def loss(z1, z2, mapping):
    return losses.info_nce(z1, z2, mapping=mapping, implementation=implementation,
                           **MODES[mode])

  view = jax.ShapeDtypeStruct((n, d), jnp.dtype(dtype), sharding=replicated)
  abstract_mapping = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.asarray(x).dtype, sharding=replicated),
      mapping)
  return compile_report(jax.value_and_grad(loss, argnums=(0, 1, 2)),
                        (view, view, abstract_mapping))


def step_cases(devices):
  """Each experiment's step, built as it builds it, on the topology's devices."""
  from experiments import registry  # noqa: PLC0415
  from experiments.configs import (  # noqa: PLC0415
    dcrec_ml100k,
    grace_citeseer,
    msc_cifar10,
    retrieval_ml100k,
    simclr_cifar10,
    simclr_imagenette,
  )

  mesh = sharding.make_mesh(devices)
  yield "SimCLR ResNet-18 32x32, batch 256", mesh, registry.get("simclr").abstract_step(
      simclr_cifar10.get_config(), mesh)
  yield "SimCLR ResNet-18 128x128, batch 256", mesh, registry.get("simclr").abstract_step(
      simclr_imagenette.get_config(), mesh)
  yield "MSC ResNet-18 32x32, batch 32", mesh, registry.get("msc").abstract_step(
      msc_cifar10.get_config(), mesh)
  config = grace_citeseer.get_config()
  mesh = sharding.make_mesh(devices[:config.num_devices])
  yield "GRACE CiteSeer (full graph)", mesh, registry.get("grace").abstract_step(config, mesh)
  config = dcrec_ml100k.get_config()
  mesh = sharding.make_mesh(devices[:config.num_devices])
  yield "DCRec ML-100K shapes", mesh, registry.get("dcrec").abstract_step(config, mesh)
  config = retrieval_ml100k.get_config()
  mesh = sharding.make_mesh(devices[:config.num_devices])
  yield "Two-tower CLIP loss, batch 8192", mesh, registry.get("retrieval").abstract_step(
      config, mesh, spec="clip:learnable=0.07:100")


def main(argv: list[str] | None = None) -> None:
  from jax.experimental import topologies  # noqa: PLC0415

  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--topology", default="v5e:2x2")
  parser.add_argument("--sizes", type=int, nargs="*", default=[4096, 2**17])
  parser.add_argument("--dims", type=int, nargs="*", default=[768])
  parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
  parser.add_argument("--mappings", nargs="*",
                      default=["free", "tau=0.1", "learnable=0.07", "dynamic=0.1:0.2"])
  parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
  parser.add_argument("--implementations", nargs="*", default=["xla", "pallas"])
  parser.add_argument("--no_steps", action="store_true")
  args = parser.parse_args(argv)
  topology = topologies.get_topology_desc(topology_name=args.topology, platform="tpu")
  devices = list(topology.devices)
  print(f"jax {jax.__version__}; compiled for TPU {args.topology} ({devices[0].device_kind}, "
        f"{len(devices)} devices) on a {jax.devices()[0].platform} host; loss + gradient, "
        "memory per device")
  mesh = sharding.make_mesh(devices[:1])
  print("\n| implementation | mapping | mode | N | D | dtype | compiled in s | Mosaic kernels | "
        "temp GiB | args+outputs GiB |")
  print("|---" * 10 + "|")
  for implementation in args.implementations:
    for spec in args.mappings:
      for mode in args.modes:
        for n in args.sizes:
          for d in args.dims:
            for dtype in args.dtypes:
              r = loss_case(mesh, spec, mode, implementation, n, d, dtype)
              assert not r["problems"], r["problems"]
              print(f"| {implementation} | {spec} | {mode} | {n} | {d} | {dtype} | "
                    f"{r['seconds']:.1f} | {r['kernels']} | {r['temp_gib']:.3f} | "
                    f"{r['io_gib']:.3f} |", flush=True)
  if not args.no_steps:
    print("\n| train step (its shardings) | devices | compiled in s | temp GiB | "
          "args+outputs GiB |")
    print("|---" * 5 + "|")
    for name, step_mesh, (step, inputs) in step_cases(devices):
      r = compile_report(step, inputs)
      assert not r["problems"], r["problems"]
      print(f"| {name} | {step_mesh.size} | {r['seconds']:.1f} | {r['temp_gib']:.3f} | "
            f"{r['io_gib']:.3f} |", flush=True)


if __name__ == "__main__":
  main()
