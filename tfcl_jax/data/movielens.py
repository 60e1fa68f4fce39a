"""MovieLens ratings, read from the files users have, for sequential recommendation (Table 6).

The paper's Table 6 trains DCRec on MovieLens-20M. The same code reads every MovieLens release
and layout people keep on disk:

- `ml-100k.inter`, RecBole's atomic file: a header of `field:type` names (`user_id:token`,
  `item_id:token`, `rating:float`, `timestamp:float`), tab-separated;
- `u.data`, GroupLens ML-100K: `user item rating timestamp`, tab-separated, no header;
- `ratings.dat`, GroupLens ML-1M and ML-10M: `user::item::rating::timestamp`;
- `ratings.csv`, GroupLens ML-20M, ML-25M and later: header `userId,movieId,rating,timestamp`;
- `recbole-*.whl` or any zip: its first member with one of the names above.

ML-100K ships inside RecBole's wheel; `python -m tfcl_jax.data.movielens --fetch DIR` downloads
that wheel (`pip download --no-deps recbole==1.2.1`, no dependency installed) into `DIR`, and
`read_ratings(DIR)` reads ML-100K straight out of it. The MovieLens licence forbids
redistribution: the project never contains the data.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import io
import os
import subprocess
import sys
import zipfile

import numpy as np

#: The wheel that `fetch` downloads; its package data holds MovieLens-100K.
RECBOLE_REQUIREMENT = "recbole==1.2.1"
#: The command that downloads MovieLens-100K, named by the errors of a missing ratings file.
FETCH_COMMAND = "python -m tfcl_jax.data.movielens --fetch DIR"
#: File names searched for, in this order, in a folder (also one level down) or a zip.
FILE_NAMES = ("ml-100k.inter", "u.data", "ratings.dat", "ratings.csv")
_RECBOLE_FIELDS = {"user_id": "user", "item_id": "item", "rating": "rating",
                   "timestamp": "timestamp"}
_CSV_FIELDS = {"userid": "user", "movieid": "item", "itemid": "item", "rating": "rating",
               "timestamp": "timestamp"}


class RatingsNotFoundError(FileNotFoundError):
  """No MovieLens ratings file where one was asked for; the message says how to get one."""


@dataclasses.dataclass(frozen=True)
class Ratings:
  """One MovieLens ratings file as host arrays, one entry per line, in file order.

  Attributes:
    user: `[R] int64` user ids as written in the file.
    item: `[R] int64` item (movie) ids as written in the file.
    rating: `[R] float32` the explicit rating (unused by implicit-feedback models).
    timestamp: `[R] int64` seconds since the epoch.
    source: the file read (`wheel.whl:member` for a zip member).
  """

  user: np.ndarray
  item: np.ndarray
  rating: np.ndarray
  timestamp: np.ndarray
  source: str

  def __len__(self) -> int:
    return int(self.user.shape[0])


def find_ratings_file(path: str) -> str:
  """The ratings file `read_ratings(path)` reads: `path` itself, or the first of `FILE_NAMES`
  (or a RecBole wheel) in the folder `path` or one level below it.

  Raises:
    RatingsNotFoundError: nothing readable there; the message names `FETCH_COMMAND`.
  """
  if os.path.isfile(path):
    return path
  if not os.path.isdir(path):
    raise RatingsNotFoundError(
        f"MovieLens data: {path!r} does not exist. Pass the folder (or file) that holds "
        f"one of {', '.join(FILE_NAMES)} or RecBole's wheel; `{FETCH_COMMAND}` downloads "
        "ML-100K (inside RecBole's wheel) into DIR.")
  for pattern in (*FILE_NAMES, "recbole-*.whl"):
    for depth in ("", "*"):
      found = sorted(glob.glob(os.path.join(path, depth, pattern)))
      if found:
        return found[0]
  raise RatingsNotFoundError(
      f"MovieLens data: no ratings file in {path!r} (looked for {', '.join(FILE_NAMES)} and "
      f"recbole-*.whl, also one folder down). `{FETCH_COMMAND}` downloads ML-100K into DIR.")


def read_ratings(path: str) -> Ratings:
  """Reads a MovieLens ratings file (any layout of the module's table) into `Ratings`.

  Examples:
    >>> import os, tempfile
    >>> from tfcl_jax.data import movielens
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "u.data"), "w") as f:
    ...   _ = f.write("1\\t10\\t4\\t881250949\\n1\\t20\\t3\\t881250950\\n2\\t10\\t5\\t881250951\\n")
    >>> ratings = movielens.read_ratings(folder)
    >>> ratings.user.tolist(), ratings.item.tolist(), len(ratings)
    ([1, 1, 2], [10, 20, 10], 3)

  Args:
    path: a ratings file, a zip or wheel holding one, or a folder holding either.

  Raises:
    RatingsNotFoundError: no ratings file at `path`.
    ValueError: an empty file, a header without the needed columns, or a line with the wrong
      number of fields or a non-numeric id (the message names the file and the line).
  """
  path = find_ratings_file(path)
  if zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as archive:
      members = [name for name in archive.namelist()
                 if os.path.basename(name) in FILE_NAMES]
      if not members:
        raise RatingsNotFoundError(
            f"MovieLens data: the zip {path!r} holds none of {', '.join(FILE_NAMES)}.")
      member = sorted(members, key=lambda n: FILE_NAMES.index(os.path.basename(n)))[0]
      text = archive.read(member).decode("utf-8")
    return _parse(text, name=os.path.basename(member), source=f"{path}:{member}")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  return _parse(text, name=os.path.basename(path), source=path)


def _parse(text: str, *, name: str, source: str) -> Ratings:
  lines = text.splitlines()
  if not any(line.strip() for line in lines):
    raise ValueError(f"MovieLens ratings file {source} is empty.")
  if name.endswith(".inter"):
    return _parse_table(lines, source=source, separator="\t", header=True,
                        fields=_RECBOLE_FIELDS, key=lambda h: h.split(":")[0].strip())
  if name.endswith(".csv"):
    return _parse_table(lines, source=source, separator=",", header=True,
                        fields=_CSV_FIELDS, key=lambda h: h.strip().lower())
  separator = "::" if name.endswith(".dat") else "\t"
  return _parse_table(lines, source=source, separator=separator, header=False,
                      fields=None, key=None)


def _parse_table(lines, *, source, separator, header, fields, key) -> Ratings:
  order = ("user", "item", "rating", "timestamp")
  first = 0
  if header:
    names = [key(h) for h in lines[0].split(separator)]
    columns = {fields[n]: i for i, n in enumerate(names) if n in fields}
    missing = [c for c in ("user", "item", "timestamp") if c not in columns]
    if missing:
      raise ValueError(
          f"{source}, line 1: the header {lines[0]!r} lacks the {', '.join(missing)} "
          f"column(s); expected the fields {', '.join(k for k in fields)}.")
    width, first = len(names), 1
  else:
    columns, width = {c: i for i, c in enumerate(order)}, 4
  values = {c: [] for c in order}
  for number, line in enumerate(lines[first:], start=first + 1):
    if not line.strip():
      continue
    parts = line.split(separator)
    if len(parts) != width:
      raise ValueError(f"{source}, line {number}: expected {width} fields separated by "
                       f"{separator!r}, got {len(parts)}: {line!r}.")
    for column in order:
      if column not in columns:
        continue
      cell = parts[columns[column]].strip()
      try:
        values[column].append(float(cell) if column == "rating" else int(float(cell)))
      except ValueError:
        kind = "a number" if column == "rating" else "an integer"
        raise ValueError(f"{source}, line {number}: {column} must be {kind}, got {cell!r}."
                         ) from None
  count = len(values["user"])
  if count == 0:
    raise ValueError(f"MovieLens ratings file {source} has a header but no ratings.")
  rating = (np.asarray(values["rating"], np.float32) if values["rating"]
            else np.ones(count, np.float32))
  return Ratings(user=np.asarray(values["user"], np.int64),
                 item=np.asarray(values["item"], np.int64), rating=rating,
                 timestamp=np.asarray(values["timestamp"], np.int64), source=source)


def fetch(directory: str) -> str:
  """Downloads RecBole's wheel (which holds ML-100K) into `directory`; returns its path.

  Runs `pip download --no-deps recbole==1.2.1`: nothing is installed, and only PyPI (or the
  package index pip is configured with) is contacted.
  """
  os.makedirs(directory, exist_ok=True)
  existing = sorted(glob.glob(os.path.join(directory, "recbole-*.whl")))
  if existing:
    return existing[0]
  subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                  RECBOLE_REQUIREMENT, "-d", directory], check=True)
  found = sorted(glob.glob(os.path.join(directory, "recbole-*.whl")))
  if not found:
    raise RatingsNotFoundError(f"pip download {RECBOLE_REQUIREMENT} left no wheel in "
                               f"{directory!r}.")
  return found[0]


def _summary(ratings: Ratings) -> str:
  out = io.StringIO()
  out.write(f"{ratings.source}: {len(ratings)} ratings, {np.unique(ratings.user).size} users, "
            f"{np.unique(ratings.item).size} items\n")
  return out.getvalue()


def main(argv=None) -> int:
  """`python -m tfcl_jax.data.movielens --fetch DIR | --show PATH`; returns the exit status."""
  parser = argparse.ArgumentParser(
      prog="python -m tfcl_jax.data.movielens",
      description="Get MovieLens-100K (inside RecBole's wheel) or summarise a ratings file.")
  group = parser.add_mutually_exclusive_group(required=True)
  group.add_argument("--fetch", metavar="DIR", help="download RecBole's wheel into DIR")
  group.add_argument("--show", metavar="PATH", help="read PATH and print its size")
  args = parser.parse_args(argv)
  try:
    if args.fetch:
      wheel = fetch(args.fetch)
      sys.stdout.write(_summary(read_ratings(wheel)))
      sys.stdout.write(f"use it with --config.data_dir={args.fetch}\n")
    else:
      sys.stdout.write(_summary(read_ratings(args.show)))
  except (FileNotFoundError, ValueError, subprocess.CalledProcessError) as error:
    sys.stderr.write(f"error: {error}\n")
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
