r"""The Triton kernels' tiles and launch options, and how they see their inputs' rows.

`tiles` chooses, per kernel family, the block of rows, the step through `D` and the launch
options (`LAUNCH`, a table a measured sweep replaces: `python -m benchmarks.device_bench`),
how the kernels that could serve both sides of a tile send its column side (`COLUMN_SIDE`),
and how many programs split a row kernel's columns (`MIN_PROGRAMS`). Whether a side holds raw rows
(`_tiles.is_raw`) and their inverse norms (`_layout.inverse_norms`) come from the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp

SMALLEST_BLOCK = 16  # Triton's `dot` needs every side >= 16
ROLES = ("forward", "backward", "pairs")
# How a tile's column side (`"all"`'s symmetric tiles, the two-tower loss's columns, the
# candidates' gradient) reaches its column block, forward and backward:
# * "separate": no tile serves both sides; the row kernel and a column kernel each form it
#   (twice the forward's products of `"all"`, a third more of the backward's), no atomics;
# * "partials": each tile once; a program writes its column shares to its own slots of a
#   scratch (`[nb / 2, N]` forward, `[nb / 2, N, D]` backward for `"all"`, `nb` slots for the
#   two-tower loss) that XLA sums; no atomics, memory `N^2 D / block` backward;
# * "atomic": each tile once; its column share added atomically, once per tile (per step of
#   `D` where `D` is walked): fenced, acquire-release atomics in the tile loop.
COLUMN_SIDES = ("separate", "partials", "atomic")
COLUMN_SIDE = {"forward": "partials", "backward": "separate"}
# A row kernel splits its column blocks between programs until it has this many (two per SM of
# an H100 or H200, 132 SMs) or one column block each; XLA adds the splits.
MIN_PROGRAMS = 264


@dataclasses.dataclass(frozen=True)
class Launch:
  """One kernel family's tile: `block` rows and columns per tile, `D` in steps of `block_d`
  (held whole when one step covers it), and its launch's `num_warps` and `num_stages`;
  `block_k`: where `D` is walked, the similarity products' narrower step through it (None:
  `block_d`), which keeps a gradient kernel's `dS V` products `block_d` wide."""

  block: int
  block_d: int
  num_warps: int
  num_stages: int
  block_k: int | None = None


# (family, byte width of the inputs) -> Launch, its `block_d` the widest step through `D`.
# Chosen from compile reports for sm_80 and sm_90 (`python -m benchmarks.kernel_resources`,
# N = 16384, D = 256). Timed on one H200 (`device_bench --suite quick`, N = 16384, D = 256,
# `benchmarks/results/quick_h200.md`): these column sides are the fastest of the three; 128-row
# gradient tiles with 8 warps were 7-16% faster than 64/4 but spill 200-760 bytes in the offline
# compile, and stay out of the table until `device_bench --suite sweep` times them across N:
# * "forward" (the logsumexps, no `D`-sized accumulator): tiled as a matrix product, 128 x 128
#   tiles, `D` in steps of 16, 8 warps: 64 x 128 per warpgroup MMA on sm_90, no spills (steps
#   of 32 spill up to 104 bytes on sm_80 with a mapping without a closed form);
# * "backward" (the row and column gradient kernels) and "pairs" (the gradient kernels whose
#   tiles serve both sides): 64-row tiles and one warpgroup, 64 x 64 per MMA for the tile and
#   for `dS V` in steps of 64 through `D`. With 8 warps a 64 x 64 tile is split into 64 x 32
#   MMAs; `D` = 256 held whole (a [64, 256] float32 gradient block) or in steps of 128 spills
#   hundreds of bytes. Float32's row and column gradient kernels take the tile's products
#   `S = U V^T` in steps of 32 through `D` (`block_k`): in steps of 64 they spilled 40-80 bytes
#   on sm_90, in steps of 32 none (on sm_80 with 4 warps 24-48 bytes: `LAUNCH_BEFORE_HOPPER`).
#   The pair kernels keep steps of 64 (in steps of 32 `"all"`'s spilled 32 bytes on sm_90
#   instead of none).
LAUNCH = {("forward", 2): Launch(128, 16, 8, 4), ("forward", 4): Launch(128, 16, 8, 3),
          ("backward", 2): Launch(64, 64, 4, 2), ("backward", 4): Launch(64, 64, 4, 1, 32),
          ("pairs", 2): Launch(64, 64, 4, 2), ("pairs", 4): Launch(64, 64, 4, 1)}
# Where a GPU before Hopper (compute capability < 9.0, no warpgroup MMAs to split) differs,
# from the same compile reports on sm_80 (N = 16384, D = 128, 256, 768): float32's row and
# column gradient kernels with 8 warps spill none (4 warps: 24-48 bytes at D = 256); its
# forwards with 2 stages none (3 stages: 88 bytes at D = 128 for a mapping without a closed
# form). bfloat16's gradient kernels with 8 warps: over free, τ = 0.07, `learnable_free=100`,
# `calibrated_free` and `dynamic=0.1:0.2`, every mode, D = 128, 256 and 768, 2 of 126 kernels
# spill, 8-16 bytes (with 4 warps 33 kernels, 8-200 bytes; 8 warps and 1 stage 7, 8-16 bytes).
LAUNCH_BEFORE_HOPPER = {("forward", 4): Launch(128, 16, 8, 2),
                        ("backward", 4): Launch(64, 64, 8, 1, 32),
                        ("backward", 2): Launch(64, 64, 8, 2), ("pairs", 2): Launch(64, 64, 8, 2)}
#: The compute capability the kernels are traced for without a GPU: Pallas's own assumption.
DEFAULT_CAPABILITY = 90
_capability_override: list[int] = []


def target_capability() -> int:
  """The compute capability the kernels are traced for: the first local GPU's, else
  `DEFAULT_CAPABILITY` (as Pallas lowers them), unless `for_capability` sets one."""
  if _capability_override:
    return _capability_override[-1]
  try:
    gpu = jax.local_devices(backend="gpu")[0]
  except RuntimeError:
    return DEFAULT_CAPABILITY
  try:
    return int(str(gpu.compute_capability).replace(".", ""))
  except (AttributeError, ValueError):  # a ROCm GPU: its own launch table is not measured
    return DEFAULT_CAPABILITY


@contextlib.contextmanager
def for_capability(capability: int):
  """The kernels traced for compute capability `capability` (`sm_80`: 80), whatever the host
  has: the launches of `launch` for that GPU (compile reports for several GPUs from one host)."""
  _capability_override.append(capability)
  try:
    yield
  finally:
    _capability_override.pop()


def launch(role: str, dtype) -> Launch:
  """The `LAUNCH` entry of kernel family `role` for inputs of `dtype` on the target GPU
  (`target_capability`).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.losses._kernels import _triton_tiles
    >>> with _triton_tiles.for_capability(80):
    ...   _triton_tiles.launch("backward", jnp.float32).num_warps
    8
    >>> with _triton_tiles.for_capability(90):
    ...   _triton_tiles.launch("backward", jnp.float32).num_warps
    4
  """
  key = (role, _width(dtype))
  if target_capability() < 90 and key in LAUNCH_BEFORE_HOPPER:
    return LAUNCH_BEFORE_HOPPER[key]
  return LAUNCH[key]


@dataclasses.dataclass(frozen=True)
class Tiles:
  """Each family's `Launch` (its `block_d` resolved for the padded `dim`), the column sides
  (forward, backward) and the row kernels' `min_programs`. `block`: the largest block, to
  which `N` is padded."""

  forward: Launch
  backward: Launch
  pairs: Launch
  dim: int
  columns: tuple[str, str] = ("partials", "separate")
  min_programs: int = MIN_PROGRAMS

  @property
  def block(self) -> int:
    return max(self.forward.block, self.backward.block, self.pairs.block)

  def padded_dim(self, dim: int) -> int:
    del dim  # resolved when the tiles were chosen
    return self.dim

  def blocks(self) -> set[int]:
    return {self.forward.block, self.backward.block, self.pairs.block}


def _next_power_of_two(n: int) -> int:
  return 1 << max(0, n - 1).bit_length()


def _floor_power_of_two(n: int) -> int:
  return 1 << (n.bit_length() - 1)


def _width(dtype) -> int:
  return min(jnp.dtype(dtype).itemsize, 4)


def splits(row_blocks: int, column_blocks: int, min_programs: int) -> int:
  """How many programs share a row block's column blocks: the fewest (a power of two dividing
  `column_blocks`) that make `row_blocks * splits >= min_programs`, else the most.

  Examples:
    >>> from tfcl_jax.losses._kernels import _triton_tiles
    >>> _triton_tiles.splits(64, 64, 264), _triton_tiles.splits(512, 512, 264)
    (8, 1)
  """
  count = 1
  while row_blocks * count < min_programs and column_blocks % (2 * count) == 0:
    count *= 2
  return count


def tiles(num_rows: int, num_cols: int, dim: int, block_size: int | None,
          dtype=jnp.float32) -> Tiles:
  """The kernels' tiles, powers of two, from `LAUNCH` (`launch`: for the target GPU) and
  `COLUMN_SIDE`.

  `D` is held whole (rounded up to a power of two, at least 16) by a family whose step is at
  least that, else walked in its steps; `D` is padded to whole steps of every family. A
  family's `block`: `block_size` rounded down to a power of two (the same for every family)
  or its own; at most the padded number of rows, at least 16.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.losses._kernels import _triton_tiles
    >>> t = _triton_tiles.tiles(4096, 4096, 768, None)
    >>> t.forward.block_d, t.backward, t.dim
    (16, Launch(block=64, block_d=64, num_warps=4, num_stages=1, block_k=32), 768)
    >>> _triton_tiles.tiles(4096, 4096, 200, None, jnp.bfloat16).backward
    Launch(block=64, block_d=64, num_warps=4, num_stages=2, block_k=None)
    >>> _triton_tiles.tiles(21, 21, 6, 16).block
    16
  """
  whole = max(SMALLEST_BLOCK, _next_power_of_two(dim))
  largest = _next_power_of_two(max(num_rows, num_cols))
  launches = []
  for role in ROLES:
    chosen = launch(role, dtype)
    block = chosen.block if block_size is None else _floor_power_of_two(block_size)
    block = max(SMALLEST_BLOCK, min(block, largest))
    launches.append(dataclasses.replace(chosen, block=block,
                                        block_d=min(whole, chosen.block_d)))
  step = max(chosen.block_d for chosen in launches)
  return Tiles(*launches, dim=-(-dim // step) * step,
               columns=(COLUMN_SIDE["forward"], COLUMN_SIDE["backward"]),
               min_programs=MIN_PROGRAMS)


