r"""The quick GPU suite: which fused-kernel variant and launch to make the default, in under five
minutes on one GPU (`python -m benchmarks.device_bench --suite quick --out DIR`).

For NT-Xent (`negatives="all"`, the free mapping) and CLIP's loss (`tau = 0.07`), float32 and
bfloat16 inputs, `D = 256` (`--dim`):

1. each contender's loss + gradient against the dense loss in float64 at `N = 1000`
   (`--quick_check_n`): the tiled XLA path; the kernels with each column-side variant
   (`--quick_variants`: the default `_triton_tiles.COLUMN_SIDE`, and "separate", "partials",
   "atomic" forward and backward) at the table's launches; the default variant with each launch
   of the gradient kernels (`--quick_launches`, block/warps). A contender whose error exceeds
   `TOLERANCE` is not timed;
2. the same at `N = 16384` (`--quick_n`), timed interleaved, beside the floor (the loss's three
   products over row chunks, `benchmarks/timing.py`).

One table (errors, median ms, ratios to the floor and to tiled XLA) and the fastest correct
kernel per dtype (summed over both losses) as `_triton_tiles` rows ready to paste. What
`--budget_minutes` (4.5 when this suite runs alone) leaves no time for is skipped and said so.
"""

from __future__ import annotations

import functools
import time

import jax
import numpy as np

from benchmarks import device_tables as tables
from benchmarks import device_variants as dv
from benchmarks import timing
from tfcl_jax import mappings

LOSSES = {"ntxent": "free", "clip": "tau=0.07"}
FLOOR_MODE = {"ntxent": "all", "clip": "two-tower"}
COLUMNS = {"default": None, "separate": ("separate", "separate"),
           "partials": ("partials", "partials"), "atomic": ("atomic", "atomic")}
LAUNCHES = ("64/4", "64/8", "128/8")
# Worst relative error against float64 a contender may have and be timed (loss and gradients;
# bfloat16 inputs: the gradients' products take bfloat16 operands).
TOLERANCE = {"float32": 1e-3, "bfloat16": 3e-2}


def contenders(variants, launches) -> dict:
  """name -> kernel options (`dv.kernel_options`; None: the tiled XLA path)."""
  out: dict = {"tiled XLA": None}
  for name in variants:
    out[f"Pallas {name}"] = {"columns": COLUMNS[name]}
  for launch in launches:
    block, warps = (int(x) for x in launch.split("/"))
    out[f"Pallas default, {block}/{warps}"] = {"launch": (block, warps)}
  return out


def _loss_fn(loss: str, options):
  kw = dict(dv.LOSSES[loss]) if options is None else dict(dv.LOSSES[loss], implementation="pallas")
  return functools.partial(dv.call_info_nce, kw=kw)


def _errors(fn, options, mapping, z1, z2, expected) -> tuple[float, float]:
  """Worst relative errors of the loss and of both views' gradients against `expected`."""
  with dv.kernel_options(**(options or {})):
    value, grads = jax.device_get(jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))(
        z1, z2, mapping))
  return dv.relative(value, expected[0]), max(
      dv.relative(g, e) for g, e in zip(grads[:2], expected[1][:2], strict=True))


def _case(loss: str, dtype: str, args, report, runs_pallas) -> dict:
  """One loss and dtype: every contender checked, then timed, and the floor."""
  spec = LOSSES[loss]
  mapping = mappings.from_spec(spec)
  a, b, z1, z2 = dv.inputs(args.quick_check_n, args.dim, dtype)
  expected = dv.reference_loss(a, b, spec, loss)
  _, _, big1, big2 = dv.inputs(args.quick_n, args.dim, dtype)
  shape = jax.ShapeDtypeStruct(big1.shape, big1.dtype)
  checked, variants = {}, {}
  for name, options in contenders(args.quick_variants, args.quick_launches).items():
    if time.monotonic() > args.deadline:
      report.note(f"quick, {loss}, {dtype}, {name}: skipped, --budget_minutes spent")
      continue
    fn = _loss_fn(loss, options)
    errors, note = dv.guarded(lambda fn=fn, options=options: _errors(fn, options, mapping, z1,
                                                                    z2, expected))
    checked[name] = (errors, note)
    if errors is None or max(errors) > TOLERANCE[dtype]:
      variants[name] = dv.Variant(None, None, note or "not timed: error")
    elif options is not None and not runs_pallas:
      variants[name] = dv.Variant(None, None, "not timed: interpreted on CPU")
    else:
      variant, note = dv.guarded(lambda fn=fn, options=options: dv.build_jax(
          fn, options, shape, mapping, big1, big2, max_bytes=args.max_gib * 2**30))
      variants[name] = variant if variant is not None else dv.Variant(None, None, note)
  timed = dv.time_variants(variants, args.repeats, args.max_seconds)
  floor, floor_note = dv.guarded(lambda: timing.measure_floor(
      big1, big2, FLOOR_MODE[loss], repeats=args.floor_repeats, min_seconds=0.2,
      chunk_bytes=int(args.floor_chunk_gib * 2**30)))
  print(f"  quick, {loss}, {dtype}: done", flush=True)
  return {"loss": loss, "dtype": dtype, "checked": checked, "timed": timed, "floor": floor,
          "floor_note": floor_note}


def _winners(rows, variants, launches) -> list[str]:
  """Per dtype, the correct kernel contender fastest over both losses, as `_triton_tiles` rows."""
  options = contenders(variants, launches)
  lines = []
  for dtype in dict.fromkeys(row["dtype"] for row in rows):
    totals = {}
    for name in options:
      times = [row["timed"].get(name, (None,))[0] for row in rows if row["dtype"] == dtype]
      if name != "tiled XLA" and times and None not in times:
        totals[name] = float(np.sum(times))
    if not totals:
      lines.append(f"{dtype}: no kernel contender timed")
      continue
    best = min(totals, key=totals.__getitem__)
    chosen = options[best]
    columns = chosen.get("columns") or dv.default_columns()
    paste = [f"COLUMN_SIDE = {{'forward': {columns[0]!r}, 'backward': {columns[1]!r}}}"]
    if "launch" in chosen:
      paste += dv.launch_rows(dtype, chosen["launch"])
    lines.append(f"{dtype}: fastest {best} ({1e3 * totals[best]:.2f} ms over both losses): "
                 + "; ".join(f"`{line}`" for line in paste))
  return lines


def quick(args, report, runs_pallas: bool) -> list[dict]:
  """The suite: `_case` for each dtype and loss, one table, the winners."""
  rows = [_case(loss, dtype, args, report, runs_pallas) for dtype in args.dtypes
          for loss in LOSSES if time.monotonic() < args.deadline]
  table = []
  for row in rows:
    xla = row["timed"].get("tiled XLA", (None,))[0]
    table.append([row["dtype"], row["loss"], "floor (3 products)", "", "",
                  tables.ms(row["floor"]) + (f" {row['floor_note']}" if row["floor_note"] else ""),
                  "1.00" if row["floor"] else "-", tables.ratio(row["floor"], xla)])
    for name, (errors, note) in row["checked"].items():
      median = row["timed"].get(name, (None,))[0]
      table.append([row["dtype"], row["loss"], name,
                    *(("-", note) if errors is None else (f"{errors[0]:.1e}", f"{errors[1]:.1e}")),
                    tables.cell(row["timed"].get(name)), tables.ratio(median, row["floor"]),
                    tables.ratio(median, xla)])
  report.table(f"Quick suite: N = {args.quick_n}, D = {args.dim}, loss + gradient (errors "
               f"against float64 at N = {args.quick_check_n})",
               ["dtype", "loss", "contender", "loss error", "gradient error", "median ms (GiB)",
                "/ floor", "/ tiled XLA"], table)
  report.note("Winning rows (`tfcl_jax/losses/_kernels/_triton_tiles.py`):\n\n"
              + "\n".join(f"- {line}" for line in _winners(rows, args.quick_variants,
                                                           args.quick_launches)))
  return rows
