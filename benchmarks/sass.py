r"""What a compiled GPU kernel does, read from its SASS (`cuobjdump -sass`): its tensor-core
instructions, its fences and atomics, and which of them sit inside a loop.

* MMA: Hopper's warpgroup instructions (`HGMMA.64x128x16.F32.BF16`: 64 rows by 128 columns per
  instruction, 16 deep) and Ampere's warp instructions (`HMMA.16816.F32.BF16`), by shape;
* fences: `MEMBAR` wider than the block (`.GPU`, `.SYS`), `ERRBAR`/`CGAERRBAR` and `CCTL` (cache
  invalidation), what a global atomic with acquire-release semantics compiles to.
  `MEMBAR.ALL.CTA` is left out: every warpgroup MMA comes with one (`wgmma.fence`), in kernels
  without atomics too;
* atomics: global memory's `ATOM`/`ATOMG`/`RED` (shared memory's `ATOMS` stays in the block);
* loops: a backward branch (`BRA` to an earlier address) closes a loop over the addresses from
  its target to itself; an instruction's depth is the number of such loops around it (a
  branch to itself, the trap after `EXIT`, is no loop).
"""

from __future__ import annotations

import collections
import dataclasses
import re

_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)\s*"
                   r"([^;]*);")
_BRANCH = re.compile(r"^BRA(\.|$)")
_TARGET = re.compile(r"0x([0-9a-f]+)")
_FENCE = re.compile(r"^(MEMBAR\.(?!.*CTA)|ERRBAR|CGAERRBAR|CCTL)")
_ATOMIC = re.compile(r"^(ATOM|ATOMG|RED)(\.|$)")
_MMA = re.compile(r"^(HGMMA|HMMA|IMMA|QGMMA|DMMA)\.")
_WARPGROUP_SHAPE = re.compile(r"^HGMMA\.(\d+)x(\d+)x(\d+)")


@dataclasses.dataclass(frozen=True)
class Summary:
  """A kernel's tensor-core instructions and its fences and atomics, each with its loop depth."""

  mma: dict[str, int]  # opcode (shape and types) -> count
  fences: tuple[tuple[str, int], ...]  # (opcode, loop depth) each
  atomics: tuple[tuple[str, int], ...]
  loops: int

  def in_loops(self, kind: str, depth: int = 1) -> int:
    """How many `kind` ("fences" or "atomics") sit at loop depth `depth` or deeper."""
    return sum(d >= depth for _, d in getattr(self, kind))

  def deepest(self, kind: str) -> int:
    return max((d for _, d in getattr(self, kind)), default=0)

  def narrowest_warpgroup_mma(self) -> tuple[int, int] | None:
    """`(rows, columns)` of the narrowest `HGMMA` (fewest columns), or None without any."""
    shapes = [(int(m.group(1)), int(m.group(2))) for op in self.mma
              if (m := _WARPGROUP_SHAPE.match(op))]
    return min(shapes, key=lambda shape: shape[1]) if shapes else None


def parse(sass: str) -> Summary:
  """The `Summary` of one function's SASS text."""
  instructions = [(int(m.group(1), 16), m.group(2), m.group(3))
                  for m in map(_LINE.match, sass.splitlines()) if m]
  loops = []
  for address, opcode, operands in instructions:
    target = _TARGET.search(operands)
    if _BRANCH.match(opcode) and target and int(target.group(1), 16) < address:
      loops.append((int(target.group(1), 16), address))

  def depth(address: int) -> int:
    return sum(start <= address <= end for start, end in loops)

  mma = collections.Counter(op for _, op, _ in instructions if _MMA.match(op))
  fences = tuple((op, depth(a)) for a, op, _ in instructions if _FENCE.match(op))
  atomics = tuple((op, depth(a)) for a, op, _ in instructions if _ATOMIC.match(op))
  return Summary(dict(mma), fences, atomics, len(loops))


def describe_mma(summary: Summary) -> str:
  """`HGMMA.64x128x16.F32.BF16 ×8, ...`, widest first."""
  if not summary.mma:
    return "none"
  return ", ".join(f"{op} ×{count}" for op, count in sorted(summary.mma.items(),
                                                            key=lambda item: -item[1]))


def describe(summary: Summary, kind: str) -> str:
  """`"34 (34 in loops)"`: how many fences or atomics, and how many sit in a loop."""
  items = getattr(summary, kind)
  if not items:
    return "0"
  return f"{len(items)} ({summary.in_loops(kind)} in loops)"
