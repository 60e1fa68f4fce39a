r"""The committed result tables rebuilt from their CSVs: `experiments/results/NAME.md` is what
the experiment's `results_markdown` makes of `NAME.csv`, followed by an optional `## Notes`
section written by hand (facts about the numbers that the CSV does not hold).

Each table records the command that made it; the experiment (`experiments.registry`), its
config (the config file, or the experiment's `default_config`, with the command's
`--config.FIELD=VALUE` overrides) and the command text come from there. A table of an
experiment's other command (`Experiment.command_tables`, e.g. `experiments.grace.probe`) is
rebuilt by that command's table, which may read other committed tables.

The regret study (`experiments.regret`: `regret.md`, `.csv`, `.png`, `regret_scales.png`) is
rebuilt after the tables, from the same CSVs, and with it every figure the pages quote from it:
the blocks of README.md and docs/*.md that this command writes (`experiments.framework.blocks`:
`<!-- NAME, written by python -m experiments.regenerate -->` up to `<!-- end of NAME -->`,
each NAME one of `experiments.regret.pages.WRITERS`).

Run: python -m experiments.regenerate            (rewrites every table's generated part)
     python -m experiments.regenerate --check    (exit 1 naming each table or page that differs)
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shlex
import sys

import ml_collections

from experiments import registry
from experiments.framework import blocks, cli, tables
from experiments.regret import pages as regret_pages
from experiments.regret import report as regret

_EXPERIMENTS = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_EXPERIMENTS)
RESULTS = os.path.join(_EXPERIMENTS, "results")
NOTES_HEADING = "\n## Notes\n"
#: The folder whose README.md and docs/*.md hold the blocks quoting the regret study.
PAGES_ROOT = _ROOT
COMMAND = "python -m experiments.regenerate"
END = "<!-- end of {name} -->"


def recorded_command(markdown: str) -> str:
  """The command a table records: `Command: \\`...\\`` or a fenced block after `Command:`."""
  inline = re.search(r"^Command: `(.+)`$", markdown, re.MULTILINE)
  if inline:
    return inline.group(1)
  block = re.search(r"^Command:\n\n```\n(.+)\n```$", markdown, re.MULTILINE)
  if block:
    return block.group(1)
  raise ValueError("the table records no command (a 'Command:' line).")


def _value(text: str, current):
  """`text` as the type of the config field's `current` value (as `--config.FIELD` reads it)."""
  if isinstance(current, bool):
    return text.lower() in ("1", "true")
  if isinstance(current, (int, float)) and not isinstance(current, bool):
    return type(current)(text)
  if isinstance(current, (tuple, list)):
    return ast.literal_eval(text)
  return text


def _module(command: str) -> str:
  args = shlex.split(command)
  if args[:3] != ["python", "-m", args[2]] or not args[2].startswith("experiments."):
    raise ValueError(f"not an experiment command: {command!r}")
  return args[2]


def config_of(command: str) -> tuple[str, ml_collections.ConfigDict]:
  """`(module, config)` of an experiment command: its `-m` module, and the config file (or the
  experiment's `default_config`) with the command's overrides."""
  module = _module(command)
  options = dict(arg[2:].split("=", 1) for arg in shlex.split(command)[3:]
                 if arg.startswith("--") and "=" in arg)
  path = options.get("config") or registry.owner(module).default_config
  if path is None:
    raise ValueError(f"{command!r} names no --config and {module} has no default config.")
  config = cli.load_config(os.path.join(_ROOT, path))
  for name, text in options.items():
    if name.startswith("config."):
      field = name[len("config."):]
      config[field] = _value(text, config[field])
  return module, config


def committed(name: str) -> tuple[list[dict], ml_collections.ConfigDict]:
  """`(rows, config)` of the committed table `results/NAME`: its CSV rows and the config of the
  command it records."""
  with open(os.path.join(RESULTS, name + ".md")) as f:
    _, config = config_of(recorded_command(f.read()))
  return tables.typed(tables.read_csv(os.path.join(RESULTS, name + ".csv"))), config


def generate(name: str) -> str:
  """The generated part of `results/NAME.md`, from `NAME.csv` and the command it records."""
  with open(os.path.join(RESULTS, name + ".md")) as f:
    command = recorded_command(f.read())
  rows = tables.typed(tables.read_csv(os.path.join(RESULTS, name + ".csv")))
  if not rows:
    raise ValueError(f"{name}.csv holds no rows.")
  module = _module(command)
  experiment = registry.owner(module)
  if module in experiment.command_tables:
    return experiment.command_tables[module](rows, command=command, name=name,
                                             committed=committed)
  if experiment.results_markdown is None:
    raise ValueError(f"{name}.md records {module}, which declares no results_markdown.")
  _, config = config_of(command)
  return experiment.results_markdown(rows, config, command)


def tables_with_csv() -> list[str]:
  """The names of the committed tables that have a CSV."""
  return sorted(name[:-3] for name in os.listdir(RESULTS) if name.endswith(".md")
                and name[:-3] != regret.NAME
                and os.path.exists(os.path.join(RESULTS, name[:-3] + ".csv")))


def split(markdown: str) -> tuple[str, str]:
  """`(generated part, notes)` of a committed table: the notes start at a `## Notes` line
  after one blank line (or are "")."""
  index = markdown.find("\n" + NOTES_HEADING)
  return (markdown, "") if index < 0 else (markdown[:index + 1], markdown[index + 2:])


def check(name: str) -> bool:
  with open(os.path.join(RESULTS, name + ".md")) as f:
    generated, _ = split(f.read())
  return generated == generate(name)


def rewrite(name: str) -> None:
  path = os.path.join(RESULTS, name + ".md")
  with open(path) as f:
    _, notes = split(f.read())
  text = generate(name) + ("\n" + notes if notes else "")  # reads the file: before opening it
  with open(path, "w") as f:
    f.write(text)


def pages(root: str | None = None) -> list[str]:
  """The pages that may hold blocks: README.md and docs/*.md under `root` (`PAGES_ROOT`)."""
  root = PAGES_ROOT if root is None else root
  docs = os.path.join(root, "docs")
  found = ([os.path.join(docs, n) for n in sorted(os.listdir(docs)) if n.endswith(".md")]
           if os.path.isdir(docs) else [])
  return [p for p in [os.path.join(root, "README.md"), *found] if os.path.exists(p)]


def rendered_pages(root: str | None = None, results: str | None = None
                   ) -> dict[str, tuple[str, str]]:
  """`{path: (page, page with its blocks written)}` of every page that holds a block.

  Raises:
    ValueError: a block name that `experiments.regret.pages` does not write, naming the page.
  """
  texts = {}
  for path in pages(root):
    with open(path) as f:
      texts[path] = f.read()
  names = {path: blocks.names(text, COMMAND) for path, text in texts.items()}
  try:
    written = regret_pages.texts(sorted({n for found in names.values() for n in found}),
                                 RESULTS if results is None else results)
  except ValueError as error:
    holders = [p for p, found in names.items() if set(found) - set(regret_pages.WRITERS)]
    raise ValueError(f"{', '.join(holders)}: {error}") from error
  return {path: (texts[path], blocks.fill(texts[path], {n: written[n] for n in found},
                                          command=COMMAND, end=END))
          for path, found in names.items() if found}


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="compare, do not write")
  parser.add_argument("names", nargs="*", help="tables (default: every one with a CSV)")
  args = parser.parse_args(argv)
  names = args.names or tables_with_csv()
  with_regret = not args.names or regret.NAME in args.names
  names = [name for name in names if name != regret.NAME]
  if args.check:
    differ = [name for name in names if not check(name)]
    for name in differ:
      print(f"{name}.md differs from what its CSV gives "
            f"(python -m experiments.regenerate {name})")
    stale = regret.differs(RESULTS) if with_regret else []
    for name in stale:
      print(f"{name} differs from what the CSVs give (python -m experiments.regenerate regret)")
    quoted = ([path for path, (old, new) in rendered_pages().items() if old != new]
              if with_regret else [])
    for path in quoted:
      print(f"{os.path.relpath(path, PAGES_ROOT)}: a block quoting the regret study differs "
            "from what the CSVs give (python -m experiments.regenerate regret)")
    sys.exit(1 if differ or stale or quoted else 0)
  for name in names:
    rewrite(name)
    print(f"wrote {os.path.join(RESULTS, name + '.md')}")
  if with_regret:
    regret.write(RESULTS)
    print(f"wrote {os.path.join(RESULTS, regret.NAME)}.md, .csv, .png and {regret.SCALES}.png")
    for path, (old, new) in rendered_pages().items():
      if new != old:
        with open(path, "w") as f:
          f.write(new)
        print(f"wrote the regret study's blocks of {path}")


if __name__ == "__main__":
  main()
