"""SimCLR on scikit-learn's 8x8 digits: 5 losses x 3 seeds on a CPU in minutes (Table 2, small).

Run:
  python -m experiments.simclr --config=experiments/configs/simclr_digits.py --workdir=/tmp/digits
N-sensitivity (batch sizes 64-512, fixed tau against free):
  python -m experiments.simclr --config=experiments/configs/simclr_digits.py --workdir=/tmp/n \
    --config.mode=n_sensitivity
"""

from __future__ import annotations

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.mode = "sweep"  # "sweep": losses x seeds; "n_sensitivity": batch sizes x n_losses
  # What the two views train: "simclr", or "supcon" with the labels (configs/supcon_digits.py).
  config.objective = "simclr"
  # SupCon's form: "supcon" (Khosla et al.'s L_out) or "ntxent" (each positive pair against
  # the negatives only); "" with "simclr", which takes none.
  config.form = ""
  config.dataset = "digits"
  config.data_dir = ""  # TFDS data directory; "" = TFDS's default (digits needs none)
  config.recipe = ""  # augmentation recipe; "" = the dataset's (tfcl_jax.data.get_info)
  config.view_size = 0  # side of the views; 0 = the dataset's
  # Comma-separated loss specs (`tfcl_jax.losses.from_spec`): a mapping for InfoNCE (NT-Xent),
  # or sigmoid/<mapping>[/b=<init> | /learn_b=<init>] for the sigmoid loss.
  config.losses = "tau=0.1,tau=0.25,tau=0.5,tau=1,free"
  config.seeds = 3
  config.negatives = "all"  # SimCLR's NT-Xent candidates (2N - 2 negatives)

  config.backbone = "small_cnn"
  config.width = 16  # first-stage channels; 0 = the backbone's default
  config.projection_hidden_dim = 64
  config.projection_dim = 32

  config.epochs = 20
  config.batch_size = 256
  config.optimizer = "sgd"
  config.learning_rate = 0.06  # at batch 256; scaled by batch_size / 256 (lr_scaling="linear")
  config.lr_scaling = "linear"
  config.momentum = 0.9
  config.weight_decay = 5e-4
  config.warmup_epochs = 0

  config.n_batch_sizes = "64,128,256,512"
  config.n_losses = "tau=0.1,free"

  config.knn_k = 200
  config.knn_tau = 0.1
  config.probe_epochs = 500  # full-batch Adam steps of the linear probe; 0 = no probe
  config.eval_every_epochs = 5  # kNN + alignment/uniformity during training; 0 = only at the end
  config.checkpoint_every = 50  # an interrupted run continues from here; 0 = at the end
  config.log_every = 10
  config.num_devices = 0  # devices in the mesh; 0 = all
  # Rerunning a command continues its workdir: finished runs are kept, an interrupted one
  # resumes from its last checkpoint; a workdir made with another config is refused.
  # False refuses any workdir that already holds results.
  config.resume = True
  config.progress = True
  return config
