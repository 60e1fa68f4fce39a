"""Sweeps against what machines do to them: kills mid-write, two sweeps on one workdir, a full
disk, and SIGKILL at random instants (`experiments.runner`, `experiments.tables`,
`experiments.cli`)."""

from __future__ import annotations

import csv
import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import ml_collections
import pytest

from experiments import runner, tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A sweep through the real command line whose training is instant: `fail_seed` injects ENOSPC
# into the write of that seed's result.json, `hold_seed` holds the workdir (sleeps) there.
SWEEP = textwrap.dedent("""
    import errno, os, sys, time
    from experiments import cli, runner, tables

    def run(config, workdir):
      runs = runner.plan(config)

      def train(run):
        if run.seed == config.hold_seed:
          open(os.path.join(workdir, "holding"), "w").close()
          time.sleep(600)
        if run.seed == config.fail_seed:
          def full(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
          os.fsync = full
        return {"mapping": run.spec, "seed": run.seed, "value": 0.5 + run.seed}

      write = tables.writer(workdir, markdown=lambda rows: f"{len(rows)} rows")
      return runner.sweep(config, workdir, runs=runs, train_run=train, write_tables=write,
                          plan_fields=("fail_seed", "hold_seed"))

    cli.run_main(run, usage="u", user_errors=(runner.ConfigError,))
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

  runner.run_all([Run("a"), Run("b")], train, workdir=workdir, progress=False)
  path = os.path.join(workdir, "runs", "a", runner.RESULT_FILE)
  with open(path, "w") as f:
    f.write('{"name": "a", "val')  # what a kill mid-write of a plain open() leaves
  assert not runner.finished(Run("a"), workdir)
  results = runner.run_all([Run("a"), Run("b")], train, workdir=workdir, progress=False)
  assert trained == ["a", "b", "a"] and results == [{"name": "a"}, {"name": "b"}]
  notice = [line for line in capsys.readouterr().err.splitlines() if path in line]
  assert len(notice) == 1 and notice[0].startswith("note: ") and "redone" in notice[0]
  assert json.load(open(path)) == {"name": "a"}


def test_a_write_interrupted_mid_file_leaves_the_old_file(tmp_path, monkeypatch):
  rows = [{"mapping": "free", "seed": 0, "value": 1.0}]
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
  path = str(tmp_path / "result.json")
  with tables.atomic_open(path) as f:
    json.dump({"value": 1}, f)
  with pytest.raises(RuntimeError), tables.atomic_open(path) as f:
    f.write('{"value": ')
    raise RuntimeError("killed")
  assert json.load(open(path)) == {"value": 1}


def test_a_figure_is_replaced_only_once_drawn(tmp_path):
  write = tables.writer(str(tmp_path), markdown=lambda rows: "# t",
                        figures={"a.png": lambda path, rows: open(path, "w").write("png")})
  write([{"x": 1}])
  assert (tmp_path / "a.png").read_text() == "png"

  def broken(path, rows):
    open(path, "w").write("pn")
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    tables.writer(str(tmp_path), markdown=lambda rows: "# t", figures={"a.png": broken})(
        [{"x": 1}])
  assert (tmp_path / "a.png").read_text() == "png"
  assert sorted(os.listdir(tmp_path)) == ["a.png", "results.csv", "results.md"]


# -- 2. one sweep per workdir -----------------------------------------------------------------


def _lock(workdir):
  with open(os.path.join(workdir, runner.LOCK_FILE)) as f:
    return json.load(f)


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
    with pytest.raises(runner.ConfigError, match=f"in use by pid {holder.pid}"):
      runner.acquire(str(workdir))  # in this process too
  finally:
    holder.kill()
    holder.wait()
  # The holder died without releasing: the next sweep takes the lock over and finishes.
  code, _, err = _sweep(tmp_path, workdir)
  assert code == 0, err
  assert f"note: taking over the lock of '{workdir}' from pid {holder.pid}" in err
  assert not (workdir / runner.LOCK_FILE).exists()  # released at the end
  assert len(tables.read_csv(str(workdir / "results.csv"))) == 3


def test_a_stale_lock_is_taken_over_and_every_way_out_releases_it(tmp_path, capsys):
  workdir = str(tmp_path)
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  with open(os.path.join(workdir, runner.LOCK_FILE), "w") as f:
    json.dump({"pid": int(dead.stdout), "host": socket.gethostname(), "started": "x"}, f)
  config = ml_collections.ConfigDict(dict(losses="free", seeds=2))
  runs = runner.plan(config)

  def train(run):
    assert _lock(workdir)["pid"] == os.getpid()
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    runner.sweep(config, workdir, runs=runs, train_run=train, write_tables=lambda rows: None)
  err = capsys.readouterr().err
  assert f"note: taking over the lock of {workdir!r} from pid {int(dead.stdout)}" in err
  assert not os.path.exists(os.path.join(workdir, runner.LOCK_FILE))  # Ctrl-C released it
  # Refused by a config check after taking the lock: released too.
  with pytest.raises(runner.ConfigError, match="already holds a run"):
    runner.prepare(workdir, ml_collections.ConfigDict(dict(losses="free", seeds=2, epochs=1,
                                                           resume=False)))
  assert not os.path.exists(os.path.join(workdir, runner.LOCK_FILE))
  fresh = str(tmp_path / "fresh")
  with runner.locked(fresh):
    assert os.path.exists(os.path.join(fresh, runner.LOCK_FILE))
  assert not os.path.exists(os.path.join(fresh, runner.LOCK_FILE))


# -- 3. a full disk ---------------------------------------------------------------------------


def test_a_full_disk_stops_with_one_line_naming_the_file_and_keeps_earlier_results(tmp_path):
  workdir = tmp_path / "w"
  code, _, err = _sweep(tmp_path, workdir, "--config.fail_seed=2")
  path = workdir / "runs" / "free" / "seed2" / runner.RESULT_FILE
  assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
  assert err.startswith(f"error: no space left to write {path} "), err
  assert json.load(open(workdir / "runs" / "free" / "seed1" / runner.RESULT_FILE))["seed"] == 1
  rows = tables.read_csv(str(workdir / "results.csv"))  # the table of the first two runs
  assert [row["seed"] for row in rows] == ["0", "1"]
  assert not path.exists() and not (workdir / runner.LOCK_FILE).exists()
  assert not [name for name in os.listdir(path.parent) if name.endswith(".tmp")]
  code, _, err = _sweep(tmp_path, workdir)  # space again: the same command finishes
  assert code == 0, err
  assert len(tables.read_csv(str(workdir / "results.csv"))) == 3


def test_disk_full_error_names_the_file():
  error = tables.DiskFullError(errno.ENOSPC, os.strerror(errno.ENOSPC), "w/results.csv")
  assert str(error).startswith("no space left to write w/results.csv (")


# -- 5. SIGKILL at random instants -------------------------------------------------------------
