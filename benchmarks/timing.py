r"""Timing shared by the loss benchmarks: interleaved repeats, and the matrix-product floor.

A loss + gradient of InfoNCE needs three products of the similarity matrix's size (for
`negatives="all"`, `Z = [z1; z2]` of `[2N, D]`: `S = Z Z^T`, `S Z`, `S^T Z`: `12 N^2 D`
multiply-adds). The floor is the time of those three products, each timed alone (its own
jitted call, its operands already on the device) and taken at its minimum over many
interleaved repeats: a fused three-product program moves the `[2N, 2N]` matrix through memory
between products and its time varies with it, where single products at their minimum are
stable and are what any implementation is bounded by.

The similarity matrix is never held whole: the products run over a chunk of `c` rows of `A`
(`S_c = A_c B^T`, `S_c B`, `S_c^T A_c`, `c` chosen so that `S_c` takes at most
`chunk_bytes`), and the floor is their time times the number of chunks, `M / c`: the same
multiply-adds as the dense products, in memory that stays bounded at any `N` (the dense
`[2N, 2N]` matrix is 64 GiB at `N = 65536`).

The tiled engine computes a symmetric matrix's off-diagonal tiles once for their rows and
their columns: `8 N^2 D` multiply-adds for `"all"` (half of `S` forward; half of `S` again, and
the two products with it, backward). The ratio of a loss's time to `8 / 12` of the floor is
its distance from that limit.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

MODES = ("all", "cross", "two-tower")


def time_interleaved(fns: dict, repeats: int, few: dict | None = None, *,
                     min_seconds: float = 0.0, max_seconds: float | None = None) -> dict:
  """`fns`: name -> (function, args). Median and min seconds per call, interleaved rounds.

  Functions named in `few` (slow baselines) are timed only in their first `few[name]` rounds.
  Small sizes get more rounds, until a round's total reaches `min_seconds` over all rounds;
  large ones fewer (at least 2), when `repeats` rounds would take more than `max_seconds`.
  Every function is called once before timing (compilation, first-call costs).
  """
  few = few or {}
  warm = {}
  for name, (fn, args) in fns.items():  # warm-up: compile and run once, then time one call.
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    warm[name] = time.perf_counter() - start
  per_round = sum(t for name, t in warm.items() if name not in few)
  repeats = max(repeats, min(200, int(min_seconds / max(per_round, 1e-6))))
  if max_seconds is not None:
    repeats = min(repeats, max(2, int(max_seconds / max(per_round, 1e-6))))
  samples = {name: [] for name in fns}
  for round_ in range(repeats):
    for name, (fn, args) in fns.items():
      if round_ >= few.get(name, repeats):
        continue
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      samples[name].append(time.perf_counter() - start)
  return {name: (statistics.median(t), min(t)) for name, t in samples.items()}


@jax.jit
def _similarity(a, b):
  return a @ b.T


@jax.jit
def _product(s, z):
  return s @ z


@jax.jit
def _transposed_product(s, z):
  return s.T @ z


def chunk_rows(num_rows: int, num_cols: int, itemsize: int, chunk_bytes: int) -> int:
  """Rows of `A` per chunk: the most (a power of two, at least 1) whose `S_c` of
  `[c, num_cols]` fits `chunk_bytes`, at most `num_rows`."""
  rows = max(1, chunk_bytes // max(1, num_cols * itemsize))
  return min(num_rows, 1 << (rows.bit_length() - 1))


def floor_products(z1: jax.Array, z2: jax.Array, mode: str, *,
                   chunk_bytes: int = 2**31) -> tuple[dict, float]:
  """The three products of `mode`'s loss + gradient over one chunk of rows, as
  `time_interleaved` entries, and the number of chunks that make the whole matrix."""
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
  if mode == "all":
    a = b = jnp.concatenate([z1, z2])
  else:
    a, b = z1, z2
  rows = chunk_rows(a.shape[0], b.shape[0], jnp.dtype(a.dtype).itemsize, chunk_bytes)
  a_c = a[:rows]
  s = jax.block_until_ready(_similarity(a_c, b))
  products = {"S_c = A_c B^T": (_similarity, (a_c, b)), "S_c B": (_product, (s, b)),
              "S_c^T A_c": (_transposed_product, (s, a_c))}
  return products, a.shape[0] / rows


def multiply_adds(mode: str, n: int, d: int) -> tuple[int, int]:
  """`(floor, tiled)`: multiply-adds of the three dense products, and of the tiled engine
  (symmetric tiles once for `"all"`; both directions of the two-tower loss from one pass)."""
  if mode == "all":
    return 12 * n * n * d, 8 * n * n * d
  return 3 * n * n * d, 4 * n * n * d


def measure_floor(z1: jax.Array, z2: jax.Array, mode: str, *, repeats: int = 25,
                  min_seconds: float = 2.0, chunk_bytes: int = 2**31) -> float:
  """Seconds of the floor: the sum of the three products' minima over interleaved repeats,
  times the number of row chunks."""
  products, chunks = floor_products(z1, z2, mode, chunk_bytes=chunk_bytes)
  timings = time_interleaved(products, repeats, min_seconds=min_seconds)
  return chunks * sum(minimum for _, minimum in timings.values())
