"""How big a tile: the automatic tile side per backend, and tiles balanced over the rows.

The engine (`_engine`) folds `[block, block]` tiles; this module chooses `block` when a loss
is called with `block_size=None`, for the platform the program is lowered for.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax

# Automatic tile side per backend, rows `(largest matrix side or None for any, tile)`, the
# first that covers the matrix; a matrix within its tile is one tile. Measured on CPU; on GPU,
# the H200 tile sweep at a matrix side of 32,768 (docs/platforms.md: tiles of 8,192 took 10.1 ms
# against 12.0 for 4,096, each step of the tile loop costing a fixed 50-115 us there), below
# 2^14 the cost argument of docs/losses.md; on TPU the cost argument
# (`benchmarks.device_bench --suite sweep` prints measured rows of this form).
_BLOCKS = {"cpu": ((None, 512),), "gpu": ((2 ** 14 - 1, 4096), (None, 8192)),
           "tpu": ((None, 4096),)}
# Tiles per step of the tile loops (`jax.lax.scan`'s unroll), rows `(largest tile side or None for
# any, unroll)`, the first that covers the tile: more tiles per step trade the step's fixed cost
# for a longer program. 1 everywhere until a device sweep measures otherwise
# (`benchmarks.device_bench --suite sweep`).
_UNROLL = ((None, 1),)
# Whether the diagonal tiles of a symmetric matrix (InfoNCE's `negatives="all"`) take a scan of
# their own, per backend. Apart, a diagonal tile's gradient is one product (3 per diagonal tile
# where the others take 4): on GPU and TPU, where the products are the cost. On CPU one scan over
# the tiles on and above the diagonal: the second scan measured slower there (NT-Xent's loss and
# gradient 1.03-1.12x as long, float32 and bfloat16, N = 1,024-8,192 pairs, D = 128, 2 cores;
# `benchmarks/results/diagonal_sweep_cpu.md`). `benchmarks.device_bench --suite sweep` times both.
_DIAGONAL_APART = {"cpu": False, "gpu": True, "tpu": True}
# The platforms a program can be lowered for, and the backend whose default each takes.
_PLATFORMS = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}


def balanced_tile(block_size: int, n: int) -> int:
  """The tile side for `n` rows: as many tiles as `block_size` needs, sized evenly.

  `ceil(n / ceil(n / block_size))` is at most `block_size` (memory stays bounded by it) and
  pads fewer than one row per tile, where `block_size` itself could pad almost a whole tile.

  Examples:
    >>> from tfcl_jax.losses import balanced_tile
    >>> balanced_tile(1024, 6654), balanced_tile(1024, 4096)
    (951, 1024)
  """
  return -(-n // -(-n // block_size))


def auto_block_size(num_rows: int, num_cols: int, backend: str | None = None) -> int:
  """The tile side the losses use when `block_size` is None, on `backend`.

  On CPU, tiles of 512 (one tile up to 512 rows): measured fastest from 1,024 to 16,384 rows
  (`python -m benchmarks.loss_bench`); a `[512, 512]` float32 tile (1 MiB) stays in cache.
  On GPU and TPU, one tile up to 4,096 rows, else tiles of 4,096: a `[4096, 4096]` float32
  tile is 64 MiB, and each step of the tile loop does enough work (8.6 GFLOP per product at
  D = 256) to hide most of the step's fixed cost (kernel launches on GPU); docs/losses.md gives
  the argument. On GPU, matrices with a side of 2^14 or more take tiles of 8,192 (256 MiB in
  float32): the H200 tile sweep measured them faster there (docs/platforms.md). The losses take
  the backend the program is lowered for (`by_platform`), so a program lowered for `cuda` on a
  CPU host gets the GPU's tiles.

  Examples:
    >>> from tfcl_jax.losses import auto_block_size
    >>> auto_block_size(8192, 8192, "cpu"), auto_block_size(300, 300, "cpu")
    (512, 300)
    >>> auto_block_size(8192, 8192, "gpu"), auto_block_size(3000, 3000, "tpu")
    (4096, 3000)
    >>> auto_block_size(32768, 32768, "gpu"), auto_block_size(32768, 32768, "tpu")
    (8192, 4096)

  Args:
    num_rows: rows of the similarity matrix.
    num_cols: its columns.
    backend: `"cpu"`, `"gpu"` (or `"cuda"`, `"rocm"`), `"tpu"`; None: `jax.default_backend()`.
  """
  backend = jax.default_backend() if backend is None else backend
  table = _BLOCKS.get(_PLATFORMS.get(backend, backend), _BLOCKS["gpu"])
  largest = max(num_rows, num_cols)
  block = next(tile for side, tile in table if side is None or largest <= side)
  return largest if largest <= block else block


def scan_unroll(block_rows: int, block_cols: int) -> int:
  """Tiles per step of the tile loops for tiles of `block_rows x block_cols` (`_UNROLL`).

  Examples:
    >>> from tfcl_jax.losses._engine._blocks import scan_unroll
    >>> scan_unroll(4096, 4096)
    1
  """
  largest = max(block_rows, block_cols)
  return next(unroll for side, unroll in _UNROLL if side is None or largest <= side)


class Tiling(NamedTuple):
  """How the engine tiles one matrix: the largest tile side, and (a symmetric matrix only)
  whether its diagonal tiles take a scan of their own (`_DIAGONAL_APART`)."""

  block: int
  diagonal_apart: bool = True


def by_platform(num_rows: int, num_cols: int, fn, *args, block_size: int | None = None,
                symmetric: bool = False):
  """`fn(tiling, *args)` with the `Tiling` of the platform the program is lowered for
  (`jax.lax.platform_dependent`): the automatic tile side unless `block_size` is given, and for
  a `symmetric` matrix where its diagonal tiles go. One branch per distinct choice, resolved at
  lowering, so the compiled program holds only its platform's."""
  choices = {}
  for platform, backend in _PLATFORMS.items():
    block = auto_block_size(num_rows, num_cols, backend) if block_size is None else block_size
    # One tile a side is one diagonal tile: apart it takes 3 products and no second scan.
    apart = not symmetric or _DIAGONAL_APART[backend] or num_rows <= block
    choices[platform] = Tiling(block, apart)
  if len(set(choices.values())) == 1:
    return fn(choices["cpu"], *args)
  branches = {tiling: functools.partial(fn, tiling) for tiling in set(choices.values())}
  return jax.lax.platform_dependent(
      *args, **{platform: branches[tiling] for platform, tiling in choices.items()})
