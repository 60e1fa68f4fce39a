r"""DCRec on MovieLens-100K, the reference code's settings: the paper's Table 6 on a small release.

Get the data (RecBole's wheel, which holds ML-100K; nothing is installed):
  python -m tfcl_jax.data.movielens --fetch ~/.cache/tfcl_jax/movielens
Run: python -m experiments.dcrec --config=experiments/configs/dcrec_ml100k.py --workdir=DIR
Quick look: add --config.seeds=1 --config.epochs=1 --config.losses=free
"""

from __future__ import annotations

import ml_collections

DEFAULT_DATA_DIR = "~/.cache/tfcl_jax/movielens"


def get_config(dataset: str = "ml-100k", data_dir: str = DEFAULT_DATA_DIR
               ) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.dataset = dataset
  # A ratings file, or a folder (or RecBole wheel) holding ml-100k.inter, u.data, ratings.dat
  # or ratings.csv (`tfcl_jax.data.movielens`).
  config.data_dir = data_dir
  # Comma-separated loss specs (`tfcl_jax.losses.from_spec`): τ = 0.8 is DCRec's `cl_temp`.
  config.losses = "tau=0.8,free,tau=0.1,tau=0.5"
  config.seeds = 10
  config.seed_offset = 0
  # Preprocessing (RecBole, as DCRec's config): implicit feedback, leave-one-out.
  config.max_length = 50  # MAX_ITEM_LIST_LENGTH
  config.min_user_interactions = 3  # the fewest a leave-one-out split can use
  config.min_rating = None  # every rating is an interaction
  # Model: RecBole's Transformer defaults; DCRec's dropouts.
  config.hidden_dim = 64
  config.inner_size = 256  # the feed-forward layer's width
  config.num_layers = 2
  config.num_heads = 2
  config.hidden_dropout = 0.5
  config.attention_dropout = 0.5
  config.graph_dropout = 0.5
  config.graph_dropout_at_eval = True  # as the reference code (its graph dropout ignores eval)
  # Objective: DCRec's ML-20M settings (graphcl_coefficient, kl_weight, weight_mean, sim_group).
  config.cl_weight = 0.1
  config.kl_weight = 0.01
  config.weight_mean = 0.4
  config.top_k = 4
  # Training: Adam as RecBole's default; one evaluation of both splits per epoch.
  config.batch_size = 512
  config.learning_rate = 1e-3
  config.epochs = 20
  config.num_devices = 1  # batches are split over this many devices
  config.log_every = 50
  # Evaluation: pop100.
  config.num_negatives = 100
  # Rerunning a command continues its workdir; False refuses a workdir that holds results.
  config.resume = True
  config.progress = True
  return config
