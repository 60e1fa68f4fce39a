"""Made-up CSV tables for the tests: one line per dict, the columns of every line in order."""

import csv


def write_csv(path, lines):
  """Writes `lines` (dicts) to `path` with the union of their keys, first-seen order."""
  columns = list(dict.fromkeys(key for line in lines for key in line))
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, columns)
    writer.writeheader()
    writer.writerows(lines)
