"""Supervised contrastive (SupCon) pretraining on MNIST-1D: SimCLR's views, encoder and recipe
(`simclr_mnist1d.py`), positives from the labels; τ = 0.1 is SupCon's recommended temperature.

Run: as `supcon_digits.py` with `--config=experiments/configs/supcon_mnist1d.py`; the committed
tables (`experiments/results/supcon_mnist1d[_ntxent].md`) record their commands.
"""

from __future__ import annotations

import ml_collections

from experiments.configs import simclr_mnist1d, supcon_digits


def get_config() -> ml_collections.ConfigDict:
  return supcon_digits.supcon(simclr_mnist1d.get_config())
