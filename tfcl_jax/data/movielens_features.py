"""MovieLens-100K side information: users' demographics and movies' titles, years and genres.

Two-tower retrieval models (`tfcl_jax.models.towers`) read the features of each side from the
files users have, in either layout:

- RecBole's atomic files `ml-100k.user` (`user_id age gender occupation zip_code`) and
  `ml-100k.item` (`item_id movie_title release_year class`), tab-separated with a header of
  `field:type` names, titles already without their year, genres space-separated;
- GroupLens's `u.user` (`id|age|gender|occupation|zip`) and `u.item` (`id|title (year)|release
  date|video date|IMDb URL|` 19 genre flags), Latin-1;
- either inside a zip or RecBole's wheel (`python -m tfcl_jax.data.movielens --fetch DIR`).

`encode` turns both tables into integer arrays a Flax tower embeds: one index per categorical
feature (0 is "unknown"), and padded token lists for the title words and the genres.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import zipfile
from collections.abc import Sequence

import numpy as np

from tfcl_jax.data import movielens

#: Users file names searched for, in this order (RecBole's, then GroupLens').
USER_FILES = ("ml-100k.user", "u.user")
#: Items file names searched for, in this order (RecBole's, then GroupLens').
ITEM_FILES = ("ml-100k.item", "u.item")
#: GroupLens u.item's 19 genre flags, in file order.
GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
          "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
          "Romance", "Sci-Fi", "Thriller", "War", "Western")
#: Features the query (user) side can use; the id is the row's own identity.
QUERY_FEATURES = ("user_id", "age", "gender", "occupation", "zip")
#: Features the candidate (item) side can use; the id is the row's own identity.
CANDIDATE_FEATURES = ("item_id", "title", "year", "genres")
#: Age buckets of MovieLens-1M (under 18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+).
AGE_EDGES = (18, 25, 35, 45, 50, 56)


class FeaturesNotFoundError(FileNotFoundError):
  """No users or items file where one was asked for; the message names what was looked for."""


@dataclasses.dataclass(frozen=True)
class Users:
  """One row per user: `ids [U] int64` and its demographics (strings as in the file)."""

  ids: np.ndarray
  age: np.ndarray  # [U] int64 years
  gender: np.ndarray  # [U] str
  occupation: np.ndarray  # [U] str
  zip_code: np.ndarray  # [U] str
  source: str


@dataclasses.dataclass(frozen=True)
class Items:
  """One row per movie: `ids [I] int64`, title words, release year (0: unknown), genres."""

  ids: np.ndarray
  title: tuple[tuple[str, ...], ...]
  year: np.ndarray  # [I] int64
  genres: tuple[tuple[str, ...], ...]
  source: str


def _find(path: str, names: Sequence[str], what: str) -> tuple[str, str | None]:
  """`(file, zip member or None)` of the first of `names` at `path` (a file, a folder, one
  folder down, or a zip / wheel there)."""
  if os.path.isfile(path) and not zipfile.is_zipfile(path):
    return path, None
  candidates = [path] if os.path.isfile(path) else []
  if os.path.isdir(path):
    for name in names:
      for depth in ("", "*"):
        found = sorted(glob.glob(os.path.join(path, depth, name)))
        if found:
          return found[0], None
    candidates = sorted(glob.glob(os.path.join(path, "*.whl")) + glob.glob(
        os.path.join(path, "*.zip")) + glob.glob(os.path.join(path, "*", "*.zip")))
  elif not os.path.exists(path):
    raise FeaturesNotFoundError(f"MovieLens {what}: {path!r} does not exist.")
  for archive_path in candidates:
    with zipfile.ZipFile(archive_path) as archive:
      members = [m for m in archive.namelist() if os.path.basename(m) in names]
    if members:
      members.sort(key=lambda m: names.index(os.path.basename(m)))
      return archive_path, members[0]
  raise FeaturesNotFoundError(
      f"MovieLens {what}: none of {', '.join(names)} in {path!r} (also one folder down, or "
      f"in a zip or RecBole's wheel there); `{movielens.FETCH_COMMAND}` downloads ML-100K "
      "with both.")


def _read(path: str, names: Sequence[str], what: str) -> tuple[str, list[str], str]:
  file, member = _find(path, names, what)
  if member is None:
    with open(file, "rb") as f:
      raw, name, source = f.read(), os.path.basename(file), file
  else:
    with zipfile.ZipFile(file) as archive:
      raw, name, source = archive.read(member), os.path.basename(member), f"{file}:{member}"
  lines = [line for line in raw.decode("latin-1").splitlines() if line.strip()]
  if not lines:
    raise ValueError(f"{source}: the file is empty.")
  return name, lines, source


def _recbole_rows(lines: list[str], source: str, fields: Sequence[str]) -> list[dict]:
  header = [column.split(":")[0] for column in lines[0].split("\t")]
  missing = [field for field in fields if field not in header]
  if missing:
    raise ValueError(f"{source}: header {lines[0]!r} lacks {', '.join(missing)}.")
  rows = []
  for number, line in enumerate(lines[1:], start=2):
    values = line.split("\t")
    if len(values) != len(header):
      raise ValueError(f"{source}, line {number}: {len(values)} fields, expected "
                       f"{len(header)} ({line!r}).")
    rows.append(dict(zip(header, values, strict=True)))
  return rows


def _int(text: str, source: str, number: int, field: str) -> int:
  try:
    return int(text)
  except ValueError:
    raise ValueError(f"{source}, line {number}: {field} {text!r} is not an integer.") from None


def read_users(path: str) -> Users:
  """Reads the users file (`USER_FILES`) at `path`: a file, folder, zip or RecBole wheel.

  Examples:
    >>> import os, tempfile
    >>> from tfcl_jax.data import movielens_features
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "u.user"), "w") as f:
    ...   _ = f.write("1|24|M|technician|85711\\n2|53|F|other|94043\\n")
    >>> users = movielens_features.read_users(folder)
    >>> users.ids.tolist(), users.age.tolist(), users.occupation.tolist()
    ([1, 2], [24, 53], ['technician', 'other'])

  Raises:
    FeaturesNotFoundError: no users file there.
    ValueError: a malformed file (naming the file and the line).
  """
  name, lines, source = _read(path, USER_FILES, "users")
  if name.endswith(".user") and lines[0].split("\t")[0].startswith("user_id"):
    rows = _recbole_rows(lines, source, ("user_id", "age", "gender", "occupation", "zip_code"))
    numbered = enumerate(rows, start=2)
  else:
    keys = ("user_id", "age", "gender", "occupation", "zip_code")
    rows = []
    for number, line in enumerate(lines, start=1):
      values = line.split("|")
      if len(values) != len(keys):
        raise ValueError(f"{source}, line {number}: {len(values)} '|'-separated fields, "
                         f"expected {len(keys)} ({line!r}).")
      rows.append(dict(zip(keys, values, strict=True)))
    numbered = enumerate(rows, start=1)
  ids, ages = [], []
  for number, row in numbered:
    ids.append(_int(row["user_id"], source, number, "user_id"))
    ages.append(_int(row["age"], source, number, "age"))
  return Users(ids=np.asarray(ids, np.int64), age=np.asarray(ages, np.int64),
               gender=np.asarray([r["gender"] for r in rows]),
               occupation=np.asarray([r["occupation"] for r in rows]),
               zip_code=np.asarray([r["zip_code"] for r in rows]), source=source)


def _title_words(title: str) -> tuple[str, ...]:
  return tuple(word.lower() for word in title.replace(",", " ").split())


def read_items(path: str) -> Items:
  """Reads the movies file (`ITEM_FILES`) at `path`: a file, folder, zip or RecBole wheel.

  GroupLens titles lose their trailing `(year)`; words are lower-cased, commas dropped. A
  release year that is not a number is unknown (0).

  Examples:
    >>> import os, tempfile
    >>> from tfcl_jax.data import movielens_features
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "ml-100k.item"), "w") as f:
    ...   _ = f.write("item_id:token\\tmovie_title:token_seq\\trelease_year:token\\t"
    ...               "class:token_seq\\n1\\tToy Story\\t1995\\tAnimation Children's Comedy\\n")
    >>> items = movielens_features.read_items(folder)
    >>> items.ids.tolist(), items.title, items.year.tolist(), items.genres
    ([1], (('toy', 'story'),), [1995], (('Animation', "Children's", 'Comedy'),))

  Raises:
    FeaturesNotFoundError: no movies file there.
    ValueError: a malformed file (naming the file and the line).
  """
  name, lines, source = _read(path, ITEM_FILES, "items")
  ids, titles, years, genres = [], [], [], []
  if name.endswith(".item") and lines[0].split("\t")[0].startswith("item_id"):
    rows = _recbole_rows(lines, source, ("item_id", "movie_title", "release_year", "class"))
    for number, row in enumerate(rows, start=2):
      ids.append(_int(row["item_id"], source, number, "item_id"))
      titles.append(_title_words(row["movie_title"]))
      year = row["release_year"].strip()
      # Not a year: unknown (RecBole's file has "unkonwn" for movie 267, "V" for 1412).
      years.append(int(year) if year.isdigit() else 0)
      genres.append(tuple(row["class"].split()))
  else:
    for number, line in enumerate(lines, start=1):
      values = line.split("|")
      if len(values) != 5 + len(GENRES):
        raise ValueError(f"{source}, line {number}: {len(values)} '|'-separated fields, "
                         f"expected {5 + len(GENRES)} ({line!r}).")
      ids.append(_int(values[0], source, number, "movie id"))
      title = values[1].strip()
      if title.endswith(")") and title[-6:-5] == "(" and title[-5:-1].isdigit():
        title = title[:-6]
      titles.append(_title_words(title))
      date = values[2].strip()
      years.append(int(date[-4:]) if date[-4:].isdigit() else 0)
      flags = values[5:]
      genres.append(tuple(g for g, flag in zip(GENRES, flags, strict=True) if flag == "1"))
  return Items(ids=np.asarray(ids, np.int64), title=tuple(titles),
               year=np.asarray(years, np.int64), genres=tuple(genres), source=source)


@dataclasses.dataclass(frozen=True)
class Encoded:
  """One side's features as integer arrays, rows in the order of the side's `ids`.

  `categorical`: name -> `[R] int32` indices, 0 for unknown; `bags`: name -> `[R, L] int32`
  token indices, 0 for padding; `vocab_sizes`: name -> rows of its embedding table (index 0
  included).
  """

  ids: np.ndarray
  categorical: dict[str, np.ndarray]
  bags: dict[str, np.ndarray]
  vocab_sizes: dict[str, int]

  def __len__(self) -> int:
    return int(self.ids.shape[0])


def _index(values: Sequence | np.ndarray, *, unknown=None) -> tuple[np.ndarray, int]:
  """Indices 1.. of the distinct `values` (in sorted order), 0 for `unknown`, and the table
  size."""
  text = np.asarray(values, dtype=object).astype(str)
  missing = "" if unknown is None else str(unknown)
  distinct = [v for v in np.unique(text) if unknown is None or v != missing]
  kept = {value: i + 1 for i, value in enumerate(distinct)}
  return np.asarray([kept.get(v, 0) for v in text], np.int32), len(kept) + 1


def _bag(lists: Sequence[Sequence[str]], *, minimum_count: int = 1) -> tuple[np.ndarray, int]:
  """`[R, L]` indices (1..) of each row's tokens, 0-padded to the longest row; tokens seen
  fewer than `minimum_count` times overall are dropped."""
  words, counts = np.unique([w for tokens in lists for w in tokens] or [""],
                            return_counts=True)
  vocab = {w: i + 1 for i, w in enumerate(w for w, c in zip(words, counts, strict=True)
                                             if c >= minimum_count and w)}
  rows = [[vocab[w] for w in tokens if w in vocab] for tokens in lists]
  width = max(1, max(len(r) for r in rows))
  out = np.zeros((len(rows), width), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out, len(vocab) + 1


def _check_features(features: Sequence[str], allowed: Sequence[str], name: str) -> None:
  unknown = [f for f in features if f not in allowed]
  if unknown or not features:
    raise ValueError(f"{name}: unknown feature(s) {', '.join(map(repr, unknown)) or '(none)'}; "
                     f"expected a non-empty subset of {', '.join(allowed)}.")


def encode_users(users: Users, features: Sequence[str], *, ids: np.ndarray | None = None
                 ) -> Encoded:
  """The query side: `user_id`, `age` (MovieLens-1M's 7 buckets), `gender`, `occupation`,
  `zip` (its first character: the US region, or non-US).

  `ids`: the users to encode, in this order (default: the file's); a user missing from the
  file gets index 0 for every demographic.

  Raises:
    ValueError: a feature outside `QUERY_FEATURES`.
  """
  _check_features(features, QUERY_FEATURES, "query features")
  ids = users.ids if ids is None else np.asarray(ids, np.int64)
  row = {int(u): i for i, u in enumerate(users.ids)}
  where = np.asarray([row.get(int(u), -1) for u in ids])
  known = where >= 0

  def column(values, fill):
    return np.where(known, np.asarray(values)[np.maximum(where, 0)], fill)

  sources = {
      "age": lambda: column(np.digitize(users.age, AGE_EDGES), -1),
      "gender": lambda: column(users.gender, ""),
      "occupation": lambda: column(users.occupation, ""),
      "zip": lambda: column(np.asarray([z[:1] if z[:1].isdigit() else "non-US"
                                        for z in users.zip_code]), ""),
  }
  categorical, sizes = {}, {}
  if "user_id" in features:
    categorical["user_id"], sizes["user_id"] = _index(ids)
  for name in features:
    if name != "user_id":
      categorical[name], sizes[name] = _index(sources[name](), unknown=-1 if name == "age"
                                              else "")
  return Encoded(ids, categorical, {}, sizes)


def encode_items(items: Items, features: Sequence[str], *, ids: np.ndarray | None = None,
                 min_word_count: int = 2) -> Encoded:
  """The candidate side: `item_id`, `title` (a bag of words seen at least `min_word_count`
  times), `year` (release decade), `genres` (a bag of genres).

  Raises:
    ValueError: a feature outside `CANDIDATE_FEATURES`.
  """
  _check_features(features, CANDIDATE_FEATURES, "candidate features")
  ids = items.ids if ids is None else np.asarray(ids, np.int64)
  row = {int(u): i for i, u in enumerate(items.ids)}
  where = [row.get(int(u), -1) for u in ids]
  categorical, bags, sizes = {}, {}, {}
  if "item_id" in features:
    categorical["item_id"], sizes["item_id"] = _index(ids)
  if "year" in features:
    decades = [items.year[i] // 10 * 10 if i >= 0 and items.year[i] > 0 else 0 for i in where]
    categorical["year"], sizes["year"] = _index(decades, unknown=0)
  if "title" in features:
    bags["title"], sizes["title"] = _bag([items.title[i] if i >= 0 else () for i in where],
                                         minimum_count=min_word_count)
  if "genres" in features:
    bags["genres"], sizes["genres"] = _bag([items.genres[i] if i >= 0 else () for i in where])
  return Encoded(ids, categorical, bags, sizes)
