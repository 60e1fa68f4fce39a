"""Two-tower retrieval: the features' readers, the splits, the towers, the objective, exact
full-catalogue ranking against a hand-made ranking, and the experiment end to end (on the real
MovieLens-100K when `TFCL_JAX_MOVIELENS` names it)."""

import os
import re
import subprocess
import sys
import zipfile

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import retrieval_ml100k
from experiments.framework import held_out, plan
from experiments.retrieval import report
from experiments.retrieval import train as experiment
from tests.helpers.marks import widest_cases
from tests.helpers.movielens_files import write_u_data
from tfcl_jax import losses
from tfcl_jax.data import interactions, movielens, movielens_features
from tfcl_jax.evaluation import ranking
from tfcl_jax.models import towers
from tfcl_jax.objectives import retrieval

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# -- files ------------------------------------------------------------------------------------

RECBOLE_USER = ("user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
                "1\t24\tM\ttechnician\t85711\n2\t53\tF\tother\t94043\n3\t17\tM\twriter\tT8H1N\n")
RECBOLE_ITEM = ("item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
                "1\tToy Story\t1995\tAnimation Children's Comedy\n"
                "2\tGoldenEye\t1995\tAction Adventure Thriller\n"
                "3\tunkonwn\tunkonwn\tunknown\n"
                "4\tToy Soldiers, The\t1991\tAction\n")
GROUPLENS_USER = "1|24|M|technician|85711\n2|53|F|other|94043\n3|17|M|writer|T8H1N\n"
FLAGS = {"Animation": 3, "Children's": 4, "Comedy": 5, "Action": 1, "Adventure": 2,
         "Thriller": 16}


def _grouplens_item(movie_id, title, date, genres):
  flags = ["0"] * 19
  for genre in genres:
    flags[FLAGS[genre]] = "1"
  return "|".join([str(movie_id), title, date, "", "http://x", *flags])


GROUPLENS_ITEM = "\n".join([
    _grouplens_item(1, "Toy Story (1995)", "01-Jan-1995", ["Animation", "Children's", "Comedy"]),
    _grouplens_item(2, "GoldenEye (1995)", "01-Jan-1995", ["Action", "Adventure", "Thriller"]),
    _grouplens_item(3, "unknown", "", []),
    _grouplens_item(4, "Toy Soldiers, The (1991)", "01-Jan-1991", ["Action"]),
]) + "\n"


def _write(folder, files):
  os.makedirs(folder, exist_ok=True)
  for name, text in files.items():
    with open(os.path.join(folder, name), "w", encoding="latin-1") as f:
      f.write(text)
  return str(folder)


@pytest.mark.parametrize("layout", ["recbole", "grouplens", "wheel"])
def test_both_layouts_read_the_same_features(tmp_path, layout):
  if layout == "grouplens":
    folder = _write(tmp_path, {"u.user": GROUPLENS_USER, "u.item": GROUPLENS_ITEM})
  else:
    folder = _write(tmp_path / "files", {"ml-100k.user": RECBOLE_USER,
                                         "ml-100k.item": RECBOLE_ITEM})
    if layout == "wheel":
      wheel = tmp_path / "w" / "recbole-1.2.1-py3-none-any.whl"
      os.makedirs(wheel.parent)
      with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("ml-100k.user", "ml-100k.item"):
          archive.write(os.path.join(folder, name), f"recbole/dataset_example/ml-100k/{name}")
      folder = str(wheel.parent)
  users = movielens_features.read_users(folder)
  items = movielens_features.read_items(folder)
  assert users.ids.tolist() == [1, 2, 3] and users.age.tolist() == [24, 53, 17]
  assert users.zip_code.tolist() == ["85711", "94043", "T8H1N"]
  assert items.ids.tolist() == [1, 2, 3, 4]
  assert items.title[0] == ("toy", "story") and items.title[3] == ("toy", "soldiers", "the")
  assert items.year.tolist() == [1995, 1995, 0, 1991]  # "unkonwn" and "" are unknown
  assert items.genres[1] == ("Action", "Adventure", "Thriller")


def test_encoding_indices(tmp_path):
  folder = _write(tmp_path, {"u.user": GROUPLENS_USER, "u.item": GROUPLENS_ITEM})
  users = movielens_features.encode_users(movielens_features.read_users(folder),
                                          ["user_id", "age", "zip"], ids=np.array([3, 1, 9]))
  assert users.categorical["user_id"].tolist() == [2, 1, 3]  # sorted ids -> 1..
  # Ages 17 and 24 fall in MovieLens-1M's first two buckets; user 9 is unknown (0).
  assert users.categorical["age"].tolist() == [1, 2, 0]
  assert users.categorical["zip"].tolist() == [2, 1, 0]  # "8" < "non-US"; unknown user 0
  items = movielens_features.encode_items(movielens_features.read_items(folder),
                                          ["item_id", "title", "year", "genres"],
                                          min_word_count=2)
  title = items.bags["title"]
  assert items.vocab_sizes["title"] == 2  # only "toy" is seen twice
  assert title[:, 0].tolist() == [1, 0, 0, 1] and title.shape[1] == 1
  assert items.categorical["year"].tolist() == [1, 1, 0, 1]  # the 1990s; unknown 0
  assert (items.bags["genres"] > 0).sum(1).tolist() == [3, 3, 0, 1]


def test_missing_files_and_unknown_features(tmp_path):
  folder = _write(tmp_path, {"u.user": GROUPLENS_USER})
  with pytest.raises(movielens_features.FeaturesNotFoundError, match="ml-100k.item, u.item"):
    movielens_features.read_items(folder)
  with pytest.raises(ValueError, match="'shoe_size'"):
    movielens_features.encode_users(movielens_features.read_users(folder), ["shoe_size"])
  _write(tmp_path / "bad", {"u.user": "1|24|M\n"})
  with pytest.raises(ValueError, match="line 1: 3 '|'-separated fields"):
    movielens_features.read_users(str(tmp_path / "bad"))


# -- splits and batches -----------------------------------------------------------------------


def _interactions(users, items, stamps):
  pairs = interactions.Pairs(np.asarray(users, np.int32), np.asarray(items, np.int32))
  return interactions.Interactions(pairs, np.asarray(stamps), np.arange(max(users) + 1),
                                   np.arange(max(items) + 1))


def test_leave_last_out_holds_each_users_latest():
  data = _interactions([0, 1, 0, 1, 0, 2], [4, 5, 6, 7, 8, 9], [5, 1, 9, 3, 9, 1])
  train, test = interactions.leave_last_out(data)
  # User 0's latest is a tie at 9: the later line (item 8) is held; user 2 has one rating.
  assert sorted(zip(test.user.tolist(), test.item.tolist(), strict=True)) == [(0, 8), (1, 7)]
  assert sorted(train.item.tolist()) == [4, 5, 6, 9]


def test_random_split_and_padded_batches():
  data = _interactions(list(range(10)) * 2, list(range(20)), range(20))
  train, test = interactions.random_split(data, train_fraction=0.75, seed=3)
  assert len(train) == 15 and len(test) == 5
  assert sorted(np.r_[train.item, test.item].tolist()) == list(range(20))
  stream = list(interactions.batches(train, batch_size=4, seed=0, start=0, num_steps=8))
  assert [int(b["valid"].sum()) for b in stream] == [4, 4, 4, 3] * 2  # ceil(15 / 4) per epoch
  first = np.concatenate([b["item"][b["valid"]] for b in stream[:4]])
  assert sorted(first.tolist()) == sorted(train.item.tolist())
  again = np.concatenate([b["item"][b["valid"]] for b in stream[4:]])
  np.testing.assert_array_equal(first, again)  # one cached order, as the tutorial's
  resumed = list(interactions.batches(train, batch_size=4, seed=0, start=5, num_steps=8))
  np.testing.assert_array_equal(resumed[0]["item"], stream[5]["item"])
  log_q = interactions.log_item_frequency(interactions.Pairs(np.zeros(4, np.int32),
                                                             np.array([0, 0, 1, 0], np.int32)),
                                          num_items=3)
  np.testing.assert_allclose(np.exp(log_q), [0.75, 0.25, 0.125], rtol=1e-6)
  users_log_q = interactions.log_user_frequency(
      interactions.Pairs(np.array([1, 1, 1, 0], np.int32), np.zeros(4, np.int32)), num_users=3)
  np.testing.assert_allclose(np.exp(users_log_q), [0.25, 0.75, 0.125], rtol=1e-6)


# -- ranking ----------------------------------------------------------------------------------


def _hand_ranks(scores, targets, users, seen):
  """The ranking by hand: sort each user's unseen items by score, worst tie position."""
  out = []
  for user, target in zip(users, targets, strict=True):
    row = scores[user]
    candidates = [j for j in range(row.size) if j == target or not seen[user, j]]
    ordered = sorted(candidates, key=lambda j: (-row[j], j == target))  # ties: target last
    out.append(ordered.index(target))
  return np.array(out)


@pytest.mark.parametrize("exclude", [False, True])
def test_rank_all_equals_a_hand_ranking(exclude):
  rng = np.random.default_rng(0)
  q = rng.normal(size=(5, 3)).astype(np.float32)
  c = rng.normal(size=(40, 3)).astype(np.float32)
  c[7] = c[3]  # an exact tie
  users, targets = rng.integers(0, 5, 60), rng.integers(0, 40, 60)
  targets[:3] = 3
  seen = rng.random((5, 40)) < 0.3 if exclude else np.zeros((5, 40), bool)
  got = ranking.rank_all(q, c, users, targets, seen=seen if exclude else None, chunk_size=16)
  want = _hand_ranks(q.astype(np.float64) @ c.T.astype(np.float64), targets, users, seen)
  np.testing.assert_array_equal(got, want)
  metrics = ranking.hit_ratio_and_ndcg(got, ks=(10,))
  assert float(metrics["hr@10"]) == pytest.approx(np.mean(want < 10))


# -- towers and objective ---------------------------------------------------------------------


def test_ids_only_tower_is_its_table_and_bags_average_their_tokens():
  tower = towers.Tower(vocab_sizes={"user_id": 6}, categorical=("user_id",), dim=4)
  ids = {"user_id": jnp.array([1, 5, 0])}
  params = tower.init(jax.random.key(0), ids)["params"]
  table = np.asarray(params["embed_user_id"]["embedding"])
  assert np.abs(table).max() <= 0.05  # Keras's uniform(-0.05, 0.05)
  np.testing.assert_array_equal(tower.apply({"params": params}, ids), table[[1, 5, 0]])
  bag = towers.Tower(vocab_sizes={"genres": 5}, bags=("genres",), dim=3, hidden_dims=(8,))
  tokens = {"genres": jnp.array([[1, 3, 0], [0, 0, 0]])}
  variables = bag.init(jax.random.key(1), tokens)
  emb = np.asarray(variables["params"]["embed_genres"]["embedding"])
  pooled = np.stack([(emb[1] + emb[3]) / 2, np.zeros(3)])  # an empty bag pools to zero
  dense = variables["params"]
  hidden = np.maximum(pooled @ dense["Dense_0"]["kernel"] + dense["Dense_0"]["bias"], 0)
  want = hidden @ dense["Dense_1"]["kernel"] + dense["Dense_1"]["bias"]
  np.testing.assert_allclose(bag.apply(variables, tokens), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("text, symmetric", widest_cases(
    ("free+logq", False),
    ("clip:tau=0.1", True),
    ("clip:free+logq", True),
    ("sigmoid/learnable=0.1/learn_b=siglip", False),
    quick=[("clip:free+logq", True), ("sigmoid/learnable=0.1/learn_b=siglip", False)]))
def test_objective_feeds_the_library_loss(text, symmetric):
  """The towers' embeddings of the batch's users and items, gathered by the objective, scored
  by the loss itself (`Loss.__call__`) with the batch's padding and log q."""
  model = towers.TwoTower(
      towers.Tower(vocab_sizes={"user_id": 5}, categorical=("user_id",), dim=8),
      towers.Tower(vocab_sizes={"item_id": 9}, categorical=("item_id",), dim=8))
  users, items = {"user_id": jnp.arange(1, 5)}, {"item_id": jnp.arange(1, 9)}
  log_q = jnp.log(jnp.linspace(0.05, 0.3, 8))
  users_log_q = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.1]))
  loss = losses.from_spec(text, num_candidates=6)
  assert getattr(loss, "symmetric", False) == symmetric  # InfoNCE's flag (CLIP's loss)
  loss_fn = retrieval.make_retrieval_loss(model, loss, user_features=users, item_features=items,
                                          log_q=log_q, users_log_q=users_log_q)
  batch = {"user": jnp.array([0, 1, 2, 3, 0, 1]), "item": jnp.array([7, 2, 2, 5, 0, 1]),
           "valid": jnp.array([1, 1, 1, 1, 1, 0], bool)}
  variables = model.init(jax.random.key(0), retrieval.gather(users, batch["user"]),
                         retrieval.gather(items, batch["item"]))
  params = {"model": variables["params"], "loss": loss.params}
  value, _ = loss_fn(params, {}, batch, jax.random.key(1), 0)
  q = np.asarray(variables["params"]["query_tower"]["embed_user_id"]["embedding"])[
      np.asarray(users["user_id"])[batch["user"]]]
  c = np.asarray(variables["params"]["candidate_tower"]["embed_item_id"]["embedding"])[
      np.asarray(items["item_id"])[batch["item"]]]
  item_log_q = np.asarray(log_q)[np.asarray(batch["item"])] if loss.logq else None
  if loss.log_q_sides == 2:  # CLIP's loss corrects each direction: items', then users' log q
    item_log_q = (item_log_q, np.asarray(users_log_q)[np.asarray(batch["user"])])
  want = loss(q, c, params=loss.params, negatives="cross", where=batch["valid"],
              reduction="sum", log_q=item_log_q)
  np.testing.assert_allclose(value, want, rtol=1e-5)
  grads = jax.grad(lambda p: loss_fn(p, {}, batch, jax.random.key(1), 0)[0])(params)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  if loss.params:
    chex.assert_trees_all_equal_shapes(grads["loss"], loss.params)


def test_the_configs_losses_are_canonical_loss_specs():
  config = retrieval_ml100k.get_config()
  config.losses = " popularity, tau=0.10+logq,clip:learnable=0.070:100, dot"
  assert report.specs_of(config) == ["popularity", "tau=0.1+logq", "clip:learnable=0.07:100",
                                         "dot"]
  for preset in retrieval_ml100k.PRESETS:  # every committed list parses
    experiment.check_config(retrieval_ml100k.get_config(preset))


# -- the experiment ---------------------------------------------------------------------------


@pytest.fixture
def tiny_config(tmp_path):
  config = retrieval_ml100k.get_config()
  config.update({"data_dir": write_u_data(tmp_path / "data", users=12, items=20, per_user=8),
                 "losses": "popularity,free,clip:learnable=0.07:100", "seeds": 2,
                 "batch_size": 16, "epochs": 2, "dim": 8, "progress": False})
  return config


def _run(config, workdir, **kwargs):
  """What `python -m experiments.retrieval` does: `check_config`, then `train_and_evaluate`."""
  experiment.check_config(config)
  return experiment.train_and_evaluate(config, workdir, **kwargs)


def test_run_writes_the_table_and_a_rerun_trains_nothing(tiny_config, tmp_path, monkeypatch):
  workdir = str(tmp_path / "work")
  rows = _run(tiny_config, workdir, command="cmd")
  assert [(r["spec"], r["seed"]) for r in rows] == [
      (spec, seed) for seed in (0, 1) for spec in ("popularity", "free",
                                                    "clip:learnable=0.07:100")]
  for row in rows:
    tops = [row[f"top@{k}"] for k in report.KS]
    assert all(0 <= a <= b <= 1 for a, b in zip(tops, tops[1:], strict=False))
    assert row["top@100"] == 1.0  # 20 movies: every one is in the top 100
  learnable = [r for r in rows if r["spec"].startswith("clip:")]
  assert all(r["scale_start"] == pytest.approx(1 / 0.07) and r["scale_max"] <= 100 for r in
             learnable)
  assert all(np.isfinite(r["scale@2"]) and r["scale@2"] == pytest.approx(r["scale_end"])
             for r in learnable)
  assert all(r["scale_max"] == max(r["scale_start"], r["scale@1"], r["scale@2"], r["scale_end"])
             for r in learnable)  # the largest value includes the last one
  with open(os.path.join(workdir, "results.md")) as f:
    markdown = f.read()
  assert "| clip:learnable=0.07:100 |" in markdown and "runs at a bound" in markdown
  assert "`free` minus each loss" in markdown
  assert os.path.exists(os.path.join(workdir, "retrieval.png"))
  for spec, scaled in (("free", False), ("clip_learnable_0.07_100", True)):  # no column of NaNs
    with open(os.path.join(workdir, "runs", spec, "seed0", "eval.csv")) as f:
      assert ("scale" in f.readline().strip().split(",")) == scaled, spec
  # Label-free scores of every trained run at 10%, 25%, 50% and the end (no LiDAR: no
  # augmentation); the popularity rows have none.
  steps = held_out.steps(rows[1]["steps"])
  for row in rows:
    has = [held_out.column(name, fraction) in row for fraction in steps
           for name in ("rankme", "alpha_req", "uniformity", "alignment", "view_top1")]
    assert all(has) if row["spec"] != "popularity" else not any(has)
    assert held_out.column("lidar", 1.0) not in row
  with open(os.path.join(workdir, "runs", "free", "seed0", held_out.FILE)) as f:
    assert [int(line.split(",")[0]) for line in f.readlines()[1:]] == sorted(
        set(steps.values()))
  monkeypatch.setattr(experiment, "train_run", lambda *a, **k: pytest.fail("retrained"))
  assert len(_run(tiny_config, workdir, command="cmd")) == 6


def test_held_out_set_pairs_each_user_once_with_one_of_its_training_items(tiny_config):
  data = experiment.load_data(tiny_config)
  model = experiment.make_model(tiny_config, data)
  users, items = experiment.tables_of(data.users), experiment.tables_of(data.items)
  params = model.init(jax.random.key(0), retrieval.gather(users, jnp.arange(2)),
                      retrieval.gather(items, jnp.arange(2)))["params"]
  held = experiment.held_out_set(model, data)(params)
  queries = np.asarray(model.apply({"params": params}, users, method=model.embed_queries))
  candidates = np.asarray(model.apply({"params": params}, items, method=model.embed_candidates))
  np.testing.assert_allclose(held.embeddings, candidates, rtol=1e-6)  # 20 items: every one
  assert held.views is None and held.first.shape == (data.num_users, 8)
  trained = set(zip(data.train.user.tolist(), data.train.item.tolist(), strict=True))
  for first, second in zip(np.asarray(held.first), np.asarray(held.second), strict=True):
    (user,) = np.flatnonzero(np.all(np.isclose(queries, first), axis=1))
    item = np.flatnonzero(np.all(np.isclose(candidates, second), axis=1))
    assert any((user, i) in trained for i in item)
  found = [np.flatnonzero(np.all(np.isclose(queries, f), axis=1))[0] for f in held.first]
  assert sorted(found) == list(range(data.num_users))  # each user once


@pytest.mark.parametrize("field, value, message", [
    ("data_dir", "/nonexistent/movielens", "config.data_dir"),
    ("candidate_features", "item_id,title", "config.data_dir: MovieLens items"),
    ("query_features", "user_id,shoe_size", "config.query_features: unknown feature"),
    ("batch_size", 100_000, "config.batch_size=100000"),
    ("losses", "sigmoid/free+logq", "config.losses"),
    ("split", "temporal", "config.split"),
    ("hidden_dims", "64,x", "config.hidden_dims"),
])
def test_config_errors_name_the_field_before_training(tiny_config, tmp_path, field, value,
                                                      message):
  """Each error is a `ConfigError` (one line and exit 2 on the command line), before any run
  folder exists."""
  tiny_config[field] = value
  workdir = tmp_path / "work"
  with pytest.raises(plan.ConfigError, match=re.escape(message)):
    _run(tiny_config, str(workdir))
  assert not (workdir / "runs").exists()


def test_command_line_error_is_one_line_exit_2(tiny_config, tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "experiments.retrieval",
       "--config=experiments/configs/retrieval_ml100k.py:features",
       f"--config.data_dir={tiny_config.data_dir}", f"--workdir={tmp_path / 'w'}"],
      cwd=ROOT, capture_output=True, text=True, check=False)
  assert result.returncode == 2
  assert "config.data_dir: MovieLens" in result.stderr and "Traceback" not in result.stderr


def _real_ml100k():
  path = os.environ.get("TFCL_JAX_MOVIELENS", "")
  try:
    movielens.read_ratings(path)
    movielens_features.read_items(path)
    return path if path else None
  except (FileNotFoundError, ValueError):
    return None


@pytest.mark.movielens
@pytest.mark.skipif(_real_ml100k() is None, reason="set TFCL_JAX_MOVIELENS to ML-100K")
def test_one_epoch_on_real_movielens_100k(tmp_path):
  config = retrieval_ml100k.get_config("features")
  config.data_dir = _real_ml100k()
  config.losses = "free"
  config.seeds = 1
  config.epochs = 1
  config.batch_size = 4096
  config.progress = False
  (row,) = _run(config, str(tmp_path / "work"), command="cmd")
  data = experiment.load_data(config)
  assert (data.num_users, data.num_items, len(data.test)) == (943, 1682, 943)
  assert len(data.train) == 100_000 - 943
  assert data.items.vocab_sizes["genres"] == 20  # 19 genres and padding
  # 25 steps of feature towers already rank above chance (100 / 1682 = 0.059).
  assert row["top@100"] > 0.075 and row["steps"] == 25


def test_the_scale_section_counts_runs_at_the_solved_scales_bounds():
  # Synthetic rows: a solved scale that ends at its floor, one that reaches its top, one inside
  # the range, and a learnt scale at CLIP's cap of 100.
  config = retrieval_ml100k.get_config()
  nan = float("nan")
  base = {**{f"top@{k}": 0.5 for k in report.KS}, "ndcg@10": 0.1, "train_seconds": 1.0}
  rows = [
      dict(base, spec="free", seed=0, scale_start=nan, scale_end=nan, scale_max=nan),
      dict(base, spec="accuracy_free", seed=0, scale_start=0.03, scale_end=0.01, scale_max=0.04),
      dict(base, spec="accuracy_free", seed=1, scale_start=0.03, scale_end=0.02, scale_max=0.04),
      dict(base, spec="calibrated_free", seed=0, scale_start=1.0, scale_end=50.0,
           scale_max=100.0),
      dict(base, spec="learnable=0.07:100", seed=0, scale_start=14.29, scale_end=100.0,
           scale_max=100.0),
  ]
  markdown = report.table(rows, [r["spec"] for r in rows], config=config, command="cmd")
  lines = {line.split(" | ")[0].strip("| "): line for line in markdown.splitlines()
           if line.startswith("| ") and line.count("|") == 6}
  assert lines["accuracy_free"].endswith("| 1/2 |")  # seed 0 ends at the floor 0.01
  assert lines["calibrated_free"].endswith("| 1/1 |")  # reaches the top, 100
  assert lines["learnable=0.07:100"].endswith("| 1/1 |")  # at the mapping's cap
  assert "free" not in lines  # no scale: not in the section
