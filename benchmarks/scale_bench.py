"""Scale benchmark: InfoNCE loss+grad time and peak memory, tiled vs one dense tile vs baselines.

Times are measured side by side in one process per (N, D, dtype) group, round robin, best of
`--reps`; peak memory (VmHWM, the process's peak RSS) in a fresh subprocess per method, so one
method's peak cannot hide another's. `tiled` is `info_nce` with `--block_size` (default: the
automatic choice); `dense` is the same engine with one tile holding all `[R, R]` logits.
Printed ratios: tiled / dense, tiled / floor (three dense `[R, D] x [D, R]`-sized products,
R = 2N rows), tiled / PyTorch eager NT-Xent (LightlySSL's math), temperature-free /
temperature-scaled.

  python -m benchmarks.scale_bench --quick
  python -m benchmarks.scale_bench --full
  python -m benchmarks.scale_bench --largest   # N = 2^17 pairs, D = 256, tiled only
  python -m benchmarks.scale_bench --largest --loss sigmoid   # the same for `sigmoid_loss`

PyTorch is optional (`pip install torch==2.13.0`); without it the torch column is empty.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import subprocess
import sys
import time

import numpy as np

MAPPINGS = {"tau": "tau=0.1", "free": "free", "learnable": "learnable=0.1",
            "dynamic": "dynamic=0.1:0.2"}
GRIDS = {
    "quick": dict(n=[1024, 4096], d=[128], dtype=["float32"], mapping=["tau", "free"]),
    "full": dict(n=[1024, 4096, 16384, 65536, 131072], d=[128, 256],
                 dtype=["float32", "bfloat16"], mapping=list(MAPPINGS)),
}
# Run the dense loss only where XLA's buffer plan for it fits this budget.
DENSE_BUDGET_BYTES = 8 * 2**30


def _peak_rss_bytes() -> int:
  with open("/proc/self/status") as status:
    for line in status:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) * 1024
  raise RuntimeError("no VmHWM in /proc/self/status")


def _views(n, d, dtype):
  import jax
  import jax.numpy as jnp
  k1, k2 = jax.random.split(jax.random.key(0))
  z1 = jax.random.normal(k1, (n, d), jnp.float32)
  z2 = z1 + 0.5 * jax.random.normal(k2, (n, d), jnp.float32)
  return z1.astype(dtype), z2.astype(dtype)


def _loss_fn(method, mapping_name, negatives, block_size, loss_name="info_nce"):
  from tfcl_jax import losses, mappings
  if method == "optax":
    import jax.numpy as jnp
    import optax
    tau = float(MAPPINGS[mapping_name].split("=")[1])

    def optax_loss(z1, z2):
      labels = jnp.tile(jnp.arange(z1.shape[0]), 2)
      return optax.losses.ntxent(jnp.concatenate([z1, z2]), labels, temperature=tau)

    return optax_loss
  mapping = mappings.from_spec(MAPPINGS[mapping_name])
  # A learnable mapping at its initial params, held (the gradient timed is the embeddings').
  mapping = mapping.bind(params=mapping.params)

  def loss(z1, z2):
    rows = z1.shape[0] * (2 if negatives == "all" else 1)
    size = block_size if method == "tiled" else rows
    if loss_name == "sigmoid":
      return losses.sigmoid_loss(z1, z2, mapping=mapping, negatives=negatives, block_size=size)
    return losses.info_nce(z1, z2, mapping=mapping, negatives=negatives, block_size=size)

  return loss


def build(method, *, n, d, dtype, mapping, negatives, block_size, loss="info_nce"):
  """`run()` doing one loss + gradient (or the floor's three products), blocking."""
  import jax
  import jax.numpy as jnp
  z1, z2 = _views(n, d, dtype)
  if method == "torch":
    from benchmarks import torch_ntxent
    tau = float(MAPPINGS[mapping].split("=")[1])
    return torch_ntxent.loss_and_grad_fn(np.asarray(z1, np.float32), np.asarray(z2, np.float32),
                                         temperature=tau)
  if method == "floor":
    rows = 2 * n if negatives == "all" else n
    u = jax.random.normal(jax.random.key(1), (rows, d), jnp.float32)
    weights = jax.random.uniform(jax.random.key(2), (rows, rows), jnp.float32)
    products = jax.jit(lambda u, w: (u @ u.T, w @ u, w.T @ u))
    return lambda: jax.block_until_ready(products(u, weights))
  grad = jax.jit(jax.value_and_grad(_loss_fn(method, mapping, negatives, block_size, loss),
                                     (0, 1)))
  return lambda: jax.block_until_ready(grad(z1, z2))


def _plain_dense_loss(negatives):
  """NT-Xent / InfoNCE from full logits in plain jnp: what a dense implementation holds."""
  import jax
  import jax.numpy as jnp

  def loss(z1, z2):
    u1 = z1 / jnp.linalg.norm(z1, axis=1, keepdims=True)
    u2 = z2 / jnp.linalg.norm(z2, axis=1, keepdims=True)
    if negatives == "cross":
      logits = u1 @ u2.T / 0.1
      return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.diag(logits))
    u = jnp.concatenate([u1, u2])
    logits = jnp.where(jnp.eye(u.shape[0], dtype=bool), -jnp.inf, u @ u.T / 0.1)
    n = z1.shape[0]
    positive = logits[jnp.arange(2 * n), (jnp.arange(2 * n) + n) % (2 * n)]
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - positive)

  return loss


def dense_bytes(*, n, d, dtype, negatives, mapping="tau") -> int:
  """XLA's buffer plan (temporaries + arguments + outputs) for a plain dense loss+grad
  (`_plain_dense_loss`), compiled but not run: what dense would need."""
  import jax
  import jax.numpy as jnp
  del mapping  # the plan is the same for every elementwise mapping
  shape = jax.ShapeDtypeStruct((n, d), jnp.dtype(dtype))
  grad = jax.jit(jax.value_and_grad(_plain_dense_loss(negatives), (0, 1)))
  stats = grad.lower(shape, shape).compile().memory_analysis()
  return int(stats.temp_size_in_bytes + stats.argument_size_in_bytes
             + stats.output_size_in_bytes)


def time_group(entries, *, reps, **config):
  """Best-of-`reps` wall and CPU seconds per (method, mapping), round robin in this process.

  CPU seconds (all threads of this process) measure the work done; on a shared machine
  they are much less noisy than wall time, which counts the time other processes ran.
  """
  runs = {}
  for method, mapping in entries:
    run = build(method, mapping=mapping, **config)
    run()  # compile and warm up
    runs[method, mapping] = run
  wall = dict.fromkeys(runs, float("inf"))
  cpu = dict.fromkeys(runs, float("inf"))
  for _ in range(reps):
    for key, run in runs.items():
      start, start_cpu = time.perf_counter(), time.process_time()
      run()
      wall[key] = min(wall[key], time.perf_counter() - start)
      cpu[key] = min(cpu[key], time.process_time() - start_cpu)
  return wall, cpu


def measure_memory(method, mapping, **config) -> dict:
  """Runs one (method, mapping) in a fresh process: peak RSS and the time of one call."""
  job = dict(method=method, mapping=mapping, **config)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-m", "benchmarks.scale_bench", "--worker",
                        json.dumps(job)], capture_output=True, text=True, env=env)
  if out.returncode != 0:
    return {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
  return json.loads(out.stdout.strip().splitlines()[-1])


def _worker(job: dict) -> dict:
  method, mapping = job.pop("method"), job.pop("mapping")
  before = _peak_rss_bytes()
  run = build(method, mapping=mapping, **job)
  start, start_cpu = time.perf_counter(), time.process_time()
  run()
  first, first_cpu = time.perf_counter() - start, time.process_time() - start_cpu
  seconds, cpu = first, first_cpu  # a long first call: compile time is noise, run it once
  if first < 60:
    start, start_cpu = time.perf_counter(), time.process_time()
    run()
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
  return {"baseline_rss": before, "peak_rss": _peak_rss_bytes(), "first_call_s": first,
          "seconds": seconds, "cpu_seconds": cpu}


def _entries(n, d, dtype, mapping_names, negatives, has_torch, dense_fits, methods):
  entries = _all_entries(n, d, dtype, mapping_names, negatives, has_torch, dense_fits)
  return [entry for entry in entries if methods is None or entry[0] in methods]


def _all_entries(n, d, dtype, mapping_names, negatives, has_torch, dense_fits):
  entries = [("tiled", m) for m in mapping_names] + [("floor", "-")]
  if dense_fits:
    entries += [("dense", m) for m in mapping_names]
    if negatives == "all" and "tau" in mapping_names and n * n * d * 16 <= DENSE_BUDGET_BYTES:
      entries.append(("optax", "tau"))  # ntxent holds a [2N, 2N, D] tensor
  if has_torch and dense_fits and negatives == "all" and "tau" in mapping_names:
    entries.append(("torch", "tau"))
  return entries


def _gib(value):
  return "" if value is None or not np.isfinite(value) else f"{value:.2f}"


def _ratio(a, b):
  return f"{a / b:.2f}" if a and b and np.isfinite(a) and np.isfinite(b) else ""


def run_grid(grid, *, negatives, block_size, reps, memory, workdir, methods=None):
  from benchmarks import torch_ntxent
  has_torch = torch_ntxent.available()
  rows = []
  for n, d, dtype in itertools.product(grid["n"], grid["d"], grid["dtype"]):
    config = dict(n=n, d=d, dtype=dtype, negatives=negatives, block_size=block_size)
    need = dense_bytes(n=n, d=d, dtype=dtype, negatives=negatives)
    entries = _entries(n, d, dtype, grid["mapping"], negatives, has_torch,
                       need <= DENSE_BUDGET_BYTES, methods)
    wall, cpu = time_group(entries, reps=reps, **config)
    for method, mapping in entries:
      row = dict(n=n, d=d, dtype=dtype, negatives=negatives, block_size=block_size,
                 method=method, mapping=mapping, seconds=wall[method, mapping],
                 cpu_seconds=cpu[method, mapping], dense_need_gib=need / 2**30)
      if memory:
        stats = measure_memory(method, mapping, **config)
        row["peak_rss_gib"] = stats.get("peak_rss", float("nan")) / 2**30
      rows.append(row)
      print(json.dumps(row), flush=True)
  _report(rows, grid["mapping"], workdir)
  return rows


def _report(rows, mapping_names, workdir):
  tables = [_table(rows, mapping_names, clock) for clock in ("cpu_seconds", "seconds")]
  text = "\n\n".join(tables)
  print(text)
  if workdir:
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "results.md"), "w") as out:
      out.write(text + "\n")
    with open(os.path.join(workdir, "results.csv"), "w", newline="") as out:
      fields = sorted({key for row in rows for key in row})
      writer = csv.DictWriter(out, fieldnames=fields)
      writer.writeheader()
      writer.writerows(rows)


def _table(rows, mapping_names, clock):
  by_key = {(r["n"], r["d"], r["dtype"], r["method"], r["mapping"]): r[clock] for r in rows}
  peak = {(r["n"], r["d"], r["dtype"], r["method"], r["mapping"]): r.get("peak_rss_gib")
          for r in rows}
  title = "CPU seconds (all threads)" if clock == "cpu_seconds" else "wall seconds"
  lines = [f"Loss + gradient, best of the repetitions, {title}; ratios are ours / baseline.", "",
           "| N | D | dtype | mapping | tiled s | dense s | tiled/dense | "
           "tiled/floor | tiled/torch | tiled/optax | free/tau (tiled) | "
           "dense would need GiB | tiled peak RSS GiB | dense peak RSS GiB |",
           "|" + "---|" * 14]
  for n, d, dtype in sorted({(r["n"], r["d"], r["dtype"]) for r in rows}):
    need = next(r["dense_need_gib"] for r in rows if (r["n"], r["d"], r["dtype"]) == (n, d, dtype))
    for mapping in mapping_names:
      ours = by_key.get((n, d, dtype, "tiled", mapping))
      dense = by_key.get((n, d, dtype, "dense", mapping))
      floor = by_key.get((n, d, dtype, "floor", "-"))
      torch = by_key.get((n, d, dtype, "torch", "tau")) if mapping == "tau" else None
      optax = by_key.get((n, d, dtype, "optax", "tau")) if mapping == "tau" else None
      free_over_tau = "" if mapping != "free" else _ratio(
          by_key.get((n, d, dtype, "tiled", "free")),
          by_key.get((n, d, dtype, "tiled", "tau")))
      lines.append(
          f"| {n} | {d} | {dtype} | {mapping} | {ours:.3f} | "
          f"{'' if dense is None else f'{dense:.3f}'} | {_ratio(ours, dense)} | "
          f"{_ratio(ours, floor)} | {_ratio(ours, torch)} | {_ratio(ours, optax)} | "
          f"{free_over_tau} | {need:.1f} | {_gib(peak.get((n, d, dtype, 'tiled', mapping)))} | "
          f"{_gib(peak.get((n, d, dtype, 'dense', mapping)))} |")
  return "\n".join(lines)


def largest(*, n, d, negatives, block_size, loss="info_nce"):
  config = dict(n=n, d=d, dtype="float32", negatives=negatives, block_size=block_size, loss=loss)
  need = dense_bytes(n=n, d=d, dtype="float32", negatives=negatives, mapping="free")
  print(f"{loss}, tiled; for scale, a plain dense InfoNCE loss+grad (the same [2N, 2N] "
        f"logits as a dense sigmoid loss) at N={n}, D={d}, negatives={negatives}: XLA plans "
        f"{need / 2**30:.1f} GiB", flush=True)
  stats = measure_memory("tiled", "free", **config)
  print(json.dumps(dict(config, mapping="free", **stats)), flush=True)
  if "peak_rss" in stats:
    print(f"tiled loss+grad: peak RSS {stats['peak_rss'] / 2**30:.2f} GiB "
          f"(process before building: {stats['baseline_rss'] / 2**30:.2f} GiB), "
          f"{stats['seconds']:.0f} s wall, {stats['cpu_seconds']:.0f} CPU s per call "
          f"({stats['first_call_s']:.0f} s wall with compile); "
          f"dense would need {need / 2**30:.0f} GiB ({need / stats['peak_rss']:.0f}x)")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--quick", action="store_true", help="N in {1k, 4k}, D 128, f32, tau/free")
  mode.add_argument("--full", action="store_true", help="the whole grid (hours on 2 cores)")
  mode.add_argument("--largest", action="store_true", help="N = 2^17, D = 256, tiled")
  mode.add_argument("--worker", help=argparse.SUPPRESS)
  parser.add_argument("--negatives", default="all", choices=["cross", "all"])
  parser.add_argument("--block_size", type=int, default=None,
                      help="tile side of the tiled loss (default: automatic)")
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--no_memory", action="store_true", help="skip the per-method RSS runs")
  parser.add_argument("--methods", default=None,
                      help="comma-separated subset of tiled,dense,floor,optax,torch")
  parser.add_argument("--workdir", default=None, help="write results.csv / results.md here")
  parser.add_argument("--n", type=int, default=2**17, help="pairs for --largest")
  parser.add_argument("--d", type=int, default=256, help="dimension for --largest")
  parser.add_argument("--loss", default="info_nce", choices=["info_nce", "sigmoid"],
                      help="the loss of --largest: info_nce or sigmoid_loss (free mapping, b = 0)")
  args = parser.parse_args(argv)
  if args.loss != "info_nce" and not args.largest:
    parser.error("--loss applies to --largest only")
  if args.worker:
    print(json.dumps(_worker(json.loads(args.worker))))
    return
  if args.largest:
    largest(n=args.n, d=args.d, negatives=args.negatives, block_size=args.block_size,
            loss=args.loss)
    return
  grid = GRIDS["full" if args.full else "quick"]
  run_grid(grid, negatives=args.negatives, block_size=args.block_size, reps=args.reps,
           memory=not args.no_memory, workdir=args.workdir,
           methods=None if args.methods is None else set(args.methods.split(",")))


if __name__ == "__main__":
  main()
