r"""Loss + gradient time of the batch-scaled mappings against free's, side by side in one process.

`calibrated_free`, `perplexity_free` and `accuracy_free` solve their scale from the batch each
call: one forward-only pass of the softmax's moments over the similarity matrix (`ScaleMoments`,
15 grid scales), then the loss at the scale. Timed, every function jitted and interleaved round by
round (`benchmarks/timing.py`), minimum over the repeats:

* `free`: `info_nce(z1, z2)`, loss and gradients of both views (its closed form
  `exp(f(c)) = (1 + c)/(1 - c)`, no running maximum);
* `free (no closed form)`: the same mapping as a plain callable, which the engine runs with the
  running maximum, as it runs a scaled mapping;
* each batch-scaled mapping, loss and gradients (the pass included);
* `batch_scale`: each mapping's pass and solve alone (forward only).

Run: python -m benchmarks.batch_scale_bench                 (N = 4096, 8192; minutes on 2 cores)
     python -m benchmarks.batch_scale_bench --sizes 1024 --repeats 3
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from benchmarks.timing import time_interleaved
from tfcl_jax import losses, mappings

MODES = {"all": {"negatives": "all"}, "cross": {}}
SCALED = ("calibrated_free", "perplexity_free", "accuracy_free")


def _mapping(name: str) -> mappings.Mapping:
  if name == "free (no closed form)":
    free = mappings.temperature_free()
    return mappings.as_mapping(lambda cos: free(cos))
  return {"free": mappings.temperature_free, "calibrated_free": mappings.calibrated_free,
          "perplexity_free": mappings.perplexity_free,
          "accuracy_free": mappings.accuracy_free}[name]()


def _functions(mode: str) -> dict:
  kwargs = MODES[mode]
  fns = {}
  for name in ("free", "free (no closed form)", *SCALED):
    mapping = _mapping(name)
    fns[mode, name] = jax.jit(jax.value_and_grad(
        lambda a, b, m=mapping: losses.info_nce(a, b, mapping=m, **kwargs), argnums=(0, 1)))
  for name in SCALED:
    mapping = _mapping(name)
    fns[mode, f"{name} batch_scale"] = jax.jit(
        lambda a, b, m=mapping: losses.batch_scale(a, b, mapping=m, **kwargs))
  return fns


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", type=int, nargs="*", default=[4096, 8192])
  parser.add_argument("--dim", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}, D = {args.dim}, float32, loss + "
        f"gradient of both views, min (median) of {args.repeats} interleaved repeats")
  rows = []
  for n in args.sizes:
    rng = np.random.default_rng(n)
    a = rng.normal(size=(n, args.dim)).astype(np.float32)
    b = (a + 0.5 * rng.normal(size=(n, args.dim))).astype(np.float32)
    z1, z2 = jax.device_put(a), jax.device_put(b)
    fns = {key: (fn, (z1, z2)) for mode in MODES for key, fn in _functions(mode).items()}
    rows.append((n, time_interleaved(fns, args.repeats)))
    print(f"  N = {n}: done", flush=True)

  print("\nAbsolute, ms: min (median)")
  for n, t in rows:
    for (mode, name), (median, best) in t.items():
      print(f"| {n} | {mode} | {name} | {1e3 * best:.1f} ({1e3 * median:.1f}) |")
  print("\nRatios of minima to free's (same N and negatives):")
  names = ["free (no closed form)", *SCALED, *(f"{name} batch_scale" for name in SCALED)]
  print("| N | negatives | " + " | ".join(names) + " |")
  print("|---" * (len(names) + 2) + "|")
  for n, t in rows:
    for mode in MODES:
      free = t[mode, "free"][1]
      print(f"| {n} | {mode} | " + " | ".join(f"{t[mode, name][1] / free:.2f}"
                                              for name in names) + " |")


if __name__ == "__main__":
  main()
