"""MSC anomaly detection on scikit-learn's 8x8 digits: Table 4's protocol, small, on a CPU.

Pretrains a small CNN without labels (SimCLR, `config.pretrain`), then MSC per normal digit for
every loss and seed. Run:
  python -m experiments.msc --config=experiments/configs/msc_digits.py --workdir=/tmp/msc_digits
With an encoder of your own (a `tfcl_jax.training` run directory or `anomaly.save_variables`):
  ... --config.init_checkpoint=/tmp/digits/runs/tau_0.1/batch_size_256/seed0
"""

from __future__ import annotations

import ml_collections

from experiments.configs import simclr_digits


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.dataset = "digits"
  config.data_dir = ""  # TFDS data directory; "" = TFDS's default (digits needs none)
  config.recipe = ""  # augmentation recipe; "" = the dataset's (tfcl_jax.data.get_info)
  config.view_size = 0  # side of the views; 0 = the dataset's
  config.classes = "all"  # normal classes, one run each: "all" or e.g. "0,3,7"
  # Comma-separated InfoNCE loss specs (`tfcl_jax.losses.from_spec`: a map each).
  config.losses = "tau=0.1,tau=0.25,tau=0.5,tau=1,free"  # MSC's own: tau=0.25
  config.seeds = 3

  config.backbone = "small_cnn"
  config.width = 16  # first-stage channels; 0 = the backbone's default
  config.init_checkpoint = ""  # pretrained encoder; "" = pretrain with `config.pretrain` first
  config.init_submodule = "auto"  # "auto": a SimCLR run's "backbone", else the whole checkpoint
  config.frozen = ""  # encoder modules not fine-tuned, e.g. "Conv_0,BatchNorm_0"

  # MSC's recipe (Reiss & Hoshen's code): plain SGD, constant lr, weight decay 5e-5, batch 32,
  # angular center loss. The lr is larger than the paper's 1e-5 (a ResNet-152 at 224 px):
  # a small CNN needs it to move in 25 epochs of ~4 steps.
  config.epochs = 25
  config.batch_size = 32
  config.optimizer = "sgd"
  config.learning_rate = 0.01
  config.schedule = "constant"
  config.momentum = 0.0
  config.weight_decay = 5e-5
  config.angular = True

  config.knn_k = 2  # MSC's score: squared L2 distance to the 2 nearest normal training features
  config.squared = True  # faiss IndexFlatL2 (MSC) sums squared distances
  config.eval_every_epochs = 0  # ROC-AUC during training too; 0 = only at the end
  config.log_every = 10
  config.num_devices = 0  # devices in the mesh; 0 = all
  # Rerunning a command continues its workdir (see simclr_digits.py); False refuses it.
  config.resume = True
  config.progress = True

  # Unlabelled pretraining of the encoder with experiments.simclr (one loss, one seed).
  # Dataset, backbone, width, recipe, view size, devices, resume and progress are taken from
  # the fields above.
  pretrain = simclr_digits.get_config()
  pretrain.losses = "tau=0.2"  # none of the compared losses
  pretrain.seeds = 1
  pretrain.epochs = 30
  pretrain.probe_epochs = 0
  pretrain.eval_every_epochs = 0
  config.pretrain = pretrain
  return config
