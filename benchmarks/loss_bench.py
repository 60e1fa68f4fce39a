r"""Loss + gradient time of `info_nce` per mapping, against `optax.losses.ntxent` and a floor.

The floor is the three dense products no InfoNCE loss + gradient can avoid: the logits
`U1 U2^T` and the two backward products `dlogits U2`, `dlogits^T U1` (with `2N` rows for
`negatives="all"`). `optax.losses.ntxent` on `concat([z1, z2])` with pair labels is the same
loss as `info_nce(..., negatives="all")`; it builds a `[2N, 2N, D]` tensor, so it is compiled
only where XLA's memory estimate fits (`--optax_max_gib`) and skipped, with a note, elsewhere.
All functions are jitted, warmed up, timed with `block_until_ready`, interleaved repeat by
repeat so that machine load hits them alike, and summarised by the median.

Run: python -m benchmarks.loss_bench            (N = 512, 2048, 4096; minutes on 2 cores)
     python -m benchmarks.loss_bench --quick    (N = 256, 512; seconds)
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import optax

from tfcl_jax import losses, mappings

MAPPINGS = ("tau=0.1", "free", "learnable=0.1", "dynamic=0.1:0.2", "anneal=cosine:0.5:0.1:1000")


def _loss_and_grad(spec: str, negatives: str):
  mapping = mappings.from_spec(spec)

  def loss(z1, z2, params, step):
    return losses.info_nce(
        z1, z2, mapping=lambda cos: mapping(cos, params=params, step=step), negatives=negatives)

  # Gradients reach the embeddings and, for the learnable map, its t.
  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
  params, step = dict(mapping.params), jnp.asarray(500, jnp.int32)
  return lambda z1, z2: grad(z1, z2, params, step)


def _optax(n: int, d: int):
  labels = jnp.concatenate([jnp.arange(n), jnp.arange(n)])
  grad = jax.jit(jax.value_and_grad(
      lambda z1, z2: optax.losses.ntxent(jnp.concatenate([z1, z2]), labels, temperature=0.1),
      argnums=(0, 1)))
  shape = jax.ShapeDtypeStruct((n, d), jnp.float32)
  compiled = grad.lower(shape, shape).compile()
  memory = compiled.memory_analysis()
  temp_gib = None if memory is None else memory.temp_size_in_bytes / 2**30
  return compiled, temp_gib


@jax.jit
def _floor(u1, u2, dlogits):
  """The three `[rows, D] x [D, rows]`-sized products of any loss + gradient."""
  return u1 @ u2.T, dlogits @ u2, dlogits.T @ u1


def _floor_args(z1, z2, negatives: str):
  u1, u2 = (z1, z2) if negatives == "cross" else (jnp.concatenate([z1, z2]),) * 2
  dlogits = jax.random.normal(jax.random.key(1), (u1.shape[0], u1.shape[0]), u1.dtype)
  return jax.block_until_ready((u1, u2, dlogits))


def _time(fns: dict, repeats: int, few: dict[str, int]) -> dict[str, tuple[float, float]]:
  """`fns`: name -> (jitted function, args). (median, min) seconds per call.

  Repeats are interleaved: round r times every function once, so load spikes hit all alike.
  Functions named in `few` (slow baselines) are timed only in their first `few[name]` rounds.
  """
  for fn, args in fns.values():  # warm-up: compile and run once.
    jax.block_until_ready(fn(*args))
  samples = {name: [] for name in fns}
  for round_ in range(repeats):
    for name, (fn, args) in fns.items():
      if round_ >= few.get(name, repeats):
        continue
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      samples[name].append(time.perf_counter() - start)
  return {name: (statistics.median(times), min(times)) for name, times in samples.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="N = 256, 512 and fewer repeats.")
  parser.add_argument("--sizes", type=int, nargs="*", default=None)
  parser.add_argument("--dim", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=None)
  parser.add_argument("--optax_repeats", type=int, default=2, help="Timed calls of optax.")
  parser.add_argument("--optax_max_gib", type=float, default=6.0,
                      help="Skip optax where XLA's temp-memory estimate exceeds this.")
  args = parser.parse_args()
  sizes = args.sizes or ([256, 512] if args.quick else [512, 1024, 2048, 4096])
  repeats = args.repeats or (5 if args.quick else 9)
  print(f"jax {jax.__version__}, optax {optax.__version__}, {jax.devices()[0].platform}, "
        f"D = {args.dim}, float32, median and min of {repeats} interleaved repeats "
        f"(optax: {min(args.optax_repeats, repeats)})")

  results, notes = {}, []
  for n in sizes:
    key1, key2 = jax.random.split(jax.random.key(n))
    z1 = jax.random.normal(key1, (n, args.dim))
    z2 = z1 + 0.5 * jax.random.normal(key2, (n, args.dim))
    fns = {}
    for negatives in ("cross", "all"):
      fns[(negatives, "floor")] = (_floor, _floor_args(z1, z2, negatives))
      for spec in MAPPINGS:
        fns[(negatives, spec)] = (_loss_and_grad(spec, negatives), (z1, z2))
    compiled, temp_gib = _optax(n, args.dim)
    if temp_gib is not None and temp_gib > args.optax_max_gib:
      notes.append(f"optax ntxent skipped at N = {n}: XLA estimates {temp_gib:.1f} GiB of "
                   f"temporaries (> --optax_max_gib {args.optax_max_gib:g}).")
    else:
      fns[("all", "optax ntxent tau=0.1")] = (compiled, (z1, z2))
    timings = _time(fns, repeats, {("all", "optax ntxent tau=0.1"): args.optax_repeats})
    results.update({(n, *name): t for name, t in timings.items()})

  print(f"\n{'N':>5} {'negatives':>9} {'loss + grad':>28} {'median ms':>10} {'min ms':>9} "
        f"{'x floor':>8}")
  for (n, negatives, name), (median, fastest) in results.items():
    floor = results[(n, negatives, "floor")][0]
    print(f"{n:>5} {negatives:>9} {name:>28} {1e3 * median:>10.2f} {1e3 * fastest:>9.2f} "
          f"{median / floor:>8.2f}")

  def ratio(n, negatives, a, b):
    (median_a, min_a), (median_b, min_b) = results[(n, negatives, a)], results[(n, negatives, b)]
    return f"{median_a / median_b:7.2f} (min/min {min_a / min_b:6.2f})"

  print("\nRatios of medians (same process, interleaved):")
  for n in sizes:
    for negatives in ("cross", "all"):
      free_over_tau = ratio(n, negatives, "free", "tau=0.1")
      print(f"  free / tau=0.1   N = {n:>5} {negatives:>5}: {free_over_tau}  target <= 1.1")
  for n in sizes:
    if (n, "all", "optax ntxent tau=0.1") in results:
      print(f"  optax / ours     N = {n:>5}   all: "
            f"{ratio(n, 'all', 'optax ntxent tau=0.1', 'tau=0.1')}  target >= 20 at N = 2048")
  for n in sizes:
    for negatives in ("cross", "all"):
      print(f"  ours / floor     N = {n:>5} {negatives:>5}: "
            f"tau=0.1 {ratio(n, negatives, 'tau=0.1', 'floor')}, "
            f"free {ratio(n, negatives, 'free', 'floor')}")
  for note in notes:
    print("  " + note)


if __name__ == "__main__":
  main()
