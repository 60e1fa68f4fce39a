"""How `benchmarks/device_bench.py` reports: markdown tables printed as they come and written to
`device_bench.md`, and the cells of milliseconds, memory and ratios in them."""

from __future__ import annotations

import pathlib


def ms(seconds) -> str:
  return "-" if seconds is None else f"{1e3 * seconds:.2f}"


def cell(value) -> str:
  """`(median seconds, bytes, note)` as `"12.34 (0.52) note"` (milliseconds, GiB)."""
  if value is None:
    return "not run"
  median, memory, note = value
  text = ms(median) + ("" if memory is None else f" ({memory / 2**30:.2f})")
  return text + (f" {note}" if note else "")


def ratio(x, y) -> str:
  return "-" if x is None or y is None else f"{x / y:.2f}"


class Report:
  """Markdown tables, printed as they come and written to `folder/device_bench.md`."""

  def __init__(self, folder: str, header: str):
    self.path = pathlib.Path(folder) / "device_bench.md"
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self.parts = [f"# Device benchmark\n\n{header}\n"]
    print(header, flush=True)

  def note(self, text: str) -> None:
    print(text, flush=True)
    self.parts.append(f"\n{text}\n")
    self.path.write_text("".join(self.parts))

  def table(self, title: str, columns: list, rows: list) -> None:
    lines = [f"\n## {title}\n", "| " + " | ".join(map(str, columns)) + " |",
             "|---" * len(columns) + "|"]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    self.parts.append(text)
    self.path.write_text("".join(self.parts))
