r"""Loss + gradient time of the default `info_nce` call against its floor, PyTorch and optax.

Every function is jitted (PyTorch runs eagerly), warmed up, and timed with
`block_until_ready`, interleaved repeat by repeat so that machine load hits all alike (small
sizes repeat until the rounds take `--min_seconds`), and summarised by the median. PyTorch is
timed after the JAX functions of each size, not interleaved with them (two thread pools would
contend). Ratios are of medians measured in this one process.

* floor, `negatives="all"`: the three products any NT-Xent loss + gradient needs,
  `S = Z Z^T`, `S Z`, `S^T Z` for `Z = [z1; z2]` (`[2N, D]`);
* floor, `negatives="cross"`: `S = U1 U2^T`, `S U2`, `S^T U1`;
* ours: `info_nce(z1, z2, mapping=..., negatives=..., symmetric=...)` and
  `sigmoid_loss(z1, z2, mapping=..., negatives=...)` with no `block_size` (the default call)
  for `tau = 0.1` and the temperature-free map, loss and gradients of both views;
  `--mappings` adds learnable / dynamic / annealed rows and their ratios to `tau = 0.1`;
* PyTorch eager, LightlySSL's NT-Xent formula (`benchmarks/torch_ntxent.py`), `tau = 0.1` and
  the free map, when torch is installed (`pip install -e ".[bench]"`);
* `optax.losses.ntxent` (`tau = 0.1`) where XLA's memory estimate for its `[2N, 2N, D]`
  tensor fits `--optax_max_gib`.

Run: python -m benchmarks.loss_bench              (N = 256 ... 8192; minutes on 2 cores)
     python -m benchmarks.loss_bench --sizes 512 1024 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import torch_ntxent
from tfcl_jax import losses, mappings

MODES = {"all": ("all", False), "cross": ("cross", False), "symmetric": ("cross", True),
         "sigmoid all": ("all", None), "sigmoid cross": ("cross", None)}


def _ours(spec: str, mode: str):
  negatives, symmetric = MODES[mode]
  mapping = mappings.from_spec(spec)

  def loss(z1, z2, mapping):
    if symmetric is None:  # SigLIP's loss, bias 0: the free map's closed form applies
      return losses.sigmoid_loss(z1, z2, mapping=mapping, negatives=negatives)
    return losses.info_nce(z1, z2, mapping=mapping, negatives=negatives, symmetric=symmetric)

  # Gradients reach both views and, for a learnable map, its t.
  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
  return lambda z1, z2: grad(z1, z2, mapping)


@jax.jit
def _floor_all(z1, z2):
  z = jnp.concatenate([z1, z2])
  s = z @ z.T
  return s @ z, s.T @ z


@jax.jit
def _floor_cross(u1, u2):
  s = u1 @ u2.T
  return s @ u2, s.T @ u1


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


def time_interleaved(fns: dict, repeats: int, few: dict, *, min_seconds: float = 0.0) -> dict:
  """`fns`: name -> (function, args). Median and min seconds per call, interleaved rounds.

  Functions named in `few` (slow baselines) are timed only in their first `few[name]` rounds.
  Small sizes get more rounds, until a round's total reaches `min_seconds` over all rounds.
  """
  warm = {}
  for name, (fn, args) in fns.items():  # warm-up: compile and run once, then time one call.
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    warm[name] = time.perf_counter() - start
  per_round = sum(t for name, t in warm.items() if name not in few)
  repeats = max(repeats, min(200, int(min_seconds / max(per_round, 1e-6))))
  samples = {name: [] for name in fns}
  for round_ in range(repeats):
    for name, (fn, args) in fns.items():
      if round_ >= few.get(name, repeats):
        continue
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      samples[name].append(time.perf_counter() - start)
  return {name: (statistics.median(t), min(t)) for name, t in samples.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", type=int, nargs="*",
                      default=[256, 512, 1024, 2048, 4096, 8192])
  parser.add_argument("--dim", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=7)
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
  args = parser.parse_args()
  use_torch = torch_ntxent.available() and not args.no_torch
  print(f"jax {jax.__version__}, {jax.devices()[0].platform} ({jax.device_count()} devices), "
        f"D = {args.dim}, float32, loss + gradient, median of {args.repeats} interleaved "
        f"repeats (PyTorch, optax: {args.baseline_repeats}); torch: "
        f"{'yes' if use_torch else 'not installed'}")

  rows, notes = [], []
  for n in args.sizes:
    rng = np.random.default_rng(n)
    a = rng.normal(size=(n, args.dim)).astype(np.float32)
    b = (a + 0.5 * rng.normal(size=(n, args.dim))).astype(np.float32)
    z1, z2 = jax.device_put(a), jax.device_put(b)
    fns = {"floor all": (_floor_all, (z1, z2)), "floor cross": (_floor_cross, (z1, z2))}
    for mode in MODES:
      for spec in args.mappings:
        fns[mode, spec] = (_ours(spec, mode), (z1, z2))
    few = {}
    compiled, temp_gib = _optax(n, args.dim)
    if temp_gib is not None and temp_gib > args.optax_max_gib:
      notes.append(f"optax ntxent skipped at N = {n}: XLA estimates {temp_gib:.1f} GiB of "
                   f"temporaries (> --optax_max_gib {args.optax_max_gib:g}).")
    else:
      fns["optax"] = (compiled, (z1, z2))
      few["optax"] = args.baseline_repeats
    timings = {name: t[0] for name, t in time_interleaved(
        fns, args.repeats, few, min_seconds=args.min_seconds).items()}
    if use_torch:  # after the JAX functions, not interleaved: two thread pools would contend
      torch_fns = {name: (torch_ntxent.loss_and_grad_fn(a, b, temperature=0.1, mapping=spec), ())
                   for name, spec in (("torch tau", "tau"), ("torch free", "free"))}
      timings.update({name: t[0] for name, t in time_interleaved(
          torch_fns, args.baseline_repeats, {}).items()})
    rows.append((n, timings))
    print(f"  N = {n}: done", flush=True)

  print("\nAbsolute medians (ms):")
  names = list(rows[0][1])
  print("| N | " + " | ".join(" ".join(name) if isinstance(name, tuple) else name
                              for name in names) + " |")
  print("|---" * (len(names) + 1) + "|")
  for n, t in rows:
    print(f"| {n} | " + " | ".join(f"{1e3 * t[name]:.1f}" if name in t else "-"
                                   for name in names) + " |")

  def r(x, y):
    return f"{x / y:.2f}" if x is not None and y is not None else "-"

  print("\nRatios of medians, default call (no block_size):")
  print("| N | all tau / floor | all free / floor | cross tau / floor | cross free / floor "
        "| symmetric tau / floor | symmetric free / floor | free / tau (all, cross, symmetric) "
        "| PyTorch tau / ours | PyTorch free / ours | optax / ours |")
  print("|---" * 11 + "|")
  for n, t in rows:
    fa, fc = t["floor all"], t["floor cross"]
    get = t.get
    print(f"| {n} | {r(get(('all', 'tau=0.1')), fa)} | {r(get(('all', 'free')), fa)} "
          f"| {r(get(('cross', 'tau=0.1')), fc)} | {r(get(('cross', 'free')), fc)} "
          f"| {r(get(('symmetric', 'tau=0.1')), fc)} | {r(get(('symmetric', 'free')), fc)} "
          f"| {r(get(('all', 'free')), get(('all', 'tau=0.1')))}, "
          f"{r(get(('cross', 'free')), get(('cross', 'tau=0.1')))}, "
          f"{r(get(('symmetric', 'free')), get(('symmetric', 'tau=0.1')))} "
          f"| {r(get('torch tau'), get(('all', 'tau=0.1')))} "
          f"| {r(get('torch free'), get(('all', 'free')))} "
          f"| {r(get('optax'), get(('all', 'tau=0.1')))} |")
  print("\nSigmoid loss / InfoNCE, same mapping and negatives, default call:")
  print("| N | all tau | all free | cross tau | cross free |")
  print("|---|---|---|---|---|")
  for n, t in rows:
    get = t.get
    print(f"| {n} | " + " | ".join(
        r(get((f"sigmoid {mode}", spec)), get((mode, spec)))
        for mode in ("all", "cross") for spec in ("tau=0.1", "free")) + " |")
  others = [spec for spec in args.mappings if spec not in ("tau=0.1", "free")]
  if others:
    print("\nOther mappings / tau=0.1, same loss and negatives, default call:")
    print("| N | mapping | " + " | ".join(MODES) + " |")
    print("|---" * (len(MODES) + 2) + "|")
    for n, t in rows:
      for spec in others:
        print(f"| {n} | {spec} | " + " | ".join(
            r(t.get((mode, spec)), t.get((mode, "tau=0.1"))) for mode in MODES) + " |")
  for note in notes:
    print("  " + note)


if __name__ == "__main__":
  main()
