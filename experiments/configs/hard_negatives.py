r"""Hard-negative study: fixed, learnable and free temperature as hard negatives take over.

Run (a couple of minutes on 2 cores):
  python -m experiments.hard_negatives --config=experiments/configs/hard_negatives.py \
    --workdir=/tmp/hard_negatives
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # Mapping specs (`tfcl_jax.mappings.from_spec`), one InfoNCE each.
  config.mappings = ("tau=0.1", "tau=0.5", "learnable=0.07", "dynamic=0.1:0.2", "free")
  config.hard_fractions = (0.0, 0.25, 0.5, 0.75, 1.0)
  config.seeds = 8
  config.seed = 0
  config.instances = 32
  config.num_negatives = 16  # K per anchor.
  config.dim = 32
  config.s_pos = 0.5  # initial anchor-positive cosine.
  config.hard_gap = 0.1  # hard negatives start at cosine in [s_pos - hard_gap, s_pos].
  config.easy_spread = 0.1  # easy negatives start at cosine in [-easy_spread, easy_spread].
  config.margin = 1.0  # separated: positive cosine - max negative cosine >= margin.
  config.steps = 400
  config.learning_rate = 0.05
  config.t_learning_rate = 0.05
  # > 0: the loss sees every vector perturbed afresh each step (augmented views), as in
  # experiments/results/hard_negatives_augmented.md (--config.augment=0.3).
  config.augment = 0.0
  config.plots = True
  return config
