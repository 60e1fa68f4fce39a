r"""Sphere study: annealing, learnable, dynamic and free temperature on free embeddings.

Run (a few minutes on 2 cores):
  python -m experiments.sphere --config=experiments/configs/sphere.py --workdir=/tmp/sphere
Smaller: add --config.seeds=8 --config.steps=400
Views that cannot align (fixed perturbations), as in experiments/results/sphere_augmented.md:
  python -m experiments.sphere --config=experiments/configs/sphere.py --workdir=/tmp/sphere_aug \
    --config.augment=0.3 --config.optimizers="('sgd',)" \
    --config.settings="('8:9:cross','16:8:all','32:16:cross')"
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # "d:M:negatives": dimension, instances (M <= d + 1 so the simplex optimum exists), negatives
  # "cross" (M - 1 per anchor, both directions) or "all" (NT-Xent, 2M - 2 per anchor).
  config.settings = ("3:4:cross", "8:9:cross", "16:8:cross", "16:8:all", "32:16:cross")
  # Mapping specs (tfcl_jax.mappings.from_spec); {steps} is replaced by config.steps.
  config.mappings = (
      "tau=0.05", "tau=0.1", "tau=0.5",
      "anneal=log:0.5",
      "anneal=linear:0.5:0.05:{steps}",
      "anneal=exp:0.5:0.05:{steps}",
      "learnable=0.07",
      "dynamic=0.1:0.2",
      "free",
  )
  config.optimizers = ("sgd", "langevin")
  config.seeds = 32
  config.seed = 0
  config.steps = 2000
  config.eval_every = 50
  config.learning_rate = 0.05
  config.t_learning_rate = 0.05  # of the learnable log inverse temperature t, on the mean loss
  config.beta0 = 2000.0  # Langevin inverse temperature beta(t) = beta0 log(t + 2).
  config.tol = 0.05  # cosine tolerance of "reached the optimum".
  # 0: both views are free points. > 0: one point u_i per instance, views
  # normalize(u_i + augment * n), n ~ N(0, I/d) drawn afresh every step (random
  # "augmentations"), so the views cannot align perfectly; metrics use the u_i.
  config.augment = 0.0
  config.plots = True
  return config
