"""SimCLR on CIFAR-10 with ResNet-18 (CIFAR stem), SimCLR's CIFAR augmentations; a GPU/TPU run.

Prepare the data once: `pip install "tfcl_jax[data]"` and see `tfcl_jax.data` (tfds build cifar10
--file_format=array_record). Run:
  python -m experiments.simclr --config=experiments/configs/simclr_cifar10.py --workdir=/tmp/cifar
"""

from __future__ import annotations

import ml_collections

from experiments.configs import simclr_digits


def get_config() -> ml_collections.ConfigDict:
  config = simclr_digits.get_config()
  config.dataset = "cifar10"
  config.backbone = "resnet18_cifar"
  config.width = 0
  config.projection_hidden_dim = 512
  config.projection_dim = 128
  config.epochs = 800
  config.batch_size = 256
  config.learning_rate = 0.06
  config.probe_epochs = 0
  config.eval_every_epochs = 50
  config.checkpoint_every = 2000
  config.log_every = 50
  config.seeds = 1
  return config
