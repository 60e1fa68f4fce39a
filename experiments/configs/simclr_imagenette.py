"""The paper's image experiment (Section 5.1, Table 2): SimCLR, ResNet-18, Imagenette 160 px.

Recipe (LightlySSL's benchmark, as in the paper): resize 160, crop 128, 800 epochs, SGD momentum
0.9, lr 0.06 with cosine annealing, weight decay 5e-4, batch 256, kNN top-1 (k = 200, tau 0.1).
Prepare: tfds build imagenette/160px-v2 --file_format=array_record (see tfcl_jax.data). Run:
  python -m experiments.simclr --config=experiments/configs/simclr_imagenette.py --workdir=/tmp/inet
"""

from __future__ import annotations

import ml_collections

from experiments.configs import simclr_cifar10


def get_config() -> ml_collections.ConfigDict:
  config = simclr_cifar10.get_config()
  config.dataset = "imagenette"
  config.backbone = "resnet18_imagenet"
  config.view_size = 128
  return config
