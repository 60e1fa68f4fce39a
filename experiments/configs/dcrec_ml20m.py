r"""DCRec on MovieLens-20M (GroupLens `ratings.csv`): the paper's Table 6 dataset and settings.

Run: python -m experiments.dcrec --config=experiments/configs/dcrec_ml20m.py --workdir=DIR
  --config.data_dir=FOLDER_WITH_ratings.csv
"""

from __future__ import annotations

from experiments.configs import dcrec_ml100k


def get_config():
  config = dcrec_ml100k.get_config(dataset="ml-20m", data_dir="~/.cache/tfcl_jax/ml-20m")
  config.losses = "tau=0.8,free"  # the paper's two columns
  # 20 M training examples: on several accelerators pass --config.num_devices=N to split
  # each batch of 512 over them.
  return config
