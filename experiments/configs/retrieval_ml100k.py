r"""Two-tower retrieval on MovieLens-100K: temperature where recommender and CLIP users set it.

Get the data (RecBole's wheel, which holds ML-100K's ratings, users and movies):
  python -m tfcl_jax.data.movielens --fetch ~/.cache/tfcl_jax/movielens

The tutorial protocol (TensorFlow Recommenders' "Recommending movies: retrieval": ids only,
32-wide embeddings, 80/20 random split with seed 42, Adagrad 0.1, batches of 8192, 3 epochs,
summed loss, top-k accuracy against all movies), every loss, 10 seeds:
  python -m experiments.retrieval --config=experiments/configs/retrieval_ml100k.py \
    --workdir=DIR
Feature towers (user demographics; title words, decade, genres), leave-last-out split, each
user's training movies left out of the ranking, Adam, 20 epochs of batches of 1024:
  python -m experiments.retrieval --config=experiments/configs/retrieval_ml100k.py:features \
    --workdir=DIR
Quick look: add --config.seeds=1 --config.losses=free,clip:learnable=0.07:100
"""

from __future__ import annotations

import ml_collections

DEFAULT_DATA_DIR = "~/.cache/tfcl_jax/movielens"
TAUS = (0.05, 0.1, 0.2, 0.5, 1)
PRESETS = ("tutorial", "features")


def tutorial_losses() -> str:
  """Every loss of the tutorial protocol's table (loss specs, `tfcl_jax.losses.from_spec`),
  after `popularity`, the untrained ranking by training counts; τ = 2 brackets the best τ of
  the grid from above."""
  taus = [f"tau={t}" for t in (*TAUS, 2)]
  return ",".join([
      "popularity", "dot", *taus, "free", "learnable=0.07:100", "dynamic=0.1:0.2",
      *[f"clip:{t}" for t in taus], "clip:free", "clip:learnable=0.07:100",
      "clip:dynamic=0.1:0.2",
      "sigmoid/learnable=0.1/learn_b=siglip", "sigmoid/free/learn_b=prior",
      "dot+logq", "tau=0.1+logq", "free+logq",
  ])


def get_config(preset: str = "tutorial") -> ml_collections.ConfigDict:
  if preset not in PRESETS:
    raise ValueError(f"retrieval_ml100k preset must be one of {PRESETS}, got {preset!r}.")
  config = ml_collections.ConfigDict()
  config.dataset = "ml-100k"
  config.preset = preset
  # A folder (or RecBole wheel) with the ratings (`tfcl_jax.data.movielens`) and, for feature
  # towers, the users and movies files (`tfcl_jax.data.movielens_features`).
  config.data_dir = DEFAULT_DATA_DIR
  config.losses = tutorial_losses()
  config.seeds = 10
  config.seed_offset = 0
  # Split: "random" (train_fraction of the ratings, one permutation of split_seed) or "last"
  # (each user's latest rating held out). exclude_seen: leave each user's training movies
  # out of its ranking (the tutorial does not).
  config.split = "random"
  config.train_fraction = 0.8
  config.split_seed = 42
  config.exclude_seen = False
  # Towers: comma lists of features (`QUERY_FEATURES`, `CANDIDATE_FEATURES`), the embedding
  # width, and a comma list of hidden layer widths ("" none: an ids-only tower is its
  # embedding table).
  config.query_features = "user_id"
  config.candidate_features = "item_id"
  config.dim = 32
  config.hidden_dims = ""
  config.min_word_count = 2  # title words seen fewer times share no embedding
  # Training: the tutorial's Adagrad (Keras defaults), summed loss, one shuffle reused.
  config.optimizer = "adagrad"
  config.learning_rate = 0.1
  config.weight_decay = 0.0
  config.batch_size = 8192
  config.epochs = 3
  config.reshuffle = False  # the tutorial caches one shuffled order for every epoch
  config.reduction = "sum"
  config.num_devices = 1
  config.log_every = 1
  # Rerunning a command continues its workdir; False refuses a workdir that holds results.
  config.resume = True
  config.progress = True
  if preset == "features":
    config.split = "last"
    config.exclude_seen = True
    config.query_features = "user_id,age,gender,occupation,zip"
    config.candidate_features = "item_id,title,year,genres"
    config.hidden_dims = "64"
    config.optimizer = "adam"
    config.learning_rate = 1e-3
    config.batch_size = 1024
    config.epochs = 20
    config.reshuffle = True
    config.reduction = "mean"
    config.log_every = 10
    config.losses = ",".join([
        "popularity", "dot", *[f"tau={t}" for t in TAUS], "free", "learnable=0.07:100",
        "clip:tau=0.1", "clip:free", "clip:learnable=0.07:100",
        "sigmoid/learnable=0.1/learn_b=siglip", "free+logq"])
  return config
