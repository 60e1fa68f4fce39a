"""MSC on CIFAR-10 with the paper's recipe (Section 5.3): 25 epochs, SGD lr 1e-5, wd 5e-5, batch 32.

A GPU run. Prepare CIFAR-10 once (see `tfcl_jax.data`). The paper fine-tunes an ImageNet
ResNet-152; with converted torchvision ResNet-18 weights (`tfcl_jax.anomaly.torchvision_resnet`):
  python -m experiments.msc --config=experiments/configs/msc_cifar10.py --workdir=/tmp/msc_cifar \
    --config.init_checkpoint=/path/resnet18_imagenet --config.backbone=resnet18_imagenet \
    --config.view_size=224 --config.recipe=simclr \
    --config.frozen=Conv_0,BatchNorm_0,BasicBlock_0,BasicBlock_1,BasicBlock_2,BasicBlock_3
Without `init_checkpoint`, the encoder (ResNet-18, CIFAR stem) is first pretrained with SimCLR on
CIFAR-10's training images (experiments/configs/simclr_cifar10.py, 800 epochs):
  python -m experiments.msc --config=experiments/configs/msc_cifar10.py --workdir=/tmp/msc_cifar
"""

from __future__ import annotations

import ml_collections

from experiments.configs import msc_digits, simclr_cifar10


def get_config() -> ml_collections.ConfigDict:
  config = msc_digits.get_config()
  config.dataset = "cifar10"
  config.backbone = "resnet18_cifar"
  config.width = 0
  config.seeds = 5  # Table 4: the average of five runs
  config.learning_rate = 1e-5
  config.epochs = 25
  config.batch_size = 32
  config.weight_decay = 5e-5
  config.log_every = 50
  pretrain = simclr_cifar10.get_config()
  pretrain.losses = "tau=0.2"
  pretrain.seeds = 1
  config.pretrain = pretrain
  return config
