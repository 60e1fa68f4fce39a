"""MovieLens files, leave-one-out sequences and the pop100 ranking metrics (DCRec, Table 6).

Every layout is generated here from one table of ratings; the real ML-100K (inside RecBole's
wheel) is read too when `TFCL_JAX_MOVIELENS` names a folder or file that holds it.
"""

from __future__ import annotations

import collections
import os
import zipfile

import numpy as np
import pytest

from tfcl_jax.data import movielens, sequences
from tfcl_jax.evaluation import ranking

RATINGS = [  # user, item, rating, timestamp
    (3, 50, 4.0, 100), (3, 51, 3.0, 90), (3, 52, 5.0, 110), (3, 50, 2.0, 120),
    (8, 51, 1.0, 5), (8, 53, 4.5, 6), (8, 50, 4.0, 7),
    (5, 53, 3.0, 50), (5, 52, 3.0, 50), (5, 51, 2.0, 40), (5, 54, 5.0, 60), (5, 55, 1.0, 61),
]


def _write(folder, layout: str) -> str:
  lines = {
      "u.data": [f"{u}\t{i}\t{int(r)}\t{t}" for u, i, r, t in RATINGS],
      "ratings.dat": [f"{u}::{i}::{int(r)}::{t}" for u, i, r, t in RATINGS],
      "ratings.csv": ["userId,movieId,rating,timestamp"]
                     + [f"{u},{i},{r},{t}" for u, i, r, t in RATINGS],
      "ml-100k.inter": ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
                       + [f"{u}\t{i}\t{r}\t{t}" for u, i, r, t in RATINGS],
  }[layout]
  path = os.path.join(folder, layout)
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return path


@pytest.mark.parametrize("layout", ["u.data", "ratings.dat", "ratings.csv", "ml-100k.inter"])
def test_every_layout_reads_the_same_ratings(tmp_path, layout):
  _write(tmp_path, layout)
  ratings = movielens.read_ratings(str(tmp_path))
  expected = np.array(RATINGS)
  np.testing.assert_array_equal(ratings.user, expected[:, 0].astype(int))
  np.testing.assert_array_equal(ratings.item, expected[:, 1].astype(int))
  np.testing.assert_array_equal(ratings.timestamp, expected[:, 3].astype(int))
  rounded = layout in ("u.data", "ratings.dat")
  np.testing.assert_allclose(ratings.rating, np.floor(expected[:, 2]) if rounded
                             else expected[:, 2])
  assert ratings.source.endswith(layout)


def test_a_wheel_or_a_folder_one_level_down_is_found(tmp_path):
  inter = _write(tmp_path, "ml-100k.inter")
  wheel = tmp_path / "wheels" / "recbole-1.2.1-py3-none-any.whl"
  wheel.parent.mkdir()
  with zipfile.ZipFile(wheel, "w") as archive:
    archive.write(inter, "recbole/dataset_example/ml-100k/ml-100k.inter")
  os.remove(inter)
  for path in (str(wheel), str(tmp_path)):
    ratings = movielens.read_ratings(path)
    assert len(ratings) == len(RATINGS)
    assert ratings.source.endswith(":recbole/dataset_example/ml-100k/ml-100k.inter")
  nested = tmp_path / "nested"
  (nested / "ml-1m").mkdir(parents=True)
  _write(nested / "ml-1m", "ratings.dat")
  assert movielens.find_ratings_file(str(nested)).endswith(os.path.join("ml-1m", "ratings.dat"))


def test_missing_and_malformed_files_name_the_file_the_line_and_the_fix(tmp_path):
  with pytest.raises(movielens.RatingsNotFoundError, match="--fetch DIR"):
    movielens.read_ratings(str(tmp_path / "nowhere"))
  with pytest.raises(movielens.RatingsNotFoundError, match="no ratings file"):
    movielens.read_ratings(str(tmp_path))
  bad = {
      "u.data": ("1\t2\t3\t4\n1\t2\t3\n", r"u.data, line 2: expected 4 fields"),
      "ratings.dat": ("1::2::3::4\nalice::2::3::4\n",
                      r"ratings.dat, line 2: user must be an integer, got 'alice'"),
      "ratings.csv": ("userId,movieId,stars\n1,2,3\n", r"line 1: .* lacks the timestamp"),
      "ml-100k.inter": ("user_id:token\titem_id:token\ttimestamp:float\n",
                        "has a header but no ratings"),
  }
  for name, (text, message) in bad.items():
    folder = tmp_path / name.replace(".", "_")
    folder.mkdir()
    (folder / name).write_text(text)
    with pytest.raises(ValueError, match=message):
      movielens.read_ratings(str(folder))
  (tmp_path / "empty").mkdir()
  (tmp_path / "empty" / "u.data").write_text("\n")
  with pytest.raises(ValueError, match="is empty"):
    movielens.read_ratings(str(tmp_path / "empty"))


def test_command_line_shows_and_fetch_reuses_a_wheel(tmp_path, capsys):
  inter = _write(tmp_path, "ml-100k.inter")
  with zipfile.ZipFile(tmp_path / "recbole-1.2.1-py3-none-any.whl", "w") as archive:
    archive.write(inter, "recbole/dataset_example/ml-100k/ml-100k.inter")
  os.remove(inter)
  assert movielens.main(["--fetch", str(tmp_path)]) == 0  # the wheel is there: no download
  out = capsys.readouterr().out
  assert "12 ratings, 3 users, 6 items" in out and f"--config.data_dir={tmp_path}" in out
  assert movielens.main(["--show", str(tmp_path / "missing")]) == 2
  assert "--fetch DIR" in capsys.readouterr().err


def _reference_split(ratings, max_length):
  """Plain-Python leave-one-out: per-user lists sorted by (time, line)."""
  users, items = sorted(set(ratings.user.tolist())), sorted(set(ratings.item.tolist()))
  item_index = {item: n + 1 for n, item in enumerate(items)}
  history = collections.defaultdict(list)
  for line, (u, i, t) in enumerate(zip(ratings.user, ratings.item, ratings.timestamp,
                                       strict=True)):
    history[int(u)].append((int(t), line, item_index[int(i)]))
  split = {"train": [], "valid": [], "test": []}
  for u_index, u in enumerate(users):
    seq = [item for _, _, item in sorted(history[u])]
    n = len(seq)
    for t in range(1, n):
      name = "test" if t == n - 1 else "valid" if t == n - 2 else "train"
      window = seq[max(0, t - max_length):t]
      split[name].append((u_index, window + [0] * (max_length - len(window)), seq[t]))
  return split


@pytest.mark.parametrize("max_length", [1, 3, 50])
def test_sequences_equal_a_plain_python_leave_one_out(max_length):
  rng = np.random.default_rng(max_length)
  size = 400
  ratings = movielens.Ratings(
      user=rng.integers(100, 130, size), item=rng.integers(1000, 1040, size),
      rating=np.ones(size, np.float32), timestamp=rng.integers(0, 50, size),  # many ties
      source="random")
  data = sequences.build_sequences(ratings, max_length=max_length, min_user_interactions=3)
  reference = _reference_split(ratings, max_length)
  for name in ("train", "valid", "test"):
    part = getattr(data, name)
    users, windows, targets = (np.array(column) for column in zip(*reference[name],
                                                                  strict=True))
    np.testing.assert_array_equal(part.users, users)
    np.testing.assert_array_equal(part.inputs(), windows)
    np.testing.assert_array_equal(part.targets, targets)
    np.testing.assert_array_equal(part.lengths, np.count_nonzero(windows, axis=1))
    index = np.arange(len(part))[::3]
    np.testing.assert_array_equal(part.inputs(index), windows[index])
  assert data.num_items == len(set(ratings.item.tolist()))
  assert data.item_counts().sum() == size and data.item_counts()[0] == 0
  np.testing.assert_array_equal(data.item_ids[1:], np.unique(ratings.item))


def test_short_users_are_refused_or_dropped():
  ratings = movielens.Ratings(user=np.array([1, 1, 1, 2, 2]), item=np.array([4, 5, 6, 4, 5]),
                              rating=np.array([5, 1, 5, 5, 5], np.float32),
                              timestamp=np.arange(5), source="small.csv")
  with pytest.raises(ValueError, match="small.csv: user 2 has 2 .* min_user_interactions=3"):
    sequences.build_sequences(ratings)
  data = sequences.build_sequences(ratings, min_user_interactions=3)
  assert data.num_users == 1 and data.user_ids.tolist() == [1]
  with pytest.raises(ValueError, match="min_user_interactions must be >= 3"):
    sequences.build_sequences(ratings, min_user_interactions=2)
  with pytest.raises(ValueError, match="user 1 has 2"):
    sequences.build_sequences(ratings, min_rating=4, min_user_interactions=None)
  with pytest.raises(ValueError, match="max_length"):
    sequences.build_sequences(ratings, max_length=0)


def test_ranks_and_metrics_equal_a_hand_computation():
  target = np.array([0.5, 0.1, 0.9, 0.3])
  negatives = np.array([[0.4, 0.6, 0.1], [0.2, 0.3, 0.0], [0.1, 0.2, 0.3], [0.3, 0.3, 0.3]])
  rank = np.asarray(ranking.target_rank(target, negatives))
  np.testing.assert_array_equal(rank, [1, 2, 0, 3])  # ties count against the target
  metrics = ranking.hit_ratio_and_ndcg(rank, ks=(1, 2, 3))
  hand = {"hr@1": 1 / 4, "hr@2": 2 / 4, "hr@3": 3 / 4,
          "ndcg@1": 1 / 4, "ndcg@2": (1 + 1 / np.log2(3)) / 4,
          "ndcg@3": (1 + 1 / np.log2(3) + 1 / np.log2(4)) / 4}
  for name, value in hand.items():
    np.testing.assert_allclose(float(metrics[name]), value, rtol=1e-6)
  with pytest.raises(ValueError, match="negative_scores"):
    ranking.target_rank(target, negatives[:2])
  with pytest.raises(ValueError, match="ks"):
    ranking.hit_ratio_and_ndcg(rank, ks=(0,))


def test_popular_negatives_exclude_the_history_and_follow_popularity():
  counts = np.array([0, 1, 2, 3, 4, 10, 0])
  history = {0: np.array([5]), 1: np.array([1, 2])}
  users = np.repeat([0, 1], 4000)
  negatives = ranking.sample_popular_negatives(
      7, users=users, user_items=history.__getitem__, item_counts=counts, num_negatives=1)[:, 0]
  for user, allowed in ((0, [1, 2, 3, 4]), (1, [3, 4, 5])):
    drawn = negatives[users == user]
    assert set(drawn.tolist()) <= set(allowed)
    expected = counts[allowed] / counts[allowed].sum()
    observed = np.array([np.mean(drawn == item) for item in allowed])
    np.testing.assert_allclose(observed, expected, atol=0.03)
  several = ranking.sample_popular_negatives(
      1, users=np.array([1] * 50), user_items=history.__getitem__, item_counts=counts,
      num_negatives=3)
  assert all(sorted(row) == [3, 4, 5] for row in several.tolist())  # distinct, all that is left
  with pytest.raises(ValueError, match="user 1 has only 3 items"):
    ranking.sample_popular_negatives(0, users=np.array([1]), user_items=history.__getitem__,
                                     item_counts=counts, num_negatives=4)


def _real_ml100k():
  path = os.environ.get("TFCL_JAX_MOVIELENS", "")
  try:
    return movielens.read_ratings(path) if path else None
  except FileNotFoundError:
    return None


@pytest.mark.movielens
@pytest.mark.skipif(_real_ml100k() is None, reason="set TFCL_JAX_MOVIELENS to ML-100K")
def test_real_movielens_100k():
  ratings = _real_ml100k()
  data = sequences.build_sequences(ratings)
  assert (len(ratings), data.num_users, data.num_items) == (100_000, 943, 1682)
  assert len(data.test) == len(data.valid) == 943
  assert len(data.train) == 100_000 - 3 * 943
  assert data.test.lengths.max() == 50
