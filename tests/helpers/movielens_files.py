"""Small MovieLens-format files for the experiments' tests."""

from __future__ import annotations

import os

import numpy as np


def write_u_data(folder, *, users=24, items=40, per_user=12, seed=0) -> str:
  """GroupLens `u.data` in `folder`: `user item rating timestamp`, tab-separated, each user
  rating `per_user` distinct items; returns the folder."""
  rng = np.random.default_rng(seed)
  lines = []
  for user in range(1, users + 1):
    for t, item in enumerate(rng.choice(np.arange(1, items + 1), per_user, replace=False)):
      lines.append(f"{user}\t{item}\t{rng.integers(1, 6)}\t{880000000 + 100 * user + t}")
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "u.data"), "w") as f:
    f.write("\n".join(lines) + "\n")
  return str(folder)
