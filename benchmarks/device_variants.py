r"""The contenders of `benchmarks/device_bench.py`: each loss + gradient as a call to time.

* JAX (`jax_variants`): the tiled XLA engine (the default call, and `block_size` sweeps), the
  fused kernels (`implementation="pallas"`, and sweeps of their launch options), the dense
  textbook formulation; each compiled ahead of time with XLA's memory estimate;
* PyTorch (`torch_variants`): eager and `torch.compile`, NT-Xent (LightlySSL's formula,
  `benchmarks/torch_ntxent.py`) or CLIP's dense loss; peak memory from the allocator;
* Inf-CL (`inf_cl_variants`): `inf_cl.cal_flash_loss`, its single-GPU Triton kernel, one
  direction per call (CLIP's loss takes two), when the `inf_cl` package imports;
* `reference_loss`: the dense loss in float64 (`jax.enable_x64`), for the correctness table.

A contender that runs out of memory while compiling, warming up or timing is reported as
`OOM`, and the others go on (`guarded`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import timing, torch_ntxent
from tfcl_jax import losses, mappings
from tfcl_jax.losses._engine import _blocks  # the benchmark sets the engine's unroll table
from tfcl_jax.losses._kernels import _triton_tiles  # the benchmark sets the kernels' launch tables

# The loss of each benchmark: `info_nce`'s keywords.
LOSSES = {"ntxent": dict(negatives="all"), "clip": dict(negatives="cross", symmetric=True),
          "cross": dict(negatives="cross")}


class Variant(NamedTuple):
  """One contender: `run()` returns when the device is done; `memory` in bytes or None."""

  run: object
  memory: int | None
  note: str = ""


def inputs(n: int, d: int, dtype: str, seed: int = 0):
  """`(a, b, z1, z2)`: two correlated `[n, d]` views as `dtype` arrays (`z1`, `z2`) and their
  float32 copies, which hold exactly the values the device sees (bfloat16-rounded)."""
  rng = np.random.default_rng(seed + n + d)
  a = rng.normal(size=(n, d)).astype(np.float32)
  b = (a + 0.5 * rng.normal(size=(n, d))).astype(np.float32)
  z1, z2 = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
  return np.asarray(z1, np.float32), np.asarray(z2, np.float32), z1, z2


def relative(got, expected) -> float:
  """Worst relative error: max |error| / max |expected value|."""
  got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
  return float(np.max(np.abs(got - expected)) / max(np.max(np.abs(expected)), 1e-30))


def time_variants(variants: dict, repeats: int, max_seconds: float) -> dict:
  """name -> (median seconds or None, bytes or None, note) of `Variant`s, timed interleaved."""
  results = {name: (None, v.memory, v.note) for name, v in variants.items()}
  live = {name: (v.run, ()) for name, v in variants.items() if v.run is not None}
  if not live:
    return results
  timed, note = guarded(lambda: timing.time_interleaved(live, repeats, max_seconds=max_seconds))
  for name in live:
    median = None if note else timed[name][0]
    results[name] = (median, variants[name].memory, note or variants[name].note)
  return results


def is_oom(error: BaseException) -> bool:
  text = f"{type(error).__name__} {error}".lower()
  return any(word in text for word in ("resource_exhausted", "out of memory", "outofmemory",
                                       "oom"))


def guarded(build):
  """`build()`, or `(None, "OOM")` when it runs out of memory (any other error: its name)."""
  try:
    return build(), ""
  except Exception as error:  # noqa: BLE001 - one contender's failure must not stop the rest
    return None, "OOM" if is_oom(error) else f"failed: {type(error).__name__}"


def dense_info_nce(z1, z2, *, mapping, loss: str):
  """InfoNCE as it is usually written: every logit held, `logsumexp` over each row."""
  dtype = jnp.promote_types(z1.dtype, jnp.float32)
  z1, z2 = z1.astype(dtype), z2.astype(dtype)
  n = z1.shape[0]
  if loss == "ntxent":
    z = jnp.concatenate([z1, z2])
    z = z / jnp.linalg.norm(z, axis=1, keepdims=True)
    logits = mapping(z @ z.T)
    logits = jnp.where(jnp.eye(2 * n, dtype=bool), -jnp.inf, logits)
    positive = jnp.concatenate([jnp.arange(n, 2 * n), jnp.arange(n)])
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - logits[jnp.arange(2 * n), positive])
  u1 = z1 / jnp.linalg.norm(z1, axis=1, keepdims=True)
  u2 = z2 / jnp.linalg.norm(z2, axis=1, keepdims=True)
  logits = mapping(u1 @ u2.T)
  rows = jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.diagonal(logits))
  if loss == "cross":
    return rows
  return (rows + jnp.mean(jax.nn.logsumexp(logits, axis=0) - jnp.diagonal(logits))) / 2


def reference_loss(z1: np.ndarray, z2: np.ndarray, spec: str, loss: str):
  """`(loss, (dz1, dz2, dparams))` of the dense loss in float64 on the default device."""
  with jax.enable_x64(True):
    mapping = mappings.from_spec(spec)
    mapping = mapping.bind(params=jax.tree.map(lambda p: jnp.asarray(p, jnp.float64),
                                               mapping.params))

    def fn(a, b, m):
      return dense_info_nce(a, b, mapping=m, loss=loss)

    value, grads = jax.value_and_grad(fn, argnums=(0, 1, 2))(
        jnp.asarray(z1, jnp.float64), jnp.asarray(z2, jnp.float64), mapping)
    return np.asarray(value), jax.tree.map(np.asarray, grads)


GRADIENT_FAMILIES = ("backward", "pairs")  # the `_triton_tiles.LAUNCH` rows a launch sets


@contextlib.contextmanager
def kernel_options(*, columns=None, launch=None, unroll=None, diagonal_apart=None):
  """The fused kernels traced with `columns`, `(forward, backward)` of
  `_triton_tiles.COLUMN_SIDE`, and `launch`, `(block, warps)` or `(block, warps, stages)` of
  the gradient kernels for every dtype and GPU (`LAUNCH_BEFORE_HOPPER` too); the XLA engine's
  tile loops with `unroll` tiles a step (`_blocks._UNROLL`, every tile side) and, with
  `diagonal_apart`, a symmetric matrix's diagonal tiles in a scan of their own or not
  (`_blocks._DIAGONAL_APART`, every backend); None keeps the tables'."""
  saved_unroll = _blocks._UNROLL
  saved_apart = dict(_blocks._DIAGONAL_APART)
  if unroll is not None:
    _blocks._UNROLL = ((None, unroll),)
  if diagonal_apart is not None:
    _blocks._DIAGONAL_APART.update(dict.fromkeys(saved_apart, diagonal_apart))
  tables = (_triton_tiles.LAUNCH, _triton_tiles.LAUNCH_BEFORE_HOPPER)
  saved = [dict(table) for table in tables]
  saved_columns = dict(_triton_tiles.COLUMN_SIDE)
  if columns is not None:
    _triton_tiles.COLUMN_SIDE.update(forward=columns[0], backward=columns[1])
  if launch is not None:
    for table, before in zip(tables, saved, strict=True):
      for key, value in before.items():
        if key[0] in GRADIENT_FAMILIES:
          table[key] = dataclasses.replace(
              value, block=launch[0], num_warps=launch[1],
              num_stages=launch[2] if len(launch) > 2 else value.num_stages)
  try:
    yield
  finally:
    for table, before in zip(tables, saved, strict=True):
      table.clear()
      table.update(before)
    _triton_tiles.COLUMN_SIDE.update(saved_columns)
    _blocks._UNROLL = saved_unroll
    _blocks._DIAGONAL_APART.update(saved_apart)


def default_columns() -> tuple[str, str]:
  """`_triton_tiles.COLUMN_SIDE` as it is: `(forward, backward)`."""
  return _triton_tiles.COLUMN_SIDE["forward"], _triton_tiles.COLUMN_SIDE["backward"]


def launch_rows(dtype: str, launch) -> list[str]:
  """`_triton_tiles.LAUNCH` rows, as Python, with the gradient kernels' `launch` for `dtype`."""
  width = 2 if dtype == "bfloat16" else 4
  rows = []
  for family in GRADIENT_FAMILIES:
    row = _triton_tiles.launch(family, jnp.bfloat16 if width == 2 else jnp.float32)
    stages = launch[2] if len(launch) > 2 else row.num_stages
    step = "" if row.block_k is None else f", {row.block_k}"
    table = ("LAUNCH_BEFORE_HOPPER" if _triton_tiles.target_capability() < 90
             and (family, width) in _triton_tiles.LAUNCH_BEFORE_HOPPER else "LAUNCH")
    rows.append(f"{table}[{family!r}, {width}] = Launch({launch[0]}, {row.block_d}, {launch[1]}, "
                f"{stages}{step})")
  return rows


def compiled(loss_fn, shape, mapping):
  """`Variant` of the jitted loss + gradient (both views and the mapping) compiled for `shape`."""
  grad = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1, 2)))
  program = grad.lower(shape, shape, mapping).compile()
  memory = program.memory_analysis()
  size = None if memory is None else (memory.argument_size_in_bytes
                                      + memory.output_size_in_bytes + memory.temp_size_in_bytes)
  return program, size


def jax_variants(loss: str, *, pallas: bool, dense: bool, blocks=(), launches=(),
                 unrolls=(), diagonals=False) -> dict:
  """name -> `(loss_fn, kernel_options or None)` of the JAX contenders for `loss`; with
  `diagonals`, NT-Xent's default tiles with its diagonal tiles in a scan of their own and in
  the one scan (`_blocks._DIAGONAL_APART`)."""
  mapping_kw = LOSSES[loss]
  out = {"tiled XLA": (functools.partial(call_info_nce, kw=mapping_kw), None)}
  for block in blocks:
    out[f"tiled XLA, block {block}"] = (
        functools.partial(call_info_nce, kw=dict(mapping_kw, block_size=block)), None)
  for unroll in unrolls:  # the default tiles, `unroll` of them a step of the tile loops
    out[f"tiled XLA, unroll {unroll}"] = (functools.partial(call_info_nce, kw=mapping_kw),
                                          {"unroll": unroll})
  if diagonals and mapping_kw.get("negatives") == "all":
    for apart, name in ((True, "diagonal apart"), (False, "diagonal in one scan")):
      out[f"tiled XLA, {name}"] = (functools.partial(call_info_nce, kw=mapping_kw),
                                   {"diagonal_apart": apart})
  if pallas:
    out["Pallas"] = (functools.partial(call_info_nce, kw=dict(mapping_kw,
                                                          implementation="pallas")), None)
    for launch in launches:
      out["Pallas, " + ":".join(map(str, launch))] = (
          functools.partial(call_info_nce, kw=dict(mapping_kw, implementation="pallas")),
          {"launch": launch})
  if dense:
    out["dense XLA"] = (functools.partial(_dense, loss=loss), None)
  return out


def call_info_nce(a, b, m, *, kw):
  return losses.info_nce(a, b, mapping=m, **kw)


def _dense(a, b, m, *, loss):
  return dense_info_nce(a, b, mapping=m, loss=loss)


def build_jax(loss_fn, options, shape, mapping, z1, z2, *, max_bytes: float) -> Variant:
  """Compiles one JAX contender (the kernels with `kernel_options(**options)`); skipped (run
  None) when XLA's estimate exceeds `max_bytes`."""
  with kernel_options(**(options or {})):
    program, memory = compiled(loss_fn, shape, mapping)
  if memory is not None and memory > max_bytes:
    return Variant(None, memory, f"skipped: {memory / 2**30:.1f} GiB estimated")
  return Variant(lambda: program(z1, z2, mapping), memory)


def torch_variants(loss: str, a: np.ndarray, b: np.ndarray, *, spec: str, dtype: str,
                   compile_: bool) -> dict:
  """name -> builder of a `Variant` for PyTorch eager (and `torch.compile`)."""
  names = [("PyTorch eager", False)] + ([("torch.compile", True)] if compile_ else [])
  out = {}
  for name, compiled_ in names:
    if loss == "ntxent":
      def build(compiled_=compiled_):
        run, peak = torch_ntxent.device_loss_and_grad_fn(a, b, mapping=spec, dtype=dtype,
                                                        compile=compiled_)
        return _torch_variant(run, peak)
    else:
      def build(compiled_=compiled_):
        run, peak = torch_clip_fn(a, b, spec=spec, dtype=dtype, compile_=compiled_)
        return _torch_variant(run, peak)
    out[name] = build
  return out


def _torch_variant(run, peak) -> Variant:
  run()  # first call: compilation, allocation; an OOM shows here
  return Variant(run, peak())


def _torch_inputs(a, b, dtype):
  import torch  # noqa: PLC0415

  storage = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  device = "cuda" if torch.cuda.is_available() else "cpu"
  return [torch.tensor(np.asarray(x, np.float32), dtype=storage, device=device,
                       requires_grad=True) for x in (a, b)], device


def _tau(spec: str) -> float:
  if not spec.startswith("tau="):
    raise ValueError(f"the CLIP baselines take spec 'tau=<value>', got {spec!r}.")
  return float(spec[len("tau="):])


def torch_clip_fn(a: np.ndarray, b: np.ndarray, *, spec: str, dtype: str, compile_: bool):
  """`(run, peak)`: CLIP's dense symmetric loss + gradient in PyTorch (open_clip's
  `ClipLoss`: `[N, N]` logits, cross-entropy both ways), computed in float32."""
  import torch  # noqa: PLC0415
  import torch.nn.functional as F  # noqa: PLC0415

  (x1, x2), device = _torch_inputs(a, b, dtype)
  scale, labels = 1.0 / _tau(spec), torch.arange(a.shape[0], device=device)

  def forward(p, q):
    logits = scale * F.normalize(p.float(), dim=1) @ F.normalize(q.float(), dim=1).T
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2

  fn = torch.compile(forward) if compile_ else forward
  return torch_ntxent.runner(fn, x1, x2, device)


def inf_cl_available() -> bool:
  try:
    import inf_cl  # noqa: F401, PLC0415
  except Exception:  # noqa: BLE001 - absent, or present without a GPU to import on
    return False
  return True


def inf_cl_variants(a: np.ndarray, b: np.ndarray, *, spec: str, dtype: str) -> dict:
  """name -> builder: Inf-CL's `cal_flash_loss` one way (`z1 -> z2`), and both ways (two
  calls: CLIP's symmetric loss), on unit rows with `scale = 1 / tau`."""
  import torch  # noqa: PLC0415
  import torch.nn.functional as F  # noqa: PLC0415
  from inf_cl import cal_flash_loss  # noqa: PLC0415

  (x1, x2), device = _torch_inputs(a, b, dtype)
  scale, labels = 1.0 / _tau(spec), torch.arange(a.shape[0], device=device)

  def one_way(p, q):
    return cal_flash_loss(F.normalize(p.float(), dim=1), F.normalize(q.float(), dim=1),
                          labels, scale=scale).mean()

  def both_ways(p, q):
    return (one_way(p, q) + one_way(q, p)) / 2

  def builder(fn):
    def build():
      run, peak = torch_ntxent.runner(fn, x1, x2, device)
      return _torch_variant(run, peak)
    return build

  return {"Inf-CL one way": builder(one_way), "Inf-CL both ways": builder(both_ways)}
