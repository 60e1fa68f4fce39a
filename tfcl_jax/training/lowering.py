"""A jitted program lowered for another platform from any host, and what the lowering holds.

JAX lowers a program for the platform it is asked for, whatever the host has: a laptop can
check that a train step lowers for `cuda` or `tpu` (StableHLO, with any Pallas kernel as its
compiled custom call: Triton's on GPUs, Mosaic's on TPUs) before a job is queued. `inspect`
reports what would not run there: float64 values, host callbacks, CPU-only library calls.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import re
from typing import Any

import jax

#: The platforms `lower` lowers for.
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
#: The custom call of a Pallas kernel compiled by Triton, on GPUs (`implementation="pallas"`).
TRITON_KERNEL = "__gpu$xla.gpu.triton"
#: The custom call of a Pallas kernel compiled by Mosaic, on TPUs (`implementation="pallas"`).
MOSAIC_TPU_KERNEL = "tpu_custom_call"
#: Custom calls of JAX's own partitioning, valid on every platform.
SHARDING_CALLS = frozenset({"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"})
_CPU_ONLY = re.compile(r"lapack|ducc|cpu")
#: The GPU a Triton kernel is lowered for on a host without one (sm_90, the Hopper generation).
ABSTRACT_GPU = "NVIDIA H100"


@dataclasses.dataclass(frozen=True)
class LoweringReport:
  """What a lowered program holds.

  Attributes:
    platform: the platform it was lowered for.
    custom_calls: call target -> count.
    float64: how many float64 tensor types the program mentions.
    text: the StableHLO text.
  """

  platform: str
  custom_calls: dict[str, int]
  float64: int
  text: str = dataclasses.field(repr=False)

  @property
  def kernels(self) -> int:
    """Compiled Pallas kernels, Triton's on a GPU and Mosaic's on a TPU."""
    return self.custom_calls.get(TRITON_KERNEL, 0) + self.custom_calls.get(MOSAIC_TPU_KERNEL, 0)

  @property
  def host_callbacks(self) -> tuple[str, ...]:
    return tuple(sorted(name for name in self.custom_calls if "callback" in name))

  def problems(self) -> list[str]:
    """What would not run as intended on `platform`: float64 values (slow or absent on
    accelerators), host callbacks, custom calls of another platform or unknown ones."""
    found = []
    if self.float64:
      found.append(f"{self.float64} float64 tensor types")
    if self.host_callbacks:
      found.append(f"host callbacks {list(self.host_callbacks)}")
    allowed = set(SHARDING_CALLS)
    if self.platform in ("cuda", "rocm"):
      allowed.add(TRITON_KERNEL)
    if self.platform == "tpu":
      allowed.add(MOSAIC_TPU_KERNEL)
    others = sorted(name for name in self.custom_calls
                    if name not in allowed and name not in self.host_callbacks)
    if others:
      kind = "CPU-only" if all(_CPU_ONLY.search(name) for name in others) else "unexpected"
      found.append(f"{kind} custom calls {others}")
    return found


def lower(fn, *args: Any, platform: str, **kwargs: Any) -> jax.stages.Lowered:
  """`fn(*args, **kwargs)` lowered for `platform` (no device of that platform needed).

  `args` may be arrays or `jax.ShapeDtypeStruct` values (with shardings, for a sharded program).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses
    >>> from tfcl_jax.training import lowering
    >>> z = jax.ShapeDtypeStruct((4096, 256), jnp.bfloat16)
    >>> lowered = lowering.lower(jax.grad(losses.info_nce), z, z, platform="cuda")
    >>> report = lowering.inspect(lowered, platform="cuda")
    >>> report.problems(), report.kernels
    ([], 0)

  Args:
    fn: a function or a `jax.jit`-ed one (whose shardings and donations are kept).
    *args: its arguments.
    platform: one of `PLATFORMS`.
    **kwargs: its keyword arguments.
  """
  if platform not in PLATFORMS:
    raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}.")
  jitted = fn if hasattr(fn, "trace") else jax.jit(fn)
  with target_device(platform):
    return jitted.trace(*args, **kwargs).lower(lowering_platforms=(platform,))


def target_device(platform: str) -> contextlib.AbstractContextManager:
  """The device a Pallas kernel is lowered for, where the host has none of `platform`.

  Triton's lowering asks the GPU for its compute capability. On a host without a GPU, newer
  JAX releases need an abstract device to ask instead (`jax.sharding.AbstractDevice`, set by
  `jax.sharding.use_abstract_mesh`): `ABSTRACT_GPU`, sm_90. The mesh it sets has no axes, so a
  program's own shardings are unchanged. A no-op for other platforms, where a GPU is present,
  or where a mesh is already set.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses
    >>> from tfcl_jax.training import lowering
    >>> z = jax.ShapeDtypeStruct((512, 128), jnp.float32)
    >>> loss = jax.jit(lambda a, b: losses.info_nce(a, b, implementation="pallas"))
    >>> with lowering.target_device("cuda"):
    ...   text = loss.trace(z, z).lower(lowering_platforms=("cuda",)).as_text()
    >>> lowering.TRITON_KERNEL in text
    True
  """
  if platform not in ("cuda", "rocm") or any(d.platform == "gpu" for d in jax.devices()):
    return contextlib.nullcontext()
  abstract_device = getattr(jax.sharding, "AbstractDevice", None)
  if abstract_device is None or not jax.sharding.get_abstract_mesh().empty:
    return contextlib.nullcontext()  # older JAX lowers Triton for sm_90 without a GPU
  kind = ABSTRACT_GPU if platform == "cuda" else "gfx942"
  device = abstract_device(device_kind=kind, num_cores=None, platform="gpu")
  return jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=device))


def inspect(lowered: jax.stages.Lowered, *, platform: str) -> LoweringReport:
  """The custom calls and float64 types of a program lowered for `platform` by `lower`."""
  text = lowered.as_text()
  calls = collections.Counter(re.findall(r"custom_call @([\w$.]+)", text))
  float64 = len(re.findall(r"tensor<(?:[\d?]+x)*f64>", text))
  return LoweringReport(platform, dict(calls), float64, text)


@dataclasses.dataclass(frozen=True)
class MatrixProduct:
  """One `stablehlo.dot_general` of a lowered program.

  Attributes:
    operands: the element types of its two operands (`"bf16"`, `"f32"`, ...).
    result: the element type of its result: the accumulation's (`preferred_element_type`).
    shapes: the two operands' shapes.
    multiply_adds: multiply-adds of one execution: the result's elements times the contracted
      size.
    executions: how many times it runs: the product of the trip counts of the loops around it
      and of the calls that reach it (every branch of a conditional counted once).
  """

  operands: tuple[str, str]
  result: str
  shapes: tuple[tuple[int, ...], tuple[int, ...]]
  multiply_adds: int
  executions: int

  @property
  def total(self) -> int:
    """Multiply-adds over every execution."""
    return self.multiply_adds * self.executions


def _walk_products(op, functions: dict, executions: int, found: list) -> None:
  from jax.extend.mlir import ir  # noqa: PLC0415 - JAX's MLIR bindings, used here only

  for region in op.regions:
    for block in region.blocks:
      for inner in block.operations:
        inner = inner.operation
        if inner.name == "stablehlo.dot_general":
          lhs, rhs = (ir.RankedTensorType(value.type) for value in inner.operands)
          result = ir.RankedTensorType(inner.results[0].type)
          numbers = str(inner.attributes["dot_dimension_numbers"])
          contracting = re.search(r"lhs_contracting_dimensions = \[([\d, ]*)\]", numbers)
          dims = [int(d) for d in contracting.group(1).split(",") if d.strip()] if (
              contracting) else []
          size = 1
          for d in dims:
            size *= lhs.shape[d]
          count = size
          for d in result.shape:
            count *= d
          found.append(MatrixProduct((str(lhs.element_type), str(rhs.element_type)),
                                     str(result.element_type), (tuple(lhs.shape),
                                                                 tuple(rhs.shape)),
                                     count, executions))
        elif inner.name == "stablehlo.while":
          body = _OpRegions(inner.regions[1])
          _walk_products(body, functions, executions * _trip_count(inner), found)
        elif inner.name in ("func.call", "call"):
          callee = str(inner.attributes["callee"]).lstrip("@")
          _walk_products(functions[callee], functions, executions, found)
        else:
          _walk_products(inner, functions, executions, found)


@dataclasses.dataclass(frozen=True)
class _OpRegions:
  """A region seen as an operation holding it (`_walk_products` walks operations' regions)."""

  region: Any

  @property
  def regions(self):
    return [self.region]


def _trip_count(loop) -> int:
  """The trip count of a `stablehlo.while` whose condition compares a counter with a constant
  (`i < limit`, from a constant start): JAX's `scan` and `fori_loop` with static bounds."""
  from jax.extend.mlir import ir  # noqa: PLC0415

  for op in loop.regions[0].blocks[0].operations:
    op = op.operation
    if op.name != "stablehlo.compare" or "LT" not in str(op.attributes["comparison_direction"]):
      continue
    counter, limit = op.operands
    if not isinstance(counter.owner, ir.Block) or limit.owner.name != "stablehlo.constant":
      break
    start = loop.operands[ir.BlockArgument(counter).arg_number].owner
    if not hasattr(start, "name") or start.name != "stablehlo.constant":
      break
    value = lambda constant: int(ir.DenseIntElementsAttr(constant.attributes["value"])[0])  # noqa: E731
    return value(limit.owner) - value(start)
  raise ValueError("a while loop without a constant trip count (i < limit from a constant "
                   "start): its products cannot be counted.")


def matrix_products(lowered: jax.stages.Lowered) -> list[MatrixProduct]:
  """Every matrix product (`stablehlo.dot_general`) of a lowered program, with its operand and
  accumulation dtypes, its multiply-adds and how many times it runs (loops' trip counts).

  What a program lowered for an accelerator asks of its matrix units, read on any host: which
  products take 16-bit operands, and how much work the products are in all.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses
    >>> from tfcl_jax.training import lowering
    >>> z = jax.ShapeDtypeStruct((4096, 256), jnp.bfloat16)
    >>> lowered = lowering.lower(lambda a, b: losses.info_nce(a, b, block_size=1024), z, z,
    ...                          platform="cuda")
    >>> products = lowering.matrix_products(lowered)
    >>> {(p.operands, p.result) for p in products}
    {(('bf16', 'bf16'), 'f32')}
    >>> sum(p.total for p in products) == 4096 * 4096 * 256  # one forward product per tile
    True
  """
  module = lowered.compiler_ir("stablehlo")
  if module is None:
    raise ValueError("matrix_products: the lowered program has no StableHLO module.")
  with module.context:
    functions = {str(op.attributes["sym_name"]).strip('"'): op.operation
                 for op in module.body.operations if op.operation.name == "func.func"}
    found: list[MatrixProduct] = []
    _walk_products(functions["main"], functions, 1, found)
  return found
