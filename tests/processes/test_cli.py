"""The shared command line (`experiments.framework.cli`): config-field checks, --help, Ctrl-C,
resume."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments.framework import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIMCLR = os.path.join(ROOT, "experiments", "configs", "simclr_digits.py")


@pytest.mark.parametrize("override, expected", [
    ("--config.epochs=3", None),
    ("--config.lr=0.1", "unknown config field 'lr'; did you mean learning_rate?"),
    ("--config.epoch=3", "unknown config field 'epoch'; did you mean epochs"),
    ("--config.zzzz=1", "unknown config field 'zzzz' (`--help`"),
])
def test_overrides_are_checked_against_the_config_fields(override, expected):
  problem = cli.check_overrides(["prog", f"--config={SIMCLR}", override])
  if expected is None:
    assert problem is None
  else:
    assert problem.startswith(expected), problem


def test_missing_config_file_is_named():
  assert cli.check_overrides(["prog", "--config=nope.py"]) == "--config=nope.py: no such file."


def test_help_lists_every_field_with_its_default():
  text = cli.help_text(["prog", f"--config={SIMCLR}"], usage="u")
  config = cli.load_config(SIMCLR)
  for name, value in config.items():
    assert f"  {name} = {value!r}" in text


def test_help_names_the_command_as_it_is_typed():
  """`python -m experiments.simclr` runs the package's `__main__`: the usage line (and the
  command a table records, `tables.command_line`) names the package."""
  result = subprocess.run([sys.executable, "-m", "experiments.simclr", f"--config={SIMCLR}",
                           "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.startswith("usage: python -m experiments.simclr --config=FILE"), (
      result.stdout[:200])


COUNTING_CONFIG = """
import ml_collections, os

def get_config():
  with open(os.environ["CONFIG_RUNS"], "a") as f:
    f.write("ran\\n")
  return ml_collections.ConfigDict(dict(losses="free", seeds=2, nested=dict(steps=3)))
"""
MAIN = """
import sys
from experiments.framework import cli
cli.run_main(lambda config, workdir: print("trained", config.seeds, config.nested.steps),
             check_config=lambda config: print("checked", config.losses), usage="u")
"""


@pytest.mark.parametrize("extra, printed", [
    ((), "checked free\ntrained 2 3"),
    (("--config.seeds=5", "--config.nested.steps=7"), "checked free\ntrained 5 7"),
])
def test_the_config_file_runs_once_per_command(tmp_path, extra, printed):
  config = tmp_path / "config.py"
  config.write_text(COUNTING_CONFIG)
  runs = tmp_path / "runs.txt"
  result = subprocess.run(
      [sys.executable, "-c", MAIN, "--config", str(config), f"--workdir={tmp_path / 'w'}",
       *extra], cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, "CONFIG_RUNS": str(runs)})
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.startswith(printed)
  assert runs.read_text() == "ran\n"


# Each wait ends as soon as its condition holds; the limit only has to outlast a machine whose
# cores are shared with other jobs (the child compiles the SimCLR step before its first step).
WAIT_S = 600


# `python -m experiments.simclr` with Python's own Ctrl-C handler, as a terminal starts it: a
# shell without job control starts its background commands (and so this test's process) with
# SIGINT ignored, which a child inherits.
AS_IF_FROM_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('experiments.simclr', run_name='__main__', alter_sys=True)")


def _simclr(workdir, *extra):
  """Starts the SimCLR digits experiment; returns the process and the file its stderr goes to
  (a file, not a pipe: a progress bar filling an unread pipe would block the child)."""
  log = open(f"{workdir}.{time.monotonic_ns()}.err", "w+")  # noqa: SIM115
  proc = subprocess.Popen(
      [sys.executable, "-c", AS_IF_FROM_A_TERMINAL, f"--config={SIMCLR}", f"--workdir={workdir}",
       "--config.losses=free", "--config.seeds=1", "--config.width=4",
       "--config.probe_epochs=0", "--config.eval_every_epochs=0",
       "--config.checkpoint_every=5", *extra], cwd=ROOT, stdout=subprocess.DEVNULL,
      stderr=log, text=True)
  return proc, log


def _finish(proc, log, timeout=WAIT_S) -> str:
  proc.wait(timeout=timeout)
  log.seek(0)
  text = log.read()
  log.close()
  return text


def test_unknown_field_is_one_line_and_exit_2(tmp_path):
  err = _finish(*_simclr(tmp_path, "--config.epoch=3"))
  assert err.startswith("error: unknown config field 'epoch'") and "Traceback" not in err
  assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_the_same_command_resumes_and_sigterm_stops_it_with_143(tmp_path):
  proc, log = _simclr(tmp_path, "--config.epochs=400", "--config.log_every=1")
  metrics = tmp_path / "runs" / "free" / "batch_size_256" / "seed0" / "metrics.csv"
  deadline = time.monotonic() + WAIT_S
  while time.monotonic() < deadline:  # wait for the first checkpoint (step 5)
    if (metrics.parent / "checkpoints" / "5").exists():
      break
    time.sleep(0.5)
  else:
    proc.kill()
    pytest.fail(f"no checkpoint within {WAIT_S} s")
  proc.send_signal(signal.SIGINT)
  err = _finish(proc, log)
  assert proc.returncode == 130, err[-2000:]
  assert err.strip().splitlines()[-1].startswith("interrupted: ") and "Traceback" not in err
  with open(metrics) as f:
    stopped_at = int(list(csv.DictReader(f))[-1]["step"])
  assert stopped_at < 2000
  assert (metrics.parent / "checkpoints" / str(stopped_at)).is_dir()  # saved where it stopped
  # The same command continues from the last checkpoint (step numbers go on, not from 1).
  resumed, log = _simclr(tmp_path, "--config.epochs=400", "--config.log_every=1")
  deadline = time.monotonic() + WAIT_S
  while time.monotonic() < deadline:
    with open(metrics) as f:
      steps = [int(row["step"]) for row in csv.DictReader(f)]
    if steps and steps[-1] > stopped_at + 2:
      break
    time.sleep(0.5)
  # SIGTERM (a preempted job): the step's checkpoint is saved, one line, exit 143.
  resumed.send_signal(signal.SIGTERM)
  err = _finish(resumed, log)
  assert resumed.returncode == cli.PREEMPTED_STATUS, err[-2000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("stopped: preempted (SIGTERM): checkpoint saved at step ") and (
      "Traceback" not in err)
  with open(metrics) as f:
    steps = [int(row["step"]) for row in csv.DictReader(f)]
  assert steps == list(range(1, len(steps) + 1)), "one row per step, no restart from step 1"
  saved = int(last.split("at step ")[1].split()[0])
  assert saved == steps[-1] and (metrics.parent / "checkpoints" / str(saved)).is_dir()


def test_summary_prints_the_table_and_the_files(tmp_path):
  (tmp_path / "results.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
  (tmp_path / "runs").mkdir()
  text = cli.summary(str(tmp_path))
  assert text.startswith("| a | b |") and text.endswith("results.md, runs/")
