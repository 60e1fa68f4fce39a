"""The one results writer of every experiment: `results.csv`, `results.md` and PNG figures.

Every experiment ends with `write_results(workdir, rows, markdown=..., figures=...)`; the
command line (`experiments.framework.cli`) then prints `results.md` and the files written. The
helpers below build the Markdown every table shares: plain tables, mean (std) cells and
differences paired by seed.
"""

from __future__ import annotations

import csv
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import IO

import numpy as np

from experiments.framework import plan
from tfcl_jax.training import files


def atomic_figure(draw: Callable[[IO[bytes]], None], path: str) -> None:
  """`draw(file)` into an open binary file that replaces `path` only once the figure is whole
  (`tfcl_jax.training.files.atomic_open`); matplotlib's `savefig` writes the format of
  `path`'s extension (`.png`, `.pdf`, ...).

  Raises:
    tfcl_jax.training.files.DiskFull: the disk or quota is full, naming `path`.
  """
  import matplotlib  # noqa: PLC0415  (the `experiments` extra)

  extension = os.path.splitext(path)[1].lstrip(".") or "png"
  with matplotlib.rc_context({"savefig.format": extension}), files.atomic_open(path, "wb") as f:
    draw(f)


#: Columns a sweep writes only for some losses, kept by every table that has them:
#: `final_scale`, the last scale a batch-scaled mapping solved (`sweep.train_run`).
SOLVED_COLUMNS = ("final_scale",)
#: Columns kept by every table that has them, by prefix: the label-free scores of a run
#: (`held_out.PREFIX`, `sweep.train_run`).
KEPT_PREFIXES = ("label_free/",)


def write_results(
    workdir: str,
    rows: Sequence[dict],
    *,
    markdown: str,
    columns: Sequence[str] | None = None,
    figures: Iterable[Callable[[str], None]] = (),
    name: str = "results",
) -> None:
  """Writes `workdir/<name>.csv` (one line per row), `workdir/<name>.md`, then the figures.

  Each file replaces the earlier one only once it is whole (`files.atomic_open`), so a kill or
  a full disk mid-write leaves the earlier tables. Only process 0 of a multi-process job writes.
  `columns` orders the CSV (missing values empty,
  other keys dropped, but for `SOLVED_COLUMNS` and those starting with one of
  `KEPT_PREFIXES`, appended where any row has them); by default
  the keys of every row in first-seen order. Each figure is
  `figure(workdir)`; they run after the tables so that a plotting error loses no result.

  Raises:
    ValueError: `rows` is empty (an experiment that produced nothing is a bug).
  """
  if not rows:
    raise ValueError("rows must not be empty: an experiment that produced nothing is a bug.")
  import jax  # noqa: PLC0415

  if jax.process_index() != 0:
    return
  os.makedirs(workdir, exist_ok=True)
  if columns is None:
    columns = list(dict.fromkeys(key for row in rows for key in row))
  else:
    present = dict.fromkeys(key for row in rows for key in row)
    columns = [*columns, *(key for key in SOLVED_COLUMNS if key not in columns and key in present),
               *(key for key in present
                 if key not in columns and key.startswith(KEPT_PREFIXES))]
  with files.atomic_open(os.path.join(workdir, name + ".csv"), "w", newline="") as file:
    writer = csv.DictWriter(file, list(columns), restval="", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
  with files.atomic_open(os.path.join(workdir, name + ".md"), "w") as file:
    file.write(markdown.rstrip() + "\n")
  for figure in figures:
    figure(workdir)


def writer(workdir: str, *, markdown: Callable[[list[dict]], str],
           columns: Sequence[str] | None = None,
           figures: dict[str, Callable[[str, list[dict]], None]] | None = None,
           name: str = "results") -> Callable[[list[dict]], None]:
  """`write_tables(rows)` for `sweep.run_all`: `write_results` with `markdown(rows)` and each
  figure `figures[name](file, rows)` drawn to `workdir/name` (whole or not at all,
  `atomic_figure`)."""
  def write(rows: list[dict]) -> None:
    drawn = [lambda folder, name=name, draw=draw: atomic_figure(
                 lambda file: draw(file, rows), os.path.join(folder, name))
             for name, draw in (figures or {}).items()]
    write_results(workdir, rows, markdown=markdown(rows), columns=columns, figures=drawn,
                  name=name)

  return write


def sweep_writer(workdir: str, config, *, columns: Sequence[str],
                 markdown: Callable[..., str], plots: dict[str, Callable[..., None]],
                 command: str) -> Callable[[list[dict]], None]:
  """`writer` for an experiment whose table is `markdown(rows, config, command)` (its
  `results_markdown`, which `experiments.regenerate` also calls) and whose figures are
  `plots[name](file, rows, config)`."""
  return writer(
      workdir, columns=columns, markdown=lambda rows: markdown(rows, config, command),
      figures={name: lambda file, rows, draw=draw: draw(file, rows, config)
               for name, draw in plots.items()})


def sweep_markdown(table: Callable[..., str], *, example: str) -> Callable[..., str]:
  """`results_markdown(rows, config, command)` of a specs × seeds sweep whose table is
  `table(rows, specs, dataset=..., command=..., epochs=...)` (specs in `config.losses` order)."""

  def results_markdown(rows: list[dict], config, command: str) -> str:
    return table(rows, plan.loss_specs(config, example=example), dataset=config.dataset,
                 command=command, epochs=config.epochs)

  return results_markdown


def sweep_plot(draw: Callable[..., None], *, example: str) -> Callable[..., None]:
  """`plot(file, rows, config)` of a specs × seeds sweep whose figure is
  `draw(file, rows, specs, dataset=...)`."""

  def plot(file, rows: list[dict], config) -> None:
    draw(file, rows, plan.loss_specs(config, example=example), dataset=config.dataset)

  return plot


def typed(rows: Sequence[dict]) -> list[dict]:
  """CSV rows with their numbers back: `"3"` -> 3, `"0.5"` or `"nan"` -> float, other text
  (and empty cells) as it is. `write_results` writes ints and floats so that this returns the
  values a sweep's tables were made from."""
  def parse(text):
    if not isinstance(text, str) or not text:
      return text
    if re.fullmatch(r"-?\d+", text):
      return int(text)
    try:
      return float(text)
    except ValueError:
      return text

  return [{key: parse(value) for key, value in row.items()} for row in rows]


def read_csv(path: str, *, columns: Sequence[str] = ()) -> list[dict]:
  """The rows of a `results.csv` as dicts of strings ([] when the file does not exist).

  Raises:
    plan.ConfigError: the file's header lacks one of `columns`, naming the file, the
      columns expected and its header.
  """
  if not os.path.exists(path):
    return []
  with open(path, newline="") as file:
    reader = csv.DictReader(file)
    header = reader.fieldnames or []
    missing = [column for column in columns if column not in header]
    if missing:
      raise plan.ConfigError(f"{path} lacks the columns {', '.join(missing)}: expected "
                             f"{', '.join(columns)} in its header, found {','.join(header)}.")
    return list(reader)


def format_value(value) -> str:
  """A table cell: floats to 3 significant digits (NaN as `-`), anything else as `str`."""
  if isinstance(value, float):
    if value != value:  # NaN: a run with no value for this column, e.g. never reached.
      return "-"
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"
  return str(value)


def markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
  """A GitHub Markdown table of `rows` (dicts) restricted to `columns`."""
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(format_value(row[c]) for c in columns) + " |" for row in rows]
  return "\n".join(lines)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (ddof = 1; NaN for one value)."""
  values = np.asarray(values, np.float64)
  return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else float("nan")


def paired_differences(rows: Sequence[dict], names: Sequence[str], *, metric: str,
                       reference: str = "free", key: str = "spec",
                       scale: float = 100.0) -> list[dict]:
  """`reference` minus each other name in `metric` (times `scale`), paired by seed.

  A seed fixes the initialisation, the views and the evaluation split of every run, so
  per-seed differences cancel that noise. Returns, per name in `names` order (not
  `reference`): the shared `seeds`, the `mean` difference, its standard error `sem`, the
  two-sided paired t-test `p_value` (`scipy.stats.ttest_rel`; NaN below 2 seeds) and how many
  seeds `reference` won (`wins`).
  """
  from scipy import stats  # noqa: PLC0415

  by_name = {name: {int(r["seed"]): scale * float(r[metric]) for r in rows if r[key] == name}
             for name in names}
  base = by_name.get(reference, {})
  table = []
  for name in names:
    seeds = sorted(set(base) & set(by_name[name]))
    if name == reference or not seeds:
      continue
    ours = np.array([base[s] for s in seeds])
    theirs = np.array([by_name[name][s] for s in seeds])
    diffs = ours - theirs
    many = len(seeds) > 1
    table.append({key: name, "seeds": len(seeds), "mean": float(diffs.mean()),
                  "sem": float(diffs.std(ddof=1) / np.sqrt(len(seeds))) if many else float("nan"),
                  "p_value": float(stats.ttest_rel(ours, theirs).pvalue) if many
                  else float("nan"),
                  "wins": int(np.sum(diffs > 0))})
  return table


def paired_markdown(paired: Sequence[dict], *, caption: str, digits: int = 2,
                    reference: str = "free") -> list[str]:
  """Markdown lines of `paired_differences`' rows under `caption` (none for no rows): one
  line per loss with the seeds, `reference − loss` (s.e.), the paired t-test p and the
  reference's wins."""
  if not paired:
    return []
  lines = ["", caption, "", f"| loss | seeds | {reference} − loss (s.e.) | paired t-test p "
           f"| seeds {reference} wins |", "|---|---|---|---|---|"]
  for row in paired:
    lines.append(f"| {row['spec']} | {row['seeds']} | {row['mean']:+.{digits}f} "
                 f"({row['sem']:.{digits}f}) | {row['p_value']:.2g} | "
                 f"{row['wins']}/{row['seeds']} |")
  return lines


def command_line() -> str:
  """The command that is running, as `python -m module args` when run with `-m` (a package's
  name for its `__main__`)."""
  argv = list(sys.argv)
  module = main_module()
  if module:
    return "python -m " + " ".join([module] + [shlex.quote(a) for a in argv[1:]])
  return "python " + " ".join(shlex.quote(a) for a in argv)


def main_module() -> str | None:
  """The module `python -m` runs (`experiments.simclr` for its `__main__.py`), or None."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is None or not spec.name:
    return None
  return spec.name.removesuffix(".__main__")


def study_markdown(rows: Sequence[dict], *, title: str,
                   sections: Sequence[tuple[str, Sequence[dict]]] | None = None,
                   columns: Sequence[str] | None = None, notes: str = "",
                   command: str | None = None) -> str:
  """The title, the command that made it (default: the one running), `notes`, and one table per
  `(heading, rows)` section (or one table of `rows`), showing `columns` or each section's own
  keys."""
  command = command_line() if command is None else command
  parts = [f"# {title}", "", "Command:", "", "```", command, "```", ""]
  if notes:
    parts += [notes.strip(), ""]
  for heading, section_rows in sections or [("", rows)]:
    if heading:
      parts += [f"## {heading}", ""]
    parts += [markdown_table(section_rows, list(columns or section_rows[0])), ""]
  return "\n".join(parts)
