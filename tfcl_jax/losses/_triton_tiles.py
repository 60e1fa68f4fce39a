r"""The Triton kernels' tiles and launch options, and how they see their inputs' rows.

`tiles` chooses the block of rows, whether `D` is held whole or walked in chunks, and the
launch options (`LAUNCH`, a table a measured sweep replaces:
`python -m benchmarks.device_bench --suite sweep`); `is_raw` and `inverse_norms` say whether a
side holds unit rows (float32) or raw rows (bfloat16 inputs) and give the latter's float32
inverse norms.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tfcl_jax.losses import _layout

SMALLEST_BLOCK = 16  # Triton's `dot` needs every side >= 16
# Per byte width of the inputs (bfloat16 raw rows, float32 unit rows): the widest padded D
# held whole (one product per tile, the gradient block in registers), and D's chunk beyond.
WHOLE_D = {2: 256, 4: 128}
CHUNK_D = {2: 128, 4: 64}
# The same for the gradient kernels that serve both sides of a tile (`_kernel_triton_pairs`),
# which hold a second product and its atomic add: they spill registers on sm_90 with D = 256
# held whole (bfloat16) or in chunks of 64 (float32).
PAIR_WHOLE_D = {2: 128, 4: 128}
PAIR_CHUNK_D = {2: 64, 4: 32}
# (byte width, widest padded D or None for any) -> (block, warps, stages), the first match.
# From compile reports for sm_90 (benchmarks/kernel_resources.py), not from timings: with
# 128-row blocks the gradient kernels spill registers at every D, 16 warps cap a thread at 128
# registers and spill, 3 stages fit in shared memory. A measured sweep replaces them.
LAUNCH = ((2, None, (64, 8, 3)), (4, None, (64, 8, 3)))


@dataclasses.dataclass(frozen=True)
class Tiles:
  """`block` rows per program and per step; `D` walked in chunks of `block_d` (one chunk: held
  whole); the launch's `num_warps` and `num_stages`."""

  block: int
  block_d: int
  num_warps: int = 4
  num_stages: int = 3
  pair_block_d: int | None = None  # the pair gradient kernels' chunk (None: `block_d`)

  def padded_dim(self, dim: int) -> int:
    return -(-dim // self.block_d) * self.block_d


def _next_power_of_two(n: int) -> int:
  return 1 << max(0, n - 1).bit_length()


def _floor_power_of_two(n: int) -> int:
  return 1 << (n.bit_length() - 1)


def _width(dtype) -> int:
  return min(jnp.dtype(dtype).itemsize, 4)


def launch(dim: int, dtype) -> tuple[int, int, int]:
  """`(block, warps, stages)` for a padded width `dim` and inputs of `dtype` (`LAUNCH`)."""
  for width, widest, options in LAUNCH:
    if width == _width(dtype) and (widest is None or dim <= widest):
      return options
  raise ValueError(f"no launch options for D = {dim} and dtype {jnp.dtype(dtype).name}.")


def tiles(num_rows: int, num_cols: int, dim: int, block_size: int | None,
          dtype=jnp.float32) -> Tiles:
  """The kernels' tiles, powers of two.

  `block_d`: `D` rounded up to a power of two (at least 16) when that is at most
  `WHOLE_D` for `dtype` (one product per tile), else `CHUNK_D`. `block`: `block_size` rounded
  down to a power of two, or `launch`'s choice; at most the padded number of rows, at
  least 16.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.losses import _triton_tiles
    >>> _triton_tiles.tiles(4096, 4096, 768, None)
    Tiles(block=64, block_d=64, num_warps=8, num_stages=3, pair_block_d=32)
    >>> _triton_tiles.tiles(4096, 4096, 200, None, jnp.bfloat16)
    Tiles(block=64, block_d=256, num_warps=8, num_stages=3, pair_block_d=64)
    >>> _triton_tiles.tiles(21, 21, 6, 16).block
    16
  """
  whole = max(SMALLEST_BLOCK, _next_power_of_two(dim))
  width = _width(dtype)
  block_d = whole if whole <= WHOLE_D[width] else CHUNK_D[width]
  default, warps, stages = launch(-(-dim // block_d) * block_d, dtype)
  block = default if block_size is None else _floor_power_of_two(block_size)
  block = min(block, _next_power_of_two(max(num_rows, num_cols)))
  pair_block_d = whole if whole <= PAIR_WHOLE_D[width] else PAIR_CHUNK_D[width]
  return Tiles(max(block, SMALLEST_BLOCK), block_d, warps, stages, min(pair_block_d, block_d))


def is_raw(vectors: jax.Array) -> bool:
  """Whether a side's vectors are raw rows (16-bit floats) rather than unit rows."""
  return jnp.dtype(vectors.dtype).itemsize < 4


def stats_dtype(vectors: jax.Array):
  """The dtype of the tile math and of the statistics: float32 at least."""
  return jnp.promote_types(vectors.dtype, jnp.float32)


def inverse_norms(vectors: jax.Array) -> jax.Array:
  """`r = 1 / max(||z||, floor)` in float32 for raw rows, pre-scaled by `_layout.raw_rows` (whose
  floor is `RAW_ROW_FLOOR`: `losses.l2_normalize`'s at every scale), ones for unit rows."""
  if not is_raw(vectors):
    return jnp.ones(vectors.shape[:1], stats_dtype(vectors))
  z = vectors.astype(jnp.float32)
  floor = _layout.RAW_ROW_FLOOR
  return jax.lax.rsqrt(jnp.maximum(jnp.sum(z * z, axis=1), floor * floor))
