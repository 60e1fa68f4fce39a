r"""GRACE on CiteSeer, PyGCL's recipe: the paper's Table 3 (Section 5.2).

Run: python -m experiments.grace --config=experiments/configs/grace_citeseer.py --workdir=DIR
Quick look: add --config.seeds=1 --config.epochs=50
"""

from __future__ import annotations

import os

import ml_collections

# The default: the raw Planetoid files in ../shared/data/planetoid beside the repository.
DEFAULT_DATA_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data", "planetoid")


def get_config(dataset: str = "citeseer") -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.dataset = dataset
  config.data_dir = os.path.normpath(DEFAULT_DATA_DIR)
  # Comma-separated loss specs (`tfcl_jax.losses.from_spec`): a mapping for InfoNCE, or
  # sigmoid/<mapping>[/b=<init> | /learn_b=<init>] for the sigmoid loss.
  config.losses = "tau=0.1,tau=0.25,tau=0.5,tau=1,free"
  config.seeds = 20
  config.seed_offset = 0
  config.epochs = 1000
  config.learning_rate = 0.01
  config.num_layers = 2
  config.hidden_dim = 32
  config.projection_hidden_dim = 32  # the head's hidden layer; its output is hidden_dim wide
  config.edge_rate = 0.3  # EdgeRemoving(pe)
  config.feature_rate = 0.3  # FeatureMasking(pf)
  # Tile side of the loss (None: automatic; the same loss for every value). 1024 (balanced to
  # 7 tiles of 951 rows) is 1.5x faster than the automatic 512 for 6654 rows of D = 32
  # (`python -m benchmarks.grace_bench --block_size 512` vs 1024).
  config.block_size = 1024
  config.num_devices = 1  # full batch is replicated: extra devices would repeat the same work
  config.checkpoint_every = 250  # a killed run resumes from here
  config.log_every = 50
  # The linear probe on the frozen embeddings: PyGCL's LREvaluator (full-batch Adam; scores
  # validation and test every probe_eval_every_epochs of its epochs).
  config.probe_epochs = 5000
  config.probe_learning_rate = 0.01
  config.probe_eval_every_epochs = 20
  config.train_fraction = 0.1
  config.val_fraction = 0.1
  # Rerunning a command continues its workdir; False refuses a workdir that holds results.
  config.resume = True
  config.progress = True
  return config
