"""Test-session setup, before JAX is imported: 8 host CPU devices for the multi-device tests,
quicker compilation, and one persistent XLA compilation cache for the session.

Most of the suite's time is XLA compiling small programs. The tests compile with LLVM's
optimisation level 0 (`--xla_backend_optimization_level=0`; XLA's own HLO passes, fusion
included, still run) and with XLA:CPU's elemental IR emitters for fused loops instead of its
MLIR fusion emitters (`--xla_cpu_use_fusion_emitters=false`, about half the compile time of a
loss and its gradient): every test passes with the same tolerances. Each is set only where the
installed XLA knows it (newer jaxlib releases no longer have the second). Benchmarks and
experiments run with XLA's defaults. Either flag given in `XLA_FLAGS` is kept.

The cache (a fresh temporary folder, removed at the end) is shared by the pytest-xdist workers
and the processes the tests start (command lines, two-process runs, notebooks), which compile
the same programs again: it changes no result, only skips repeated compilations. A cache folder
given in `JAX_COMPILATION_CACHE_DIR` is used as is and kept.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

# Compile-time flags of the tests, each kept only where the installed XLA knows it (XLA aborts
# the process at its first computation on a flag it does not know, e.g. jaxlib >= 0.11 on
# --xla_cpu_use_fusion_emitters).
_QUICK_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def _xla_knows(flags: str) -> bool:
  """Whether a fresh process with these XLA_FLAGS starts JAX's CPU backend."""
  env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
  probe = [sys.executable, "-c", "import jax; jax.devices()"]
  return subprocess.run(probe, env=env, capture_output=True, timeout=120).returncode == 0


os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  _flags += " --xla_force_host_platform_device_count=8"
# Checked once, by pytest's controller: the xdist workers and subprocesses inherit the result.
_wanted = []
if not os.environ.get("TFCL_JAX_TEST_FLAGS_CHECKED"):
  _wanted = [flag for flag in _QUICK_COMPILE if flag.split("=")[0] not in _flags]
  if _wanted and not _xla_knows(" ".join(_wanted)):
    _wanted = [flag for flag in _wanted if _xla_knows(flag)]
  os.environ["TFCL_JAX_TEST_FLAGS_CHECKED"] = "1"
_flags = " ".join([_flags.strip(), *_wanted]).strip()
os.environ["XLA_FLAGS"] = _flags

# Set by the first process that imports this file (pytest's controller); the xdist workers and
# every subprocess inherit it.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _OWN_CACHE = tempfile.mkdtemp(prefix="tfcl_jax_xla_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_sessionfinish(session):
  """In a pytest-xdist worker, the end-of-session work done before the worker reports finished.

  Once every worker has reported, the controller ends their gateways, and execnet gives a worker
  5 s to return before it interrupts it with SIGINT; the KeyboardInterrupt then lands wherever
  the worker is, typically in JAX's garbage-collection callback (`jax._src.lib._xla_gc_callback`,
  called by the collections that pytest and the process's teardown make), and pytest reports it
  as an unraisable exception. What takes a worker that long after its last test: freeing the
  compiled programs of several hundred tests at those collections, and the hypothesis plugin's
  terminal summary, which imports `hypothesis` (rewriting its asserts) in a worker that ran no
  hypothesis test. Both are done here, before the worker reports (this hook runs inside xdist's
  wrapper, which reports after it), so that what follows the report is quick.
  """
  del session
  if "PYTEST_XDIST_WORKER" not in os.environ:
    return
  import gc  # noqa: PLC0415

  import jax  # noqa: PLC0415

  jax.clear_caches()
  gc.collect()
  if importlib.util.find_spec("hypothesis") is not None:
    import hypothesis.internal.observability  # noqa: F401, PLC0415
  # What is left after the report (the interpreter's teardown freeing the devices' buffers) can
  # still outlast execnet's 5 s; its interrupt (`_thread.interrupt_main`, a simulated SIGINT)
  # does nothing where SIGINT is ignored, and a worker whose results are reported has nothing
  # left to interrupt. execnet then waits 10 s more before ending the process itself.
  import signal  # noqa: PLC0415

  try:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
  except ValueError:  # not the main thread: execnet's interrupt would not reach it either
    pass


def pytest_unconfigure(config):
  if _OWN_CACHE is not None:
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)
