"""Generated blocks inside hand-written pages: the text between a line that names the block and
the command that writes it, and an end line, rewritten by that command and checked against it.

A block reads, in the page:

  <!-- NAME, written by COMMAND -->
  ...what COMMAND writes for NAME...
  <!-- END -->

`python -m docs.make_specs` writes the spec tables of `docs/specs.md` this way, and `python -m
experiments.regenerate` every number the pages quote from the regret study.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping

#: The width generated prose is wrapped to, as the pages' hand-written prose is.
WIDTH = 100


def start_line(name: str, command: str) -> str:
  """The line a block of `name` written by `command` starts with."""
  return f"<!-- {name}, written by {command} -->"


def names(page: str, command: str) -> list[str]:
  """The names of the blocks in `page` that `command` writes, in page order.

  Examples:
    >>> from experiments.framework import blocks
    >>> page = "a\\n<!-- x, written by tool -->\\nold\\n<!-- end of x -->\\nb\\n"
    >>> blocks.names(page, "tool"), blocks.names(page, "other")
    (['x'], [])
  """
  pattern = re.escape(start_line("NAME", command)).replace("NAME", "(.+?)")
  return re.findall("^" + pattern + "$", page, flags=re.M)


def fill(page: str, texts: Mapping[str, str], *, command: str, end: str) -> str:
  """`page` with the block of each name of `texts` holding that text.

  Args:
    page: the page's text.
    texts: name -> the block's text (ending with a newline, or empty).
    command: the command that writes the blocks (their start lines name it).
    end: the line that ends a block; `{name}` in it stands for the block's name.

  Raises:
    ValueError: a name of `texts` without its block in `page`, saying which lines to add.

  Examples:
    >>> from experiments.framework import blocks
    >>> page = "a\\n<!-- x, written by tool -->\\nold\\n<!-- end of x -->\\nb\\n"
    >>> print(blocks.fill(page, {"x": "new\\n"}, command="tool", end="<!-- end of {name} -->"))
    a
    <!-- x, written by tool -->
    new
    <!-- end of x -->
    b
    <BLANKLINE>
  """
  for name, text in texts.items():
    start, stop = start_line(name, command) + "\n", end.format(name=name)
    found = re.search(re.escape(start) + ".*?^" + re.escape(stop) + "$", page, flags=re.S | re.M)
    if found is None:
      raise ValueError(f"no block {name!r}: add the lines {start.strip()} and {stop}.")
    page = page[:found.start()] + start + text + stop + page[found.end():]
  return page


def wrap(text: str, width: int = WIDTH) -> str:
  """Markdown `text` with each paragraph and list item wrapped to `width` (a list item's lines
  indented under its text); table rows, headings and blank lines kept as they are.

  Examples:
    >>> from experiments.framework import blocks
    >>> print(blocks.wrap("- one two three four\\n| a | b |\\n", width=12), end="")
    - one two
      three four
    | a | b |
  """
  out = []
  for line in text.split("\n"):
    if not line or line.startswith(("|", "#", "<!--")) or len(line) <= width:
      out.append(line)
    elif line.startswith("- "):
      out += textwrap.wrap(line, width, subsequent_indent="  ", break_long_words=False,
                           break_on_hyphens=False)
    else:
      out += textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False)
  return "\n".join(out)
