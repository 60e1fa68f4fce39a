r"""DCRec on MovieLens-1M (GroupLens `ratings.dat`): the ML-100K recipe on a larger release.

Run: python -m experiments.dcrec --config=experiments/configs/dcrec_ml1m.py --workdir=DIR
  --config.data_dir=FOLDER_WITH_ratings.dat
"""

from __future__ import annotations

from experiments.configs import dcrec_ml100k


def get_config():
  return dcrec_ml100k.get_config(dataset="ml-1m", data_dir="~/.cache/tfcl_jax/ml-1m")
