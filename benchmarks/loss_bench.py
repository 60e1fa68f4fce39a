r"""Loss + gradient time of the default `info_nce` call against its floor, PyTorch and optax.

Every function is jitted (PyTorch runs eagerly), warmed up, and timed with
`block_until_ready`, interleaved repeat by repeat so that machine load hits all alike (small
sizes repeat until the rounds take `--min_seconds`). PyTorch is timed after the JAX functions
of each size, not interleaved with them (two thread pools would contend). Ratios compare
minima over the repeats, measured in this one process (medians are printed too).

* floor (`benchmarks/timing.py`): the three products any InfoNCE loss + gradient needs, each
  timed alone at its minimum: `S = Z Z^T`, `S Z`, `S^T Z` for `Z = [z1; z2]` (`[2N, D]`,
  `negatives="all"`: 12 N^2 D multiply-adds), or `S = U1 U2^T`, `S U2`, `S^T U1` (`cross`);
  the achieved GFLOP/s of the floor, and of the loss at the tiled engine's count (8 N^2 D for
  `all`: symmetric tiles once), and the loss's ratio to that limit (`8/12` of the floor);
* ours: `info_nce(z1, z2, mapping=..., negatives=..., symmetric=...)` and
  `sigmoid_loss(z1, z2, mapping=..., negatives=...)` with no `block_size` (the default call)
  for `tau = 0.1` and the temperature-free mapping, loss and gradients of both views;
  `--mappings` adds learnable / dynamic / annealed rows and their ratios to `tau = 0.1`;
* ours with bfloat16 inputs (`all`, `cross`, `symmetric`, the free mapping): the tile products
  take bfloat16 operands accumulated in float32 (on a CPU they may well be slower than
  float32's: printed, not tuned for);
* PyTorch eager, LightlySSL's NT-Xent formula (`benchmarks/torch_ntxent.py`), `tau = 0.1` and
  the free mapping, when torch is installed (`pip install -e ".[bench]"`);
* `optax.losses.ntxent` (`tau = 0.1`) where XLA's memory estimate for its `[2N, 2N, D]`
  tensor fits `--optax_max_gib`.

Run: python -m benchmarks.loss_bench              (N = 256 ... 8192; minutes on 2 cores)
     python -m benchmarks.loss_bench --sizes 512 1024 --repeats 5
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import timing, torch_ntxent
from benchmarks.timing import time_interleaved
from tfcl_jax import losses, mappings

MODES = {"all": ("all", False), "cross": ("cross", False), "symmetric": ("cross", True),
         "sigmoid all": ("all", None), "sigmoid cross": ("cross", None)}
BFLOAT16 = ("all", "cross", "symmetric")  # the modes also timed with bfloat16 inputs


def _ours(spec: str, mode: str):
  negatives, symmetric = MODES[mode]

  def loss(z1, z2, mapping):
    if symmetric is None:  # SigLIP's loss, bias 0: the free mapping's closed form applies
      return losses.sigmoid_loss(z1, z2, mapping=mapping, negatives=negatives)
    return losses.info_nce(z1, z2, mapping=mapping, negatives=negatives, symmetric=symmetric)

  if spec == "free_n":  # the loss fills in its own candidate count; no parameter
    grad = jax.jit(jax.value_and_grad(lambda z1, z2: loss(z1, z2, spec), argnums=(0, 1)))
    return grad
  # Gradients reach both views and, for a learnable mapping, its t.
  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
  mapping = mappings.from_spec(spec)
  return lambda z1, z2: grad(z1, z2, mapping)


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


def _measure(n: int, args, use_torch: bool, notes: list) -> dict:
  """Min and median seconds of every timed function at `n` pairs, and the floors."""
  rng = np.random.default_rng(n)
  a = rng.normal(size=(n, args.dim)).astype(np.float32)
  b = (a + 0.5 * rng.normal(size=(n, args.dim))).astype(np.float32)
  z1, z2 = jax.device_put(a), jax.device_put(b)
  fns = {(mode, spec): (_ours(spec, mode), (z1, z2)) for mode in MODES
         for spec in args.mappings}
  half = (jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16))
  fns.update({(f"{mode} bfloat16", "free"): (_ours("free", mode), half) for mode in BFLOAT16})
  few = {}
  compiled, temp_gib = _optax(n, args.dim)
  if temp_gib is not None and temp_gib > args.optax_max_gib:
    notes.append(f"optax ntxent skipped at N = {n}: XLA estimates {temp_gib:.1f} GiB of "
                 f"temporaries (> --optax_max_gib {args.optax_max_gib:g}).")
  else:
    fns["optax"] = (compiled, (z1, z2))
    few["optax"] = args.baseline_repeats
  timings = time_interleaved(fns, args.repeats, few, min_seconds=args.min_seconds)
  if use_torch:  # after the JAX functions, not interleaved: two thread pools would contend
    torch_fns = {name: (torch_ntxent.loss_and_grad_fn(a, b, temperature=0.1, mapping=spec), ())
                 for name, spec in (("torch tau", "tau"), ("torch free", "free"))}
    timings.update(time_interleaved(torch_fns, args.baseline_repeats))
  for mode in ("all", "cross"):
    floor = timing.measure_floor(z1, z2, mode, repeats=args.floor_repeats)
    timings[f"floor {mode}"] = (floor, floor)
  return timings


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", type=int, nargs="*",
                      default=[256, 512, 1024, 2048, 4096, 8192])
  parser.add_argument("--dim", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--floor_repeats", type=int, default=25,
                      help="interleaved repeats of each floor product (its minimum counts)")
  parser.add_argument("--min_seconds", type=float, default=3.0,
                      help="small sizes repeat until the rounds take this long")
  parser.add_argument("--baseline_repeats", type=int, default=3,
                      help="timed calls of PyTorch and optax")
  parser.add_argument("--optax_max_gib", type=float, default=6.0,
                      help="skip optax where XLA's temp-memory estimate exceeds this")
  parser.add_argument("--mappings", nargs="*", default=["tau=0.1", "free"],
                      help="mapping specs timed in every mode (tau=0.1 and free are needed "
                           "for the ratios)")
  parser.add_argument("--no_torch", action="store_true")
  args = parser.parse_args(argv)
  use_torch = torch_ntxent.available() and not args.no_torch
  print(f"jax {jax.__version__}, {jax.devices()[0].platform} ({jax.device_count()} devices), "
        f"D = {args.dim}, float32 (and bfloat16), loss + gradient, min (median) of "
        f"{args.repeats} interleaved repeats (PyTorch, optax: {args.baseline_repeats}); "
        f"floor products: min of {args.floor_repeats}; "
        f"torch: {'yes' if use_torch else 'not installed'}")

  rows, notes = [], []
  for n in args.sizes:
    rows.append((n, _measure(n, args, use_torch, notes)))
    print(f"  N = {n}: done", flush=True)

  print("\nAbsolute, ms: min (median)")
  names = list(rows[0][1])
  print("| N | " + " | ".join(" ".join(name) if isinstance(name, tuple) else name
                              for name in names) + " |")
  print("|---" * (len(names) + 1) + "|")
  for n, t in rows:
    print(f"| {n} | " + " | ".join(
        f"{1e3 * t[name][1]:.1f} ({1e3 * t[name][0]:.1f})" if name in t else "-"
        for name in names) + " |")

  def r(x, y):
    return f"{x / y:.2f}" if x is not None and y is not None else "-"

  def best(t, name):
    return t[name][1] if name in t else None

  print("\nRatios of minima, default call (no block_size):")
  print("| N | all tau / floor | all free / floor | cross tau / floor | cross free / floor "
        "| symmetric tau / floor | symmetric free / floor | free / tau (all, cross, symmetric) "
        "| PyTorch tau / ours | PyTorch free / ours | optax / ours |")
  print("|---" * 11 + "|")
  for n, t in rows:
    fa, fc = best(t, "floor all"), best(t, "floor cross")

    def get(name, t=t):
      return best(t, name)

    print(f"| {n} | {r(get(('all', 'tau=0.1')), fa)} | {r(get(('all', 'free')), fa)} "
          f"| {r(get(('cross', 'tau=0.1')), fc)} | {r(get(('cross', 'free')), fc)} "
          f"| {r(get(('symmetric', 'tau=0.1')), fc)} | {r(get(('symmetric', 'free')), fc)} "
          f"| {r(get(('all', 'free')), get(('all', 'tau=0.1')))}, "
          f"{r(get(('cross', 'free')), get(('cross', 'tau=0.1')))}, "
          f"{r(get(('symmetric', 'free')), get(('symmetric', 'tau=0.1')))} "
          f"| {r(get('torch tau'), get(('all', 'tau=0.1')))} "
          f"| {r(get('torch free'), get(('all', 'free')))} "
          f"| {r(get('optax'), get(('all', 'tau=0.1')))} |")
  print("\nThroughput, negatives='all', free mapping: the floor's GFLOP/s "
        "(12 N^2 D multiply-adds), "
        "the loss's at the tiled count (8 N^2 D), and loss / (8/12 floor), the distance from "
        "the symmetric-tile limit:")
  print("| N | floor GFLOP/s | loss GFLOP/s | loss / tile limit |")
  print("|---|---|---|---|")
  for n, t in rows:
    floor_macs, tiled_macs = timing.multiply_adds("all", n, args.dim)
    fa, loss = best(t, "floor all"), best(t, ("all", "free"))
    if loss is None:
      continue
    print(f"| {n} | {2 * floor_macs / fa / 1e9:.1f} | {2 * tiled_macs / loss / 1e9:.1f} | "
          f"{loss / (fa * tiled_macs / floor_macs):.2f} |")
  print("\nSigmoid loss / InfoNCE, same mapping and negatives, default call:")
  print("| N | all tau | all free | cross tau | cross free |")
  print("|---|---|---|---|---|")
  for n, t in rows:
    print(f"| {n} | " + " | ".join(
        r(best(t, (f"sigmoid {mode}", spec)), best(t, (mode, spec)))
        for mode in ("all", "cross") for spec in ("tau=0.1", "free")) + " |")
  print("\nbfloat16 inputs / float32 inputs, free mapping, default call:")
  print("| N | " + " | ".join(BFLOAT16) + " |")
  print("|---" * (len(BFLOAT16) + 1) + "|")
  for n, t in rows:
    print(f"| {n} | " + " | ".join(
        r(best(t, (f"{mode} bfloat16", "free")), best(t, (mode, "free"))) for mode in BFLOAT16)
        + " |")
  others = [spec for spec in args.mappings if spec not in ("tau=0.1", "free")]
  if others:
    print("\nOther mappings / tau=0.1, same loss and negatives, default call:")
    print("| N | mapping | " + " | ".join(MODES) + " |")
    print("|---" * (len(MODES) + 2) + "|")
    for n, t in rows:
      for spec in others:
        print(f"| {n} | {spec} | " + " | ".join(
            r(best(t, (mode, spec)), best(t, (mode, "tau=0.1"))) for mode in MODES) + " |")
  for note in notes:
    print("  " + note)


if __name__ == "__main__":
  main()
