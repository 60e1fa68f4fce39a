"""The sweeps the regret study still needs: per row, the command that adds the candidates not yet
committed at the row's seed count (with the reference τ rerun beside them where
`docs/regret.md` says so), or first the row's fixed-τ grid where part of it is not committed.

Each command grows the row's `regret_*` table's sweep (a workdir's sweep grows when rerun with
more losses or seeds) or starts it from the row's committed command; its `results.csv` and
`results.md` then become `experiments/results/regret_*.csv`/`.md`.

Run: python -m experiments.regret --remaining
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

from experiments.regret.study import CANDIDATES, RESULTS, Row, RowRuns

#: Experiments whose data the user passes (`--config.data_dir=DIR`).
_DATA_DIR = ("experiments.retrieval", "experiments.dcrec")


def recorded_command(name: str, results: str = RESULTS) -> str | None:
  """The command `results/NAME.md` records (`experiments.regenerate.recorded_command`), or
  None when there is no such table or it records none."""
  from experiments import regenerate  # noqa: PLC0415  (regenerate imports the study's report)

  path = os.path.join(results, name + ".md")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    try:
      return regenerate.recorded_command(f.read())
    except ValueError:
      return None


def wanted(row: Row, verdict: Mapping[str, str]) -> list[str]:
  """The candidates a row needs: all but the new maps that stopped at screening; a new map
  still pending runs on the screening rows only."""
  out = []
  for candidate in CANDIDATES:
    state = verdict.get(candidate, "goes on")
    if state == "goes on" or (state.startswith("pending") and row.screening):
      out.append(candidate)
  return out


def _command(base: str, *, losses: list[str], seeds: int, workdir: str) -> str:
  args = [arg for arg in shlex.split(base) if not arg.startswith(
      ("--config.losses=", "--config.seeds=", "--workdir=", "--config.progress="))]
  if args[2] in _DATA_DIR and not any(a.startswith("--config.data_dir=") for a in args):
    args.append("--config.data_dir=DIR")
  args += [f"--config.seeds={seeds}", "--config.losses=" + ",".join(losses),
           f"--workdir={workdir}"]
  return " ".join(args)


def row_command(runs: RowRuns, verdict: Mapping[str, str],
                results: str = RESULTS) -> str | None:
  """The command the row needs next, or None when it has every wanted candidate (or, on a
  screening row, every candidate at the screening seeds while a new map awaits its verdict)."""
  row = runs.row
  screening = row.screening and any(state.startswith("pending") for state in verdict.values())
  seeds = row.screening_seeds if screening else row.seeds
  have = {spec for table in runs.by_table.values() for spec, done in table.items()
          if len(done) >= seeds}
  specs = [c for c in wanted(row, verdict) if c not in have]
  missing_grid = [name for name in row.tables[:row.grid_tables] if name not in runs.by_table]
  if missing_grid and missing_grid[0] != row.tables[-1]:
    target, specs = missing_grid[0], list(row.grid)  # the grid before any candidate
  else:
    target = row.tables[-1]
    if missing_grid:  # the table is the row's whole grid and its candidates
      specs = list(row.grid) + [spec for spec in specs if spec not in row.grid]
    if not specs:
      return None
    ours = runs.by_table.get(target, {})
    reference = runs.reference
    if row.rerun_reference and reference and reference not in ours and reference not in specs:
      specs.insert(0, reference)
    specs = [spec for spec in ours if spec not in specs] + specs  # the sweep grows
  grows = recorded_command(target, results)
  base = grows or recorded_command(row.tables[0], results) or row.command
  if not base:
    raise ValueError(f"row {row.key!r}: no table records a command and the row names none.")
  recorded = [a for a in shlex.split(base) if a.startswith("--workdir=")]
  workdir = (recorded[0].removeprefix("--workdir=") if grows and recorded
             else f"runs/regret/{target.removeprefix('regret_')}")
  return _command(base, losses=[row.prefix + spec for spec in specs], seeds=seeds,
                  workdir=workdir)


def remaining(result: Mapping, results: str = RESULTS) -> list[tuple[str, str]]:
  """`(row keys, command)` for every sweep the study needs (rows sharing a table share it)."""
  out: dict[str, list[str]] = {}
  for runs in result["all_runs"]:
    command = row_command(runs, result["verdict"], results)
    if command:
      out.setdefault(command, []).append(runs.row.key)
  return [(", ".join(keys), command) for command, keys in out.items()]
