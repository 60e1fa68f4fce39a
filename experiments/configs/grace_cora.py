r"""GRACE on Cora, the same PyGCL recipe as `grace_citeseer.py` (the paper reports CiteSeer only).

Run: python -m experiments.grace --config=experiments/configs/grace_cora.py --workdir=DIR
"""

from __future__ import annotations

import ml_collections

from experiments.configs import grace_citeseer


def get_config() -> ml_collections.ConfigDict:
  return grace_citeseer.get_config("cora")
