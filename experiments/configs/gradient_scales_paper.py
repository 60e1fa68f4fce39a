r"""Gradient-scale figures of Sections 3-4 (Figures 2-5 and Eq. 10), the same for the scaled free
mappings (free_n, learnable_free) and for the sigmoid loss, closed form vs autodiff.

Run (seconds on 2 cores):
  python -m experiments.gradient_scales --workdir=/tmp/gradient_scales
  python -m experiments.gradient_scales --config=experiments/configs/gradient_scales_paper.py \
    --workdir=/tmp/gradient_scales --config.figure4_tau=0.5
"""

import math

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.figure2_taus = (0.1, 0.25, 0.5, 1.0)  # Figure 2: Eq. 4 over C.
  config.figure3_cs = (0.25, 0.5, 0.75, 1.0)  # Figure 3: Eq. 4 over tau.
  config.figure3_tau_range = (0.02, 1.0)
  config.figure4_tau = 0.25  # Figure 4: Eq. 7 over C.
  config.ns = (2, 4, 8, 16)  # Figures 4 and 5.
  # Eq. 10 curves; the last is CLIP's initial t = log(1 / 0.07).
  config.eq10_ts = (-1.0, 0.0, 1.0, 2.0, round(math.log(1 / 0.07), 4))
  # The scaled free mappings: |dL/dC| of free_n beside free and tau (scaled_free_scale), |dL/dt| of
  # learnable_free at t = 0 beside CLIP's Eq. 10 at its start (learnable_free_t), per N. The
  # autodiff cost grows as N^3 (the pattern's embeddings are [N, N + 1]).
  config.scaled_free_ns = (2, 64, 512)
  config.scaled_free_tau = 0.1
  config.clip_t = round(math.log(1 / 0.07), 4)  # CLIP's initial t
  # The sigmoid (SigLIP) loss at the same pattern: N candidates, fixed tau and the free mapping.
  config.sigmoid_n = 16
  config.sigmoid_taus = (0.1, 0.5, 1.0)
  config.sigmoid_ts = (0.0, round(math.log(10.0), 4))  # SigLIP's initial t = log 10
  config.sigmoid_biases = (0.0, -10.0)  # SigLIP's initial b = -10
  config.line_points = 400  # closed-form curve resolution.
  config.autodiff_points = 20  # autodiff markers per curve.
  # Autodiff cannot reach |C| = 1 (the cosine is quadratic at the pole): C = 1 is read at 1 - this.
  config.c_one_offset = 1e-6
  config.x64 = True
  return config
