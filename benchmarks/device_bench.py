r"""NT-Xent loss + gradient on the default device: each implementation, its floor, PyTorch.

For N = 2^10 ... 2^17 pairs, D = 256 and 768, float32 and bfloat16 inputs, `negatives="all"`
with the temperature-free map (`--mapping`), side by side in one process:

* dense XLA: the textbook formulation (the `[2N, 2N]` logits, `jax.nn.logsumexp`, autodiff);
* tiled XLA: `info_nce(..., implementation="xla")`, the default call (`--blocks`: also with
  other tile sizes, the measurement that confirms or changes `losses.auto_block_size`);
* Pallas: `info_nce(..., implementation="pallas")`: Triton kernels on a GPU, the XLA engine on
  a TPU, Pallas's interpreter on a CPU (there only up to `--pallas_cpu_max` pairs: slow);
* floor: the three products `S = Z Z^T`, `S Z`, `S^T Z` each timed alone at its minimum
  (`benchmarks/timing.py`);
* PyTorch eager (LightlySSL's NT-Xent formula, `benchmarks/torch_ntxent.py`) and
  `torch.compile` of it, on the same device, when torch is installed.

Time: median over interleaved repeats, after a warm-up call (compilation). Memory: XLA's own
estimate for the compiled program (`memory_analysis`: arguments, outputs and temporaries),
and PyTorch's peak allocation on a GPU. A variant whose estimate exceeds `--max_gib` is
skipped (dense logits grow as N^2) and said so. Ratios are of medians from this one run.

Run (on a GPU): python -m benchmarks.device_bench [--blocks 2048 8192]
     (on a CPU, small sizes): python -m benchmarks.device_bench --sizes 256 512 --dims 64
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import timing, torch_ntxent
from tfcl_jax import losses, mappings

VARIANTS = ("dense XLA", "tiled XLA", "Pallas", "PyTorch eager", "torch.compile")


def dense_nt_xent(z1, z2, *, mapping):
  """NT-Xent as it is usually written: every logit held, `logsumexp` over each row."""
  z = jnp.concatenate([z1, z2]).astype(jnp.float32)
  z = z / jnp.linalg.norm(z, axis=1, keepdims=True)
  n = z1.shape[0]
  logits = mapping(z @ z.T)
  logits = jnp.where(jnp.eye(2 * n, dtype=bool), -jnp.inf, logits)
  positive = jnp.concatenate([jnp.arange(n, 2 * n), jnp.arange(n)])
  return jnp.mean(jax.nn.logsumexp(logits, axis=1) - logits[jnp.arange(2 * n), positive])


def _compiled(loss, shape):
  """The jitted loss + gradient compiled for `shape`, and XLA's memory estimate in bytes."""
  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  compiled = grad.lower(shape, shape).compile()
  memory = compiled.memory_analysis()
  if memory is None:
    return compiled, None
  return compiled, (memory.argument_size_in_bytes + memory.output_size_in_bytes
                    + memory.temp_size_in_bytes)


def _jax_variants(mapping, shape, *, pallas: bool, blocks=()):
  variants = {"dense XLA": functools.partial(dense_nt_xent, mapping=mapping),
              "tiled XLA": functools.partial(losses.info_nce, mapping=mapping,
                                             negatives="all")}
  for block in blocks:  # the default's alternatives (losses.auto_block_size)
    variants[f"tiled XLA, block {block}"] = functools.partial(
        losses.info_nce, mapping=mapping, negatives="all", block_size=block)
  if pallas:
    variants["Pallas"] = functools.partial(losses.info_nce, mapping=mapping, negatives="all",
                                           implementation="pallas")
  return {name: _compiled(loss, shape) for name, loss in variants.items()}


def measure(n: int, d: int, dtype: str, args) -> dict:
  """`{variant: (median seconds or None, bytes or None, note)}` and the floor at one size."""
  platform = jax.devices()[0].platform
  rng = np.random.default_rng(n + d)
  a = rng.normal(size=(n, d)).astype(np.float32)
  b = (a + 0.5 * rng.normal(size=(n, d))).astype(np.float32)
  z1, z2 = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
  shape = jax.ShapeDtypeStruct((n, d), jnp.dtype(dtype))
  mapping = mappings.from_spec(args.mapping)
  pallas = platform != "cpu" or n <= args.pallas_cpu_max
  results, fns = {}, {}
  for name, (compiled, memory) in _jax_variants(mapping, shape, pallas=pallas,
                                                blocks=args.blocks).items():
    if memory is not None and memory > args.max_gib * 2**30:
      results[name] = (None, memory, f"skipped: {memory / 2**30:.1f} GiB > --max_gib")
    else:
      fns[name] = (compiled, (z1, z2))
      results[name] = (None, memory, "interpreted" if name == "Pallas" and platform == "cpu"
                       else "")
  if not pallas:
    results["Pallas"] = (None, None, f"interpreted on CPU: only N <= {args.pallas_cpu_max}")
  for name, (median, _) in timing.time_interleaved(fns, args.repeats).items():
    results[name] = (median, *results[name][1:])
  if torch_ntxent.available() and not args.no_torch:
    for name, compiled in (("PyTorch eager", False), ("torch.compile", True)):
      if compiled and args.no_torch_compile:
        continue
      run, peak = torch_ntxent.device_loss_and_grad_fn(a, b, mapping=args.mapping,
                                                      dtype=dtype, compile=compiled)
      median, _ = timing.time_interleaved({name: (run, ())}, args.repeats)[name]
      results[name] = (median, peak(), "")
  floor = timing.measure_floor(z1.astype(jnp.float32), z2.astype(jnp.float32), "all",
                               repeats=args.floor_repeats, min_seconds=0.5)
  return {"variants": results, "floor": floor}


def _ms(seconds):
  return "-" if seconds is None else f"{1e3 * seconds:.2f}"


def _gib(size):
  return "-" if size is None else f"{size / 2**30:.3f}"


def _ratio(x, y):
  return "-" if x is None or y is None else f"{x / y:.2f}"


def main(argv: list[str] | None = None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", type=int, nargs="*", default=[2**k for k in range(10, 18)])
  parser.add_argument("--dims", type=int, nargs="*", default=[256, 768])
  parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"],
                      choices=["float32", "bfloat16"])
  parser.add_argument("--mapping", default="free", help="a mapping spec (mappings.from_spec)")
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--floor_repeats", type=int, default=10)
  parser.add_argument("--max_gib", type=float, default=32.0,
                      help="skip a JAX variant whose XLA memory estimate exceeds this")
  parser.add_argument("--pallas_cpu_max", type=int, default=512,
                      help="largest N for the Pallas interpreter on a CPU")
  parser.add_argument("--blocks", type=int, nargs="*", default=[],
                      help="also time the tiled XLA loss with these block sizes (the default "
                           "tile's alternatives)")
  parser.add_argument("--no_torch", action="store_true")
  parser.add_argument("--no_torch_compile", action="store_true")
  args = parser.parse_args(argv)
  device = jax.devices()[0]
  print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}); NT-Xent "
        f"(negatives='all', {args.mapping}), loss + gradient, median of {args.repeats} "
        f"interleaved repeats; torch: "
        f"{'yes' if torch_ntxent.available() and not args.no_torch else 'no'}")
  rows = []
  for dtype in args.dtypes:
    for d in args.dims:
      for n in args.sizes:
        row = {"n": n, "d": d, "dtype": dtype, **measure(n, d, dtype, args)}
        rows.append(row)
        print(f"  N = {n}, D = {d}, {dtype}: done", flush=True)
  print("\nTime, ms (memory, GiB):")
  print("| N | D | dtype | floor | " + " | ".join(VARIANTS) + " |")
  print("|---" * (4 + len(VARIANTS)) + "|")
  for row in rows:
    cells = []
    for name in VARIANTS:
      median, memory, note = row["variants"].get(name, (None, None, "not run"))
      cell = f"{_ms(median)} ({_gib(memory)})"
      cells.append(cell + (f" {note}" if note else ""))
    print(f"| {row['n']} | {row['d']} | {row['dtype']} | {_ms(row['floor'])} | "
          + " | ".join(cells) + " |")
  for block in args.blocks:
    print(f"\ntiled XLA with block {block} / the default call, medians:")
    print("| N | D | dtype | ratio |")
    print("|---|---|---|---|")
    for row in rows:
      t = row["variants"]
      print(f"| {row['n']} | {row['d']} | {row['dtype']} | "
            f"{_ratio(t[f'tiled XLA, block {block}'][0], t['tiled XLA'][0])} |")
  print("\nRatios of medians (floor: minimum):")
  print("| N | D | dtype | tiled / floor | Pallas / tiled | dense / tiled | PyTorch eager / "
        "tiled | torch.compile / tiled |")
  print("|---" * 8 + "|")
  for row in rows:
    t = {name: value[0] for name, value in row["variants"].items()}
    tiled = t.get("tiled XLA")
    print(f"| {row['n']} | {row['d']} | {row['dtype']} | {_ratio(tiled, row['floor'])} | "
          f"{_ratio(t.get('Pallas'), tiled)} | {_ratio(t.get('dense XLA'), tiled)} | "
          f"{_ratio(t.get('PyTorch eager'), tiled)} | {_ratio(t.get('torch.compile'), tiled)} |")
  return rows


if __name__ == "__main__":
  main()
