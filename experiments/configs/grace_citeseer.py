r"""GRACE on CiteSeer, PyGCL's recipe: the paper's Table 3 (Section 5.2).

Run: python -m experiments.grace --config=experiments/configs/grace_citeseer.py --workdir=DIR
Quick look: add --config.seeds=1 --config.epochs=50
"""

from __future__ import annotations

import os

import ml_collections

# CI and this machine keep the raw Planetoid files beside the repository.
DEFAULT_DATA_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data", "planetoid")


def get_config(dataset: str = "citeseer") -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.dataset = dataset
  config.data_dir = os.path.normpath(DEFAULT_DATA_DIR)
  config.mappings = "tau=0.1,tau=0.25,tau=0.5,tau=1,free"  # comma-separated mapping specs
  config.seeds = 20
  config.seed_offset = 0
  config.epochs = 1000
  config.learning_rate = 0.01
  config.num_layers = 2
  config.hidden_dim = 32
  config.projection_dim = 32
  config.edge_rate = 0.3  # EdgeRemoving(pe)
  config.feature_rate = 0.3  # FeatureMasking(pf)
  # Tile side of the loss (None: automatic; the same loss for every value).
  config.block_size = None
  config.num_devices = 1  # full batch is replicated: extra devices would repeat the same work
  config.checkpoint_every = 250  # a killed run resumes from here
  config.log_every = 50
  # PyGCL LREvaluator.
  config.eval_epochs = 5000
  config.eval_learning_rate = 0.01
  config.eval_interval = 20
  config.train_ratio = 0.1
  config.val_ratio = 0.1
  return config
