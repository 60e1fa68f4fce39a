r"""Learnable temperature vs free: Eq. 10's stuck t, and precision as C -> 1 in float32/bfloat16.

Run (about a minute on 2 cores):
  python -m experiments.learnable_vs_free --config=experiments/configs/learnable_vs_free.py \
    --workdir=/tmp/learnable_vs_free
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.plots = True

  config.stuck = ml_collections.ConfigDict()
  config.stuck.m = 8
  config.stuck.d = 16  # >= 2m, so that the orthogonal start exists.
  config.stuck.mappings = ("learnable=0.07", "learnable=1", "free")  # `mappings.from_spec` specs
  config.stuck.steps = 2000
  config.stuck.learning_rate = 0.01
  config.stuck.t_learning_rate = 0.1
  config.stuck.report_steps = (1, 10, 100, 1000)

  config.precision = ml_collections.ConfigDict()
  config.precision.m = 8
  config.precision.d = 16
  config.precision.mappings = ("free", "tau=0.1")  # free and tau=<value>: the float64 reference
  config.precision.dtypes = ("float32", "bfloat16")
  config.precision.steps = 5000
  config.precision.every = 10
  config.precision.learning_rate = 0.05
  return config
