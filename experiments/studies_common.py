"""Glue shared by the temperature studies: `--config`/`--workdir` parsing and results files.

Each study module defines `run(config, workdir) -> rows` and calls `main_for(run)`.
"""

from __future__ import annotations

import csv
import os
import shlex
import sys
from collections.abc import Callable, Sequence

import jax

from experiments import cli
from tfcl_jax import langevin

Row = dict


def _format(value) -> str:
  if isinstance(value, float):
    if value != value:  # NaN: a run with no value for this column, e.g. never reached.
      return "-"
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"
  return str(value)


def markdown_table(rows: Sequence[Row], columns: Sequence[str]) -> str:
  """A GitHub Markdown table of `rows` (dicts) restricted to `columns`."""
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(_format(row[c]) for c in columns) + " |" for row in rows]
  return "\n".join(lines)


def write_results(
    workdir: str,
    rows: Sequence[Row],
    *,
    title: str,
    sections: Sequence[tuple[str, Sequence[Row]]] | None = None,
    columns: Sequence[str] | None = None,
    notes: str = "",
) -> None:
  """Writes `workdir/results.csv` (all rows, all columns) and `workdir/results.md`.

  `results.md` holds the title, the command that made it, `notes`, and one
  table per section (`(heading, rows)`), or a single table of `rows`; the
  tables show `columns`, or each section's own keys when `columns` is None.
  """
  if not rows:
    raise ValueError("rows must not be empty: a study that produced nothing is a bug.")
  os.makedirs(workdir, exist_ok=True)
  fieldnames = list(rows[0])
  with open(os.path.join(workdir, "results.csv"), "w", newline="") as file:
    writer = csv.DictWriter(file, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)
  parts = [f"# {title}", "", "Command:", "", "```", command_line(), "```", ""]
  if notes:
    parts += [notes.strip(), ""]
  for heading, section_rows in sections or [("", rows)]:
    if heading:
      parts += [f"## {heading}", ""]
    parts += [markdown_table(section_rows, list(columns or section_rows[0])), ""]
  with open(os.path.join(workdir, "results.md"), "w") as file:
    file.write("\n".join(parts))


def command_line() -> str:
  """The command that is running, as `python -m module args` when run with `-m`."""
  argv = list(sys.argv)
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  if spec is not None and spec.name:
    return "python -m " + " ".join([spec.name] + [shlex.quote(a) for a in argv[1:]])
  return "python " + " ".join(shlex.quote(a) for a in argv)


def main_for(run: Callable, default_config: str) -> None:
  """Runs `run(config, workdir)` from `--config=FILE --workdir=DIR [--config.field=value]`."""
  cli.run_main(run, default_config=default_config, quiet_logs=False,
               usage="pass --workdir=DIR [--config=FILE]")


def sphere_step(loss_fn: Callable, views, params, *, lr: float, t_lr: float, scale: float = 1.0,
                key=None, beta=float("inf")):
  """One joint step of the studies: Langevin/SGD on the sphere for `views`, SGD for `params`.

  `loss_fn(views, params) -> scalar`; the views move along `scale *` their gradient
  (`scale = M` turns a mean loss into the summed potential), the mapping parameters
  (learnable t) along `t_lr *` theirs. Returns `(loss, views, params, gradients)`.
  """
  loss, (view_grads, param_grads) = jax.value_and_grad(loss_fn, argnums=(0, 1))(views, params)
  keys = [None] * len(views) if key is None else list(jax.random.split(key, len(views)))
  views = tuple(
      langevin.langevin_step(z, scale * g, key=k, lr=lr, beta=beta)
      for z, g, k in zip(views, view_grads, keys, strict=True))
  params = jax.tree.map(lambda p, g: p - t_lr * g, params, param_grads)
  return loss, views, params, (view_grads, param_grads)
