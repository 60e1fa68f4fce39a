"""Sweeps against what machines do to them: kills mid-write, two sweeps on one workdir, a full
disk, and SIGKILL at random instants (`experiments.framework`: `sweep`, `workdir`, `tables`,
`cli`)."""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.experimental import checkify

from experiments.framework import plan, sweep, tables
from experiments.framework import workdir as workdirs
from tests.helpers.xla_flags import with_host_devices
from tfcl_jax import losses
from tfcl_jax.training import files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A sweep through the real command line whose training is instant: `fail_seed` injects ENOSPC
# into the write of that seed's result.json, `hold_seed` holds the workdir (sleeps) there.
SWEEP = textwrap.dedent("""
    import errno, os, sys, time
    from experiments.framework import cli, plan, sweep, tables

    def train_and_evaluate(config, workdir):
      runs = plan.plan(config)

      def train(run):
        if run.seed == config.hold_seed:
          open(os.path.join(workdir, "holding"), "w").close()
          time.sleep(600)
        if run.seed == config.fail_seed:
          def full(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
          os.fsync = full
        return {"spec": run.spec, "seed": run.seed, "value": 0.5 + run.seed}

      write = tables.writer(workdir, markdown=lambda rows: f"{len(rows)} rows")
      return sweep.sweep(config, workdir, runs=runs, train_run=train, write_tables=write,
                         plan_fields=("fail_seed", "hold_seed"))

    cli.run_main(train_and_evaluate, check_config=plan.plan, usage="u")
""")
CONFIG = textwrap.dedent("""
    import ml_collections

    def get_config():
      return ml_collections.ConfigDict(dict(losses="free", seeds=3, fail_seed=-1, hold_seed=-1))
""")


def _sweep(tmp_path, workdir, *overrides, wait=True):
  config = tmp_path / "config.py"
  config.write_text(CONFIG)
  proc = subprocess.Popen(
      [sys.executable, "-c", SWEEP, f"--config={config}", f"--workdir={workdir}",
       *overrides], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  if not wait:
    return proc
  out, err = proc.communicate(timeout=300)
  return proc.returncode, out, err


class Run:
  def __init__(self, name):
    self.name = name

  def directory(self, workdir):
    return os.path.join(workdir, "runs", self.name)


# -- 1. atomic results writes -----------------------------------------------------------------


def test_a_truncated_result_json_is_not_finished_and_the_run_is_redone(tmp_path, capsys):
  workdir, trained = str(tmp_path), []

  def train(run):
    trained.append(run.name)
    return {"name": run.name}

  sweep.run_all([Run("a"), Run("b")], train, workdir=workdir, progress=False)
  path = os.path.join(workdir, "runs", "a", sweep.RESULT_FILE)
  with open(path, "w") as f:
    f.write('{"name": "a", "val')  # what a kill mid-write of a plain open() leaves
  assert not sweep.finished(Run("a"), workdir)
  results = sweep.run_all([Run("a"), Run("b")], train, workdir=workdir, progress=False)
  assert trained == ["a", "b", "a"] and results == [{"name": "a"}, {"name": "b"}]
  notice = [line for line in capsys.readouterr().err.splitlines() if path in line]
  assert len(notice) == 1 and notice[0].startswith("note: ") and "redone" in notice[0]
  assert json.load(open(path)) == {"name": "a"}


def test_a_write_interrupted_mid_file_leaves_the_old_file(tmp_path, monkeypatch):
  rows = [{"spec": "free", "seed": 0, "value": 1.0}]
  tables.write_results(str(tmp_path), rows, markdown="# old")
  before = {name: (tmp_path / name).read_text() for name in ("results.csv", "results.md")}

  def torn(self, rows):  # half the file, then the kill
    self.writerow(rows[0])
    raise KeyboardInterrupt

  monkeypatch.setattr(csv.DictWriter, "writerows", torn)
  with pytest.raises(KeyboardInterrupt):
    tables.write_results(str(tmp_path), rows * 2, markdown="# new")
  assert {name: (tmp_path / name).read_text() for name in before} == before
  assert sorted(os.listdir(tmp_path)) == ["results.csv", "results.md"]  # no temporary left


def test_a_figure_is_replaced_only_once_drawn(tmp_path):
  write = tables.writer(str(tmp_path), markdown=lambda rows: "# t",
                        figures={"a.png": lambda file, rows: file.write(b"png")})
  write([{"x": 1}])
  assert (tmp_path / "a.png").read_text() == "png"

  def broken(file, rows):
    file.write(b"pn")
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    tables.writer(str(tmp_path), markdown=lambda rows: "# t", figures={"a.png": broken})(
        [{"x": 1}])
  assert (tmp_path / "a.png").read_text() == "png"
  assert sorted(os.listdir(tmp_path)) == ["a.png", "results.csv", "results.md"]


# -- 2. one sweep per workdir -----------------------------------------------------------------


def _lock(workdir):
  with open(os.path.join(workdir, workdirs.LOCK_FILE)) as f:
    return json.load(f)


def test_a_sweep_resumes_elsewhere_from_its_result_files_alone(tmp_path):
  # Moved to another machine: only two finished runs' result.json (no config.json, lock,
  # checkpoints or tables) copied into a fresh workdir. The same command reads those two as they
  # are (marked here by a value no training gives) and trains only the third.
  first, moved = tmp_path / "first", tmp_path / "moved"
  assert _sweep(tmp_path, first)[0] == 0
  for seed in (0, 1):
    result = json.loads((first / "runs" / "free" / f"seed{seed}" / "result.json").read_text())
    assert result["value"] == 0.5 + seed
    (moved / "runs" / "free" / f"seed{seed}").mkdir(parents=True)
    (moved / "runs" / "free" / f"seed{seed}" / "result.json").write_text(
        json.dumps({**result, "value": 100.0 + seed}))
  code, _, err = _sweep(tmp_path, moved)
  assert code == 0, err
  with open(moved / "results.csv") as f:
    values = {int(row["seed"]): float(row["value"]) for row in csv.DictReader(f)}
  assert values == {0: 100.0, 1: 101.0, 2: 2.5}


def test_a_second_sweep_on_a_live_workdir_is_refused_then_a_dead_holder_is_taken_over(tmp_path):
  workdir = tmp_path / "w"
  holder = _sweep(tmp_path, workdir, "--config.hold_seed=1", wait=False)
  try:
    deadline = time.monotonic() + 120
    while not (workdir / "holding").exists():
      assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()
      time.sleep(0.1)
    assert _lock(workdir)["pid"] == holder.pid
    code, _, err = _sweep(tmp_path, workdir)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: workdir '{workdir}' is in use by pid {holder.pid} on "
                          f"{socket.gethostname()}"), err
    with pytest.raises(plan.ConfigError, match=f"in use by pid {holder.pid}"):
      workdirs.acquire(str(workdir))  # in this process too
  finally:
    holder.kill()
    holder.wait()
  # The holder died without releasing: the next sweep takes the lock over and finishes.
  code, _, err = _sweep(tmp_path, workdir)
  assert code == 0, err
  assert f"note: taking over the lock of '{workdir}' from pid {holder.pid}" in err
  assert not (workdir / workdirs.LOCK_FILE).exists()  # released at the end
  assert len(tables.read_csv(str(workdir / "results.csv"))) == 3


def test_a_stale_lock_is_taken_over_and_every_way_out_releases_it(tmp_path, capsys):
  workdir = str(tmp_path)
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  with open(os.path.join(workdir, workdirs.LOCK_FILE), "w") as f:
    json.dump({"pid": int(dead.stdout), "host": socket.gethostname(), "started": "x"}, f)
  config = ml_collections.ConfigDict(dict(losses="free", seeds=2))
  runs = plan.plan(config)

  def train(run):
    assert _lock(workdir)["pid"] == os.getpid()
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    sweep.sweep(config, workdir, runs=runs, train_run=train, write_tables=lambda rows: None)
  err = capsys.readouterr().err
  assert f"note: taking over the lock of {workdir!r} from pid {int(dead.stdout)}" in err
  assert not os.path.exists(os.path.join(workdir, workdirs.LOCK_FILE))  # Ctrl-C released it
  # Refused by a config check after taking the lock: released too.
  with pytest.raises(plan.ConfigError, match="already holds a run"):
    workdirs.prepare(workdir, ml_collections.ConfigDict(dict(losses="free", seeds=2, epochs=1,
                                                             resume=False)))
  assert not os.path.exists(os.path.join(workdir, workdirs.LOCK_FILE))
  fresh = str(tmp_path / "fresh")
  with workdirs.locked(fresh):
    assert os.path.exists(os.path.join(fresh, workdirs.LOCK_FILE))
  assert not os.path.exists(os.path.join(fresh, workdirs.LOCK_FILE))


# -- 3. a full disk ---------------------------------------------------------------------------


def test_a_full_disk_stops_with_one_line_naming_the_file_and_keeps_earlier_results(tmp_path):
  workdir = tmp_path / "w"
  code, _, err = _sweep(tmp_path, workdir, "--config.fail_seed=2")
  path = workdir / "runs" / "free" / "seed2" / sweep.RESULT_FILE
  assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
  assert err.startswith(f"error: no space left to write {path} "), err
  assert json.load(open(workdir / "runs" / "free" / "seed1" / sweep.RESULT_FILE))["seed"] == 1
  rows = tables.read_csv(str(workdir / "results.csv"))  # the table of the first two runs
  assert [row["seed"] for row in rows] == ["0", "1"]
  assert not path.exists() and not (workdir / workdirs.LOCK_FILE).exists()
  assert not [name for name in os.listdir(path.parent) if name.endswith(".tmp")]
  code, _, err = _sweep(tmp_path, workdir)  # space again: the same command finishes
  assert code == 0, err
  assert len(tables.read_csv(str(workdir / "results.csv"))) == 3


def test_a_full_disk_under_the_tables_names_the_table_and_keeps_the_earlier_one(tmp_path,
                                                                               monkeypatch):
  tables.write_results(str(tmp_path), [{"spec": "free", "value": 1}], markdown="# old")

  def full(fd):
    raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(files.DiskFull) as raised:
    tables.write_results(str(tmp_path), [{"spec": "free", "value": 2}], markdown="# new")
  assert raised.value.filename == str(tmp_path / "results.csv")
  assert str(raised.value).startswith(f"no space left to write {tmp_path / 'results.csv'} (")
  assert tables.read_csv(str(tmp_path / "results.csv")) == [{"spec": "free", "value": "1"}]
  with pytest.raises(files.DiskFull, match="a.png"):
    tables.atomic_figure(lambda file: file.write(b"png"), str(tmp_path / "a.png"))
  assert sorted(os.listdir(tmp_path)) == ["results.csv", "results.md"]


# -- 5. SIGKILL at random instants -------------------------------------------------------------

SIMCLR = [sys.executable, "-m", "experiments.simclr",
          f"--config={os.path.join(ROOT, 'experiments', 'configs', 'simclr_digits.py')}",
          "--config.losses=free,tau=0.5", "--config.seeds=2", "--config.width=4",
          "--config.epochs=1", "--config.probe_epochs=0", "--config.eval_every_epochs=0",
          "--config.checkpoint_every=2", "--config.log_every=1", "--config.progress=False"]
KILLS = 10


def _start(workdir, log, *extra):
  env = dict(os.environ, XLA_FLAGS=with_host_devices(1))
  return subprocess.Popen([*SIMCLR, f"--workdir={workdir}", *extra], cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=log)


def _measured(rows):
  """The rows without timing columns (a `*time*`/`*seconds*` column varies: `train_seconds`)."""
  return [{key: value for key, value in row.items()
           if "time" not in key and "seconds" not in key} for row in rows]


def _started(proc, workdir, timeout=300) -> bool:
  """Waits until `proc` holds the workdir's lock (its start-up is over): False if it ended."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      return False
    with contextlib.suppress(OSError, ValueError):
      if _lock(workdir)["pid"] == proc.pid:
        return True
    time.sleep(0.02)
  raise AssertionError(f"no lock within {timeout} s")


@pytest.mark.slow
def test_a_sweep_killed_at_random_instants_ends_with_the_uninterrupted_table(tmp_path):
  """SIGKILL at KILLS seeded random instants of an uninterrupted run's duration (past start-up:
  from the moment the sweep holds its workdir; restart i lives the gap between instants i-1 and
  i), each restart the same command, then one run to the end: the same results.csv, bit for
  bit. A restart that ends before its gap (the work left was shorter) halves the later gaps."""
  log = open(tmp_path / "stderr.log", "w+")  # noqa: SIM115  (a file: a full pipe would block)
  began = time.monotonic()
  # One seed first compiles every program (into the session's cache), so that the measured
  # duration is the one each restart has, not XLA's first compilation.
  assert _start(tmp_path / "compile", log, "--config.seeds=1").wait(timeout=300) == 0
  start = time.monotonic()
  proc = _start(tmp_path / "uninterrupted", log)
  assert _started(proc, tmp_path / "uninterrupted")
  working = time.monotonic()
  assert proc.wait(timeout=300) == 0
  duration = time.monotonic() - working  # from holding the workdir to the end
  # Sorted instants of that duration; restart i lives from its start-up to the i-th gap.
  rng = random.Random(0)
  instants = sorted(rng.uniform(0.0, duration) for _ in range(KILLS))
  gaps = [b - a for a, b in zip([0.0, *instants], instants, strict=False)]
  kills = restarts = 0
  shrink = 1.0  # halved whenever a restart ends first (its gap outlasted the work left)
  while kills < KILLS and restarts < 3 * KILLS:
    proc = _start(tmp_path / "killed", log)
    restarts += 1
    if not _started(proc, tmp_path / "killed"):
      continue
    try:
      proc.wait(timeout=shrink * gaps[kills])
      shrink /= 2
    except subprocess.TimeoutExpired:
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      kills += 1
  assert kills == KILLS
  assert _start(tmp_path / "killed", log).wait(timeout=300) == 0
  log.seek(0)
  err = log.read()
  assert "does not hold a result" not in err and "Traceback" not in err, err[-3000:]
  expected, got = (tables.read_csv(str(tmp_path / name / "results.csv"))
                   for name in ("uninterrupted", "killed"))
  equal = _measured(got) == _measured(expected)
  print(f"\n{kills} SIGKILLs in {restarts} restarts at instants {[round(t, 2) for t in instants]} "
        f"s of the uninterrupted run's {duration:.1f} s (after a {working - start:.1f} s "
        f"start-up); results.csv equal to the uninterrupted one: {equal} ({len(got)} rows); "
        f"{time.monotonic() - began:.0f} s in all")
  assert equal and len(got) == 4, (got, expected)
  for run in plan.plan(ml_collections.ConfigDict(dict(losses="free,tau=0.5", seeds=2))):
    run = plan.Run(run.spec, run.seed, (("batch_size", 256),))
    first, second = (json.load(open(os.path.join(run.directory(str(tmp_path / name)),
                                                 sweep.RESULT_FILE)))
                     for name in ("uninterrupted", "killed"))
    assert _measured([first]) == _measured([second]), run


# -- 4. non-finite inputs to the losses (`check_finite`) ----------------------------------------


def _views():
  z1 = jax.random.normal(jax.random.key(0), (6, 4))
  return z1, z1 + 0.1 * jax.random.normal(jax.random.key(1), (6, 4))


LABELS = jnp.array([0, 0, 1, 1, 2, 2])
CALLS = {
    "info_nce": lambda a, b, **kw: losses.info_nce(a, b, **kw),
    "info_nce_all": lambda a, b, **kw: losses.info_nce(a, b, negatives="all", **kw),
    "sigmoid_loss": lambda a, b, **kw: losses.sigmoid_loss(a, b, **kw),
}


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("bad", ["z1", "z2"])
def test_check_finite_names_the_view_eagerly_and_under_checkify_jit(name, bad):
  z1, z2 = _views()
  views = {"z1": z1, "z2": z2}
  views[bad] = views[bad].at[4, 2].set(jnp.nan if bad == "z1" else -jnp.inf)
  loss = CALLS[name]
  with pytest.raises(ValueError, match=f"^{bad} must be finite .* the first in row 4"):
    loss(views["z1"], views["z2"], check_finite=True)
  checked = checkify.checkify(jax.jit(lambda a, b: loss(a, b, check_finite="checkify")))
  error, _ = checked(views["z1"], views["z2"])
  assert error.get() is not None and error.get().startswith(f"{bad} must be finite")
  error, value = checked(z1, z2)
  assert error.get() is None
  # The default (no check) gives the same values and lets a NaN through.
  assert value == jax.jit(loss)(z1, z2)
  assert loss(z1, z2, check_finite=True) == loss(z1, z2)
  assert np.isnan(loss(views["z1"], views["z2"]))


def test_check_finite_of_the_supervised_loss_names_z():
  z, _ = _views()
  bad = z.at[1, 0].set(jnp.inf)
  for form in ("ntxent", "supcon"):
    with pytest.raises(ValueError, match="^z must be finite .* the first in row 1"):
      losses.supervised_info_nce(bad, LABELS, form=form, check_finite=True)
    def loss(z, labels, form=form, **kw):
      return losses.supervised_info_nce(z, labels, form=form, **kw)

    checked = checkify.checkify(jax.jit(lambda z, labels: loss(z, labels,
                                                               check_finite="checkify")))
    assert checked(bad, LABELS)[0].get().startswith("z must be finite")
    error, value = checked(z, LABELS)
    assert error.get() is None and value == jax.jit(loss)(z, LABELS)
    assert loss(z, LABELS, check_finite=True) == loss(z, LABELS)
