"""Random bad command lines for every experiment on `experiments.framework.cli`: each ends in one
line on stderr naming the field or file, exit 2, no traceback, and no workdir a later run would
resume from (or, for a value that is valid after all, it starts to run, or stops at the data).

The cases run as on a machine with nothing cached: `HOME` is an empty folder and no
`TFCL_JAX_*` variable is set, so MovieLens is absent (and the Planetoid files are, where the
checkout has no `../shared` beside it). Each experiment checks its whole config
before it opens its data: a bad field is named whatever the environment holds, and a case
that stops on `config.data_dir` has passed every check of the config.

One driver process imports the experiments once and forks a child per case (the child runs
the module as `python -m` would), so a case costs a fork, not a Python and JAX start-up.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest

from experiments import registry
from experiments.framework import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Every experiment of the registry (`python -m experiments.NAME` runs `cli.run_main`), with its
# first config, and those whose `config.data_dir` names files.
EXPERIMENTS = {experiment.name: os.path.join(ROOT, experiment.configs[0])
               for experiment in registry.experiments().values()}
DATA_EXPERIMENTS = tuple(experiment.name for experiment in registry.experiments().values()
                         if experiment.reads_files)
CASES = 40
# Found by this fuzz, in checks that belong to the experiment modules themselves (their
# owners' to fix): (module, field) -> what happens.
KNOWN: dict[tuple[str, str], str] = {}  # (module, field) of a problem not yet handled
RUNS_S = 4.0  # a case still going after this has passed the checks: it runs

DRIVER = textwrap.dedent("""
    import importlib, json, os, runpy, signal, sys, time
    cases, limit = json.loads(sys.argv[1]), float(sys.argv[2])
    for module in {case["module"] for case in cases}:
      importlib.import_module(module)
    out = []
    for case in cases:
      err = case["workdir"] + ".err"
      pid = os.fork()
      if pid == 0:
        fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        sys.argv = [case["module"]] + case["argv"]
        import warnings  # run_module warns that the driver imported the module already
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")
        code = 0
        try:
          runpy.run_module(case["module"], run_name="__main__", alter_sys=True)
        except SystemExit as exit:
          code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        except BaseException:
          import traceback
          traceback.print_exc()
          code = 1
        sys.stderr.flush()
        os._exit(code)
      deadline = time.monotonic() + limit
      while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
          code = os.waitstatus_to_exitcode(status)
          break
        if time.monotonic() > deadline:
          os.kill(pid, signal.SIGKILL)
          os.waitpid(pid, 0)
          code = "runs"
          break
        time.sleep(0.02)
      out.append({"code": code, "stderr": open(err).read()})
    print(json.dumps(out))
""")


def _hermetic_env(tmp_path) -> dict[str, str]:
  """This environment with an empty `HOME` and no `TFCL_JAX_*` variables."""
  home = tmp_path / "home"
  home.mkdir(exist_ok=True)
  env = {k: v for k, v in os.environ.items() if not k.startswith("TFCL_JAX_")}
  return {**env, "HOME": str(home)}


def _fields(module):
  path = EXPERIMENTS[module]
  return path, cli._fields(cli.load_config(path))


def _cases(tmp_path):
  rng = random.Random(0)
  cases = []
  modules = sorted(EXPERIMENTS)
  for index in range(CASES):
    module = modules[index % len(modules)]
    path, fields = _fields(module)
    kind = rng.choice(["unknown", "type", "number", "empty", "data"]
                      if module in DATA_EXPERIMENTS else ["unknown", "type", "number", "empty"])
    numbers = [f for f, v in fields.items() if isinstance(v, int) and not isinstance(v, bool)]
    strings = [f for f, v in fields.items() if isinstance(v, str)]
    typed = [f for f, v in fields.items() if isinstance(v, (int, float)) and v is not None]
    if kind == "unknown" or (kind == "number" and not numbers) or (kind == "type" and not typed):
      name = rng.choice(list(fields))
      name = rng.choice([name + "s", name[:-1], name.upper(), "x" + name])
      if name in fields:
        name = "nonexistent_field"
      override, named = f"--config.{name}=1", name
    elif kind == "type":
      name = rng.choice(typed)
      override, named = f"--config.{name}={rng.choice(['abc', '1.5.2', '[]'])}", name
    elif kind == "number":
      name = rng.choice(numbers)
      override, named = f"--config.{name}={rng.choice([-1, 0, 10**15])}", name
    elif kind == "empty":
      name = rng.choice(strings or list(fields))
      override, named = f"--config.{name}=", name
    else:
      data = tmp_path / f"data{index}"
      data.mkdir()
      for name in rng.choice([[], ["u.data", "u.item", "ml-100k/u.data", "citeseer.x"]]):
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_bytes(rng.choice([b"", b"\x00garbage\xff\n1\t2\n"]))
      override, named = f"--config.data_dir={data}", "data_dir"
    workdir = str(tmp_path / f"case{index}")
    cases.append({"module": f"experiments.{module}", "named": named, "workdir": workdir,
                  "argv": [f"--config={path}", f"--workdir={workdir}", override]})
  return cases


@pytest.mark.slow
def test_bad_command_lines_end_in_one_line_and_exit_2(tmp_path):
  cases = _cases(tmp_path)
  results = _drive(cases, tmp_path)
  problems, known, ran = [], [], 0
  for case, result in zip(cases, results, strict=True):
    err, code = result["stderr"], result["code"]
    label = f"{case['module']} {case['argv'][-1]}"
    if code == "runs" or code == 0 or (
        case["named"] != "data_dir" and _stopped_at_data(case, err, code)):
      ran += 1
      continue
    if (case["module"], case["named"]) in KNOWN:
      known.append(f"{label}: {KNOWN[case['module'], case['named']]}")
      continue
    lines = [line for line in err.strip().splitlines() if not line.startswith("note: ")]
    if code != 2 or len(lines) != 1 or "Traceback" in err or not lines[0].startswith("error: "):
      problems.append(f"{label}: exit {code}: {err.strip()[-600:]}")
    elif case["named"].split(".")[-1] not in lines[0]:
      problems.append(f"{label}: does not name {case['named']}: {lines[0]}")
    elif os.path.exists(os.path.join(case["workdir"], "config.json")):
      problems.append(f"{label}: left {case['workdir']}/config.json")
  refused = len(cases) - ran - len(problems) - len(known)
  print(f"\n{len(cases)} cases: {refused} refused in one line, {ran} ran, {len(known)} known "
        f"problems of the experiments' own checks, {len(problems)} new problems")
  print("\n".join(known))
  assert not problems, "\n".join(problems)


def _drive(cases, tmp_path) -> list[dict]:
  proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(cases), str(RUNS_S)],
                        cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env=_hermetic_env(tmp_path))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _stopped_at_data(case, err: str, code) -> bool:
  """Whether a case passed the config checks and stopped because its data is absent."""
  lines = [line for line in err.strip().splitlines() if not line.startswith("note: ")]
  return (case["module"].split(".")[-1] in DATA_EXPERIMENTS and code == 2
          and len(lines) == 1 and lines[0].startswith("error: config.data_dir: "))


# With the data absent, a bad field is named, not the missing data: one case per kind of rule
# (a count, a range, a choice, a spec, a derived constraint), each beside a valid field.
DATA_ABSENT_CASES = [
    ("dcrec", "max_length", "0"), ("dcrec", "min_user_interactions", "-1"),
    ("dcrec", "hidden_dropout", "1.5"), ("dcrec", "num_heads", "3"),
    ("dcrec", "losses", "tau=0"), ("dcrec", "learning_rate", "-0.1"),
    ("dcrec", "cl_weight", "-1.0"), ("dcrec", "log_every", "0"),
    ("retrieval", "optimizer", "rmsprop"), ("retrieval", "split", "leave_one"),
    ("retrieval", "train_fraction", "1.0"), ("retrieval", "query_features", "user_id,height"),
    ("retrieval", "hidden_dims", "64,x"), ("retrieval", "losses", "free+logp"),
    ("retrieval", "reduction", "max"), ("retrieval", "min_word_count", "0"),
    ("grace", "edge_rate", "1.0"), ("grace", "dataset", "pubmedx"),
    ("grace", "val_fraction", "0.95"), ("grace", "probe_eval_every_epochs", "0"),
]


@pytest.mark.slow
def test_bad_fields_are_named_with_the_data_absent(tmp_path):
  cases = [{"module": f"experiments.{module}", "named": field,
            "workdir": str(tmp_path / f"case{index}"),
            "argv": [f"--config={EXPERIMENTS[module]}",
                     f"--workdir={tmp_path / f'case{index}'}",
                     f"--config.data_dir={tmp_path / 'absent'}", f"--config.{field}={value}"]}
           for index, (module, field, value) in enumerate(DATA_ABSENT_CASES)]
  # The same configs with no bad field stop at the data: the check above is not vacuous.
  cases += [{"module": f"experiments.{module}", "named": "data_dir",
             "workdir": str(tmp_path / f"valid_{module}"),
             "argv": [f"--config={EXPERIMENTS[module]}",
                      f"--workdir={tmp_path / f'valid_{module}'}",
                      f"--config.data_dir={tmp_path / 'absent'}"]}
            for module in ("dcrec", "retrieval", "grace")]
  results = _drive(cases, tmp_path)
  problems = []
  for case, result in zip(cases, results, strict=True):
    lines = [line for line in result["stderr"].strip().splitlines()
             if not line.startswith("note: ")]
    label = f"{case['module']} {' '.join(case['argv'][2:])}"
    # A malformed spec's message goes on with the grammar; its first line names the field.
    if result["code"] != 2 or not lines or "Traceback" in result["stderr"]:
      problems.append(f"{label}: exit {result['code']}: {result['stderr'].strip()[-400:]}")
    elif not lines[0].startswith("error: ") or f"config.{case['named']}" not in lines[0] or (
        case["named"] != "data_dir" and "data_dir" in result["stderr"]):
      problems.append(f"{label}: does not name config.{case['named']}: {lines[0]}")
    elif os.path.exists(case["workdir"]):
      problems.append(f"{label}: left {case['workdir']}")
  assert not problems, "\n".join(problems)
