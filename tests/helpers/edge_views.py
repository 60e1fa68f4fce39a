"""The edge cases of a loss's inputs, stacked for one `jax.vmap`: identical views (cosine 1 on
the positives), antipodal views (cosine -1) and zero rows."""

from __future__ import annotations

import jax.numpy as jnp


def stacked(dtype):
  """`(z1, z2)`, each `[3, 4, 3]` in `dtype`: the three cases along the leading axis. Call it
  inside `jax.enable_x64(True)` for float64."""
  base = jnp.asarray([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], dtype)
  z1 = jnp.stack([base, base, base.at[0].set(0.0)])
  z2 = jnp.stack([base, -base, jnp.zeros_like(base)])
  return z1, z2
