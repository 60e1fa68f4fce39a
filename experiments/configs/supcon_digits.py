"""Supervised contrastive (SupCon) pretraining on scikit-learn's 8x8 digits: SimCLR's views,
encoder and recipe (`simclr_digits.py`), positives from the labels; τ = 0.1 is SupCon's
recommended temperature.

Run (form supcon, Khosla et al.'s L_out):
  python -m experiments.simclr --config=experiments/configs/supcon_digits.py --workdir=/tmp/sd
The losses of the committed tables (5 seeds), form supcon and form ntxent:
  python -m experiments.simclr --config=experiments/configs/supcon_digits.py \
    --workdir=/tmp/supcon_digits \
    --config.losses=tau=0.05,tau=0.1,tau=0.5,tau=1,free,learnable --config.seeds=5
  python -m experiments.simclr --config=experiments/configs/supcon_digits.py \
    --workdir=/tmp/supcon_digits_ntxent --config.form=ntxent \
    --config.losses=tau=0.05,tau=0.1,tau=0.5,tau=1,free,learnable --config.seeds=5
"""

from __future__ import annotations

import ml_collections

from experiments.configs import simclr_digits


def supcon(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` (a SimCLR config) training SupCon instead, at SupCon's τ = 0.1 against free."""
  config.objective = "supcon"
  # "supcon": every other view in the denominator (Khosla et al. 2020, Eq. 2);
  # "ntxent": each positive pair against the anchor's negatives only.
  config.form = "supcon"
  config.losses = "tau=0.1,free"
  return config


def get_config() -> ml_collections.ConfigDict:
  return supcon(simclr_digits.get_config())
