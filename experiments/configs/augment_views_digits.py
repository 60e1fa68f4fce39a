"""Two views per image, drawn by `tfcl_jax.augment.two_views`, shown and summarised (digits).

Run:
  python -m experiments.augment_views --config=experiments/configs/augment_views_digits.py \
    --workdir=/tmp/views
Other datasets (TFDS, prepared as in `tfcl_jax.data`):
  ... --config.dataset=cifar10 --config.data_dir=DATA_DIR
"""

from __future__ import annotations

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.dataset = "digits"
  config.data_dir = ""  # TFDS data directory; "" = TFDS's default (digits needs none)
  config.split = ""  # "" = the dataset's train split
  config.recipe = ""  # "" = the dataset's recipe (tfcl_jax.data.get_info)
  config.view_size = 0  # 0 = the dataset's view size
  config.num_images = 8  # images shown (the first of the statistics batch), one row each
  config.num_pairs = 3  # view pairs per image (columns: original, then pairs)
  config.stats_images = 512  # images whose views give the pixel statistics
  config.seed = 0
  return config
