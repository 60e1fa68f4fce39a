"""Test-session setup, before JAX is imported: 8 host CPU devices for the multi-device tests,
quicker compilation, and one persistent XLA compilation cache for the session.

Most of the suite's time is XLA compiling small programs. The tests compile with LLVM's
optimisation level 0 (`--xla_backend_optimization_level=0`; XLA's own HLO passes, fusion
included, still run) and with XLA:CPU's elemental IR emitters for fused loops instead of its
MLIR fusion emitters (`--xla_cpu_use_fusion_emitters=false`, about half the compile time of a
loss and its gradient): every test passes with the same tolerances. Benchmarks and experiments
run with XLA's defaults. Either flag given in `XLA_FLAGS` is kept.

The cache (a fresh temporary folder, removed at the end) is shared by the pytest-xdist workers
and the processes the tests start (command lines, two-process runs, notebooks), which compile
the same programs again: it changes no result, only skips repeated compilations. A cache folder
given in `JAX_COMPILATION_CACHE_DIR` is used as is and kept.
"""

import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  _flags += " --xla_force_host_platform_device_count=8"
if "xla_backend_optimization_level" not in _flags:
  _flags += " --xla_backend_optimization_level=0"
if "xla_cpu_use_fusion_emitters" not in _flags:
  _flags += " --xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = _flags.strip()

# Set by the first process that imports this file (pytest's controller); the xdist workers and
# every subprocess inherit it.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _OWN_CACHE = tempfile.mkdtemp(prefix="tfcl_jax_xla_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_unconfigure(config):
  if _OWN_CACHE is not None:
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)
