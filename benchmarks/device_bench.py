r"""InfoNCE loss + gradient on one GPU: correctness against float64, speed against the floor,
PyTorch and Inf-CL, memory, and the tile sweeps behind the default tiles.

Suites (`--suite`, default all four, in this order):

* `correctness`: loss and gradients (both views, the mapping's parameters) of `info_nce` with
  `implementation="xla"` and `"pallas"`, float32 and bfloat16 inputs, several mappings and modes,
  against the dense loss in float64 on the same inputs (`--check_sizes`); relative errors;
* `ntxent`: NT-Xent (`negatives="all"`, `--mapping`, default the free mapping) and
* `clip`: CLIP's symmetric loss (`negatives="cross", symmetric=True`, `--clip_mapping`,
  default `tau=0.07`), each at `N = 2^12 ... 2^17` (`--sizes`), float32 and bfloat16:
  tiled XLA (the default call), Pallas, the dense formulation where its memory allows,
  PyTorch eager and `torch.compile` (dense; float32 only for `torch.compile`, whose
  compilation takes a minute a shape), and for CLIP Inf-CL's `cal_flash_loss` one way and
  both ways when `inf_cl` imports;
* `sweep`: tiled XLA with each of `--blocks` and of `--unrolls` (tiles per step of its tile
  loops, `_blocks._UNROLL`), with the diagonal tiles of NT-Xent's symmetric matrix in a scan
  of their own and in the one scan (`_blocks._DIAGONAL_APART`; `--no_diagonals` skips them),
  and the fused kernels with each of
  `--launches` (the gradient kernels' `block:warps:stages`) at `--sweep_sizes`, and the
  fastest of each per `N`: the measurement that `losses.auto_block_size` and
  `_triton_tiles.LAUNCH` take;
* `quick` (only when named: `--suite quick`, its own 4.5-minute budget): every kernel variant
  and launch setting against the tiled XLA path and the floor at N = 16384, D = 256, each
  checked against float64 at N = 1000 first (`benchmarks/device_quick.py`).

Floor: the three products of the loss's similarity matrix (`S = A B^T`, `S B`, `S^T A`) over
chunks of rows, each timed alone at its minimum (`benchmarks/timing.py`); never the dense
matrix. Time: the median over interleaved repeats after a warm-up call (fewer repeats for slow
calls, `--max_seconds`); sizes not started within `--budget_minutes` (default 7.5) are
skipped and said so. Memory: XLA's estimate for the compiled program (arguments, outputs,
temporaries) and PyTorch's peak allocation. A contender whose estimate exceeds `--max_gib` is
skipped and said so; one that runs out of memory is reported as `OOM` and the rest go on.

PyTorch's TF32 setting is printed (`torch.backends.cuda.matmul.allow_tf32`, its default);
JAX's float32 products use XLA's default precision. `XLA_PYTHON_CLIENT_PREALLOCATE` is set to
`false` unless given, so that PyTorch can allocate beside JAX.

Run (one GPU, about 8 minutes): python -m benchmarks.device_bench --out results/gpu
     one suite:                 python -m benchmarks.device_bench --suite sweep --out DIR
     the quick suite (4.5 min): python -m benchmarks.device_bench --suite quick --out DIR
     on a CPU, small sizes:     python -m benchmarks.device_bench --sizes 64 --check_sizes 40 \
                                  --sweep_sizes 64 --blocks 32 --launches 16:4:2 --out DIR
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

from benchmarks import device_quick, timing, torch_ntxent  # noqa: E402
from benchmarks import device_tables as tables  # noqa: E402
from benchmarks import device_variants as dv  # noqa: E402
from tfcl_jax import losses, mappings  # noqa: E402

SUITES = ("correctness", "ntxent", "clip", "sweep")
# Each mapping in a mode (the mapping is code inside the tile, the mode the kernels around it).
CHECKS = (("free", "ntxent"), ("tau=0.07", "clip"), ("learnable=0.07:100", "clip"),
          ("dynamic=0.1:0.2", "cross"), ("learnable_free=100", "ntxent"))
FLOOR_MODE = {"ntxent": "all", "clip": "two-tower", "cross": "cross"}


def correctness(args, report) -> list[dict]:
  """Worst relative error of loss, gradients and mapping gradients against float64."""
  rows = []
  for n in args.check_sizes:
    for dtype in args.dtypes:
      a, b, z1, z2 = dv.inputs(n, args.dim, dtype)
      for spec, loss in (check for check in CHECKS if check[0] in args.check_mappings):
        expected_value, expected_grads = dv.reference_loss(a, b, spec, loss)
        for implementation in ("xla", "pallas"):
          if implementation == "pallas" and not _pallas_runs(n, args):
            continue
          mapping = mappings.from_spec(spec)

          def fn(x, y, m, implementation=implementation, loss=loss):
            return losses.info_nce(x, y, mapping=m, implementation=implementation,
                                   **dv.LOSSES[loss])

          result, note = dv.guarded(lambda fn=fn, mapping=mapping, z1=z1, z2=z2: jax.device_get(
              jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))(z1, z2, mapping)))
          row = {"n": n, "dtype": dtype, "spec": spec, "loss": loss,
                 "implementation": implementation, "note": note}
          if result is not None:
            value, grads = result
            row["loss_error"] = dv.relative(value, expected_value)
            row["grad_error"] = max(dv.relative(g, e) for g, e in zip(
                grads[:2], expected_grads[:2], strict=True))
            params = jax.tree.leaves(grads[2])
            row["param_error"] = max((dv.relative(g, e) for g, e in zip(
                params, jax.tree.leaves(expected_grads[2]), strict=True)), default=None)
          rows.append(row)
  report.table(f"Correctness against float64 (D = {args.dim}): worst relative error "
               "(max |error| / max |float64 value|)",
               ["N", "dtype", "spec", "loss", "implementation", "loss", "dz", "dparams"],
               [[r["n"], r["dtype"], r["spec"], r["loss"], r["implementation"],
                 *(r["note"] and [r["note"], "", ""] or [
                     f"{r['loss_error']:.1e}", f"{r['grad_error']:.1e}",
                     "-" if r["param_error"] is None else f"{r['param_error']:.1e}"])]
                for r in rows])
  return rows


def _pallas_runs(n: int, args) -> bool:
  """The fused kernels compiled on a GPU; on a CPU, interpreted, only up to `--pallas_cpu_max`."""
  return jax.devices()[0].platform != "cpu" or n <= args.pallas_cpu_max


def _time(variants: dict, args) -> dict:
  return dv.time_variants(variants, args.repeats, args.max_seconds)


def _jax_contenders(loss, spec, n, z1, z2, args, *, blocks=(), launches=(), unrolls=(),
                    dense=True, diagonals=False) -> dict:
  shape = jax.ShapeDtypeStruct(z1.shape, z1.dtype)
  mapping = mappings.from_spec(spec)
  found = dv.jax_variants(loss, pallas=_pallas_runs(n, args), dense=dense, blocks=blocks,
                          launches=launches, unrolls=unrolls, diagonals=diagonals)
  variants = {}
  for name, (fn, launch) in found.items():
    variant, note = dv.guarded(lambda fn=fn, launch=launch: dv.build_jax(
        fn, launch, shape, mapping, z1, z2, max_bytes=args.max_gib * 2**30))
    variants[name] = variant if variant is not None else dv.Variant(None, None, note)
  if not _pallas_runs(n, args) and not launches:
    variants["Pallas"] = dv.Variant(None, None, f"interpreted on CPU: N <= {args.pallas_cpu_max}")
  return variants


def _torch_memory(loss: str, n: int) -> float:
  """Bytes PyTorch's dense loss + gradient allocates, about: float32 logits and their
  softmax, gradient and masks (measured at N = 16384 on an H200: 31.7 GiB, 5.1 GiB)."""
  return (8 * (2 * n) ** 2 if loss == "ntxent" else 5 * n * n) * 4


def _other_contenders(loss, spec, n, a, b, dtype, args) -> dict:
  """PyTorch and Inf-CL, each built (and warmed up) alone: an OOM is its own."""
  builders, out = {}, {}
  if torch_ntxent.available() and not args.no_torch:
    compile_ = dtype == "float32" and not args.no_torch_compile
    memory = _torch_memory(loss, n)
    if memory > args.max_gib * 2**30:
      out["PyTorch eager"] = dv.Variant(None, memory, "skipped: memory")
    else:
      builders.update(dv.torch_variants(loss, a, b, spec=spec, dtype=dtype, compile_=compile_))
  if loss == "clip" and dv.inf_cl_available() and not args.no_inf_cl:
    builders.update(dv.inf_cl_variants(a, b, spec=args.clip_mapping, dtype=dtype))
  for name, build in builders.items():
    variant, note = dv.guarded(build)
    out[name] = variant if variant is not None else dv.Variant(None, None, note)
  return out


def _release_torch_memory() -> None:
  """Gives PyTorch's cached GPU memory back, so that JAX can allocate it for the next size."""
  if torch_ntxent.available():
    import torch  # noqa: PLC0415

    if torch.cuda.is_available():
      torch.cuda.empty_cache()


def speed(loss: str, args, report) -> list[dict]:
  """Each contender at each size and dtype, with the floor."""
  spec = args.mapping if loss == "ntxent" else args.clip_mapping
  rows = []
  for dtype, n, (a, b, z1, z2) in _cases(args, report, loss, args.dtypes, args.sizes):
    results = _time(_jax_contenders(loss, spec, n, z1, z2, args), args)
    results.update(_time(_other_contenders(loss, spec, n, a, b, dtype, args), args))
    _release_torch_memory()
    floor, note = dv.guarded(lambda z1=z1, z2=z2: timing.measure_floor(
        z1, z2, FLOOR_MODE[loss], repeats=args.floor_repeats, min_seconds=0.2,
        chunk_bytes=int(args.floor_chunk_gib * 2**30)))
    rows.append({"n": n, "dtype": dtype, "variants": results, "floor": floor,
                 "floor_note": note})
    print(f"  {loss}, N = {n}, {dtype}: done", flush=True)
  names = list(dict.fromkeys(name for row in rows for name in row["variants"]))
  report.table(f"{loss} ({spec}), D = {args.dim}, loss + gradient: median ms (GiB)",
               ["N", "dtype", "floor", *names],
               [[r["n"], r["dtype"],
                 tables.ms(r["floor"]) + (f" {r['floor_note']}" if r["floor_note"] else "")]
                + [tables.cell(r["variants"].get(name)) for name in names] for r in rows])
  report.table(f"{loss}: ratios of medians (floor: minimum)",
               ["N", "dtype", "tiled XLA / floor", "Pallas / floor", "Pallas / tiled XLA",
                "bfloat16 / float32 (Pallas)"],
               [[r["n"], r["dtype"], tables.ratio(_median(r, "tiled XLA"), r["floor"]),
                 tables.ratio(_median(r, "Pallas"), r["floor"]),
                 tables.ratio(_median(r, "Pallas"), _median(r, "tiled XLA")),
                 tables.ratio(_median(r, "Pallas"), _median(_same(rows, r, "float32"), "Pallas"))]
                for r in rows])
  return rows


def _same(rows, row, dtype):
  return next((r for r in rows if r["n"] == row["n"] and r["dtype"] == dtype), None)


def _median(row, name):
  if row is None:
    return None
  return row["variants"].get(name, (None,))[0]


def sweep(args, report) -> list[dict]:
  """XLA's `block_size` and the kernels' launch options, timed side by side per `N`."""
  launches = [tuple(int(x) for x in launch.split(":")) for launch in args.launches]
  rows = []
  for dtype, n, (_, _, z1, z2) in _cases(args, report, "sweep", args.sweep_dtypes,
                                         args.sweep_sizes):
    variants = _jax_contenders("ntxent", args.mapping, n, z1, z2, args, blocks=args.blocks,
                               launches=launches, unrolls=args.unrolls, dense=False,
                               diagonals=not args.no_diagonals)
    rows.append({"n": n, "dtype": dtype, "variants": _time(variants, args)})
    print(f"  sweep, N = {n}, {dtype}: done", flush=True)
  names = list(dict.fromkeys(name for row in rows for name in row["variants"]))
  report.table(f"Sweep: NT-Xent ({args.mapping}), D = {args.dim}: median ms (GiB)",
               ["N", "dtype", *names],
               [[r["n"], r["dtype"]] + [tables.cell(r["variants"].get(name)) for name in names]
                for r in rows])

  def fastest(row, prefix):
    timed = [(value[0], name) for name, value in row["variants"].items()
             if name.startswith(prefix) and value[0] is not None]
    return min(timed)[1] if timed else "-"

  report.table("Sweep: the fastest per N (auto_block_size's GPU table, where the diagonal "
               "tiles go, the kernels' LAUNCH)",
               ["N", "dtype", "tiled XLA", "diagonal tiles", "Pallas"],
               [[r["n"], r["dtype"], fastest(r, "tiled XLA, block"),
                 fastest(r, "tiled XLA, diagonal"), fastest(r, "Pallas, ")] for r in rows])
  report.note(_as_tables(rows, fastest))
  return rows


def _as_tables(rows, fastest) -> str:
  """The sweep's winners as rows of `_blocks._BLOCKS["gpu"]` (float32: the matrix side `2N` of
  NT-Xent, the largest measured open-ended) and of `_triton_tiles.LAUNCH`'s gradient kernels (at
  the largest N)."""
  blocks = [(2 * r["n"], int(name.split()[-1])) for r in rows if r["dtype"] == "float32"
            for name in [fastest(r, "tiled XLA, block")] if name != "-"]
  blocks = [(side, tile) for side, tile in blocks[:-1]] + [(None, tile) for _, tile in blocks[-1:]]
  launch = []
  for dtype in ("bfloat16", "float32"):
    sized = [r for r in rows if r["dtype"] == dtype]
    name = fastest(sized[-1], "Pallas, ") if sized else "-"
    if name != "-":
      launch.append(dv.launch_rows(dtype, tuple(int(x) for x in name.split()[-1].split(":"))))
  apart = [fastest(r, "tiled XLA, diagonal") == "tiled XLA, diagonal apart" for r in rows
           if fastest(r, "tiled XLA, diagonal") != "-"]
  found = [f"`_blocks._BLOCKS['gpu'] = {tuple(blocks)!r}`"] if blocks else []
  if apart:
    found.append(f"`_blocks._DIAGONAL_APART['{jax.default_backend()}'] = {all(apart)}` (apart "
                 f"faster at {sum(apart)} of {len(apart)} sizes)")
  found += [f"`{row}`" for rows_ in launch for row in rows_]
  return "Measured rows: " + ("; ".join(found) or "none")


def _cases(args, report, label: str, dtypes, sizes):
  """`(dtype, N, dv.inputs(N, D, dtype))` for each dtype and size that `--budget_minutes` leaves
  time for (the others are skipped and said so)."""
  for dtype in dtypes:
    for n in sizes:
      if not _out_of_time(args, report, f"{label}, N = {n}, {dtype}"):
        yield dtype, n, dv.inputs(n, args.dim, dtype)


def _out_of_time(args, report, what: str) -> bool:
  """Whether `--budget_minutes` is spent (then `what` is skipped and said so)."""
  if time.monotonic() < args.deadline:
    return False
  report.note(f"{what}: skipped, --budget_minutes {args.budget_minutes} spent")
  return True


def _header(args) -> str:
  device = jax.devices()[0]
  torch_line = "torch: not used"
  if torch_ntxent.available() and not args.no_torch:
    import torch  # noqa: PLC0415

    torch_line = (f"torch {torch.__version__}, TF32 matmul allowed: "
                  f"{torch.backends.cuda.matmul.allow_tf32}")
  return (f"jax {jax.__version__} on {device.platform} ({device.device_kind}); {torch_line}; "
          f"Inf-CL: {'yes' if dv.inf_cl_available() and not args.no_inf_cl else 'no'}; "
          f"repeats {args.repeats} (at most {args.max_seconds} s a contender)")


def parse(argv: list[str] | None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="folder for device_bench.md")
  parser.add_argument("--suite", nargs="*", default=list(SUITES), choices=(*SUITES, "quick"))
  parser.add_argument("--sizes", type=int, nargs="*", default=[2**k for k in range(12, 18)])
  parser.add_argument("--check_sizes", type=int, nargs="*", default=[1000, 4096])
  parser.add_argument("--check_mappings", nargs="*", default=[spec for spec, _ in CHECKS],
                      choices=[spec for spec, _ in CHECKS])
  parser.add_argument("--sweep_sizes", type=int, nargs="*", default=[4096, 16384, 65536])
  parser.add_argument("--sweep_dtypes", nargs="*", default=["float32", "bfloat16"])
  parser.add_argument("--dim", type=int, default=256)
  parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"],
                      choices=["float32", "bfloat16", "float16"])
  parser.add_argument("--mapping", default="free", help="NT-Xent's mapping spec")
  parser.add_argument("--clip_mapping", default="tau=0.07", help="CLIP's mapping: tau=<value>")
  parser.add_argument("--blocks", type=int, nargs="*", default=[2048, 4096, 8192, 16384])
  parser.add_argument("--unrolls", type=int, nargs="*", default=[2, 4],
                      help="tiles per step of the XLA engine's tile loops to sweep (the default "
                           "tiles; `_blocks._UNROLL`)")
  parser.add_argument("--no_diagonals", action="store_true",
                      help="skip the sweep's two placements of NT-Xent's diagonal tiles")
  parser.add_argument("--launches", nargs="*",
                      default=["64:4:1", "64:4:2", "64:8:2", "128:8:2"],
                      help="the gradient kernels' block:warps:stages to sweep")
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--max_seconds", type=float, default=6.0)
  parser.add_argument("--floor_repeats", type=int, default=10)
  parser.add_argument("--floor_chunk_gib", type=float, default=2.0)
  parser.add_argument("--max_gib", type=float, default=48.0,
                      help="skip a contender whose memory estimate exceeds this")
  parser.add_argument("--pallas_cpu_max", type=int, default=128,
                      help="largest N for Pallas's interpreter on a CPU")
  parser.add_argument("--budget_minutes", type=float, default=None,
                      help="what is not started by then is skipped, and said so (default 7.5; "
                      "4.5 for --suite quick alone)")
  parser.add_argument("--quick_n", type=int, default=16384)
  parser.add_argument("--quick_check_n", type=int, default=1000)
  parser.add_argument("--quick_variants", nargs="*", default=list(device_quick.COLUMNS),
                      choices=list(device_quick.COLUMNS))
  parser.add_argument("--quick_launches", nargs="*", default=list(device_quick.LAUNCHES),
                      help="the gradient kernels' block/warps with the default variant")
  parser.add_argument("--no_torch", action="store_true")
  parser.add_argument("--no_torch_compile", action="store_true")
  parser.add_argument("--no_inf_cl", action="store_true")
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
  args = parse(argv)
  if args.budget_minutes is None:
    args.budget_minutes = 4.5 if args.suite == ["quick"] else 7.5
  args.deadline = time.monotonic() + 60 * args.budget_minutes
  report = tables.Report(args.out, _header(args))
  suites = {"correctness": correctness, "ntxent": lambda a, r: speed("ntxent", a, r),
            "clip": lambda a, r: speed("clip", a, r), "sweep": sweep,
            "quick": lambda a, r: device_quick.quick(a, r, _pallas_runs(a.quick_n, a))}
  results = {name: suites[name](args, report) for name in (*SUITES, "quick")
             if name in args.suite}
  print(f"Written: {report.path}")
  return results


if __name__ == "__main__":
  main()
