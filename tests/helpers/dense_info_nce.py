"""InfoNCE from full `[N, N]` / `[2N, 2N]` logits in plain JAX, for autodiff: the per-row losses
written from Eq. 1, independent of the engine's tiles, masks and custom VJP."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def row_losses(z1, z2, logits_of, negatives: str, symmetric: bool = False) -> jax.Array:
  """Per-row InfoNCE of `info_nce(z1, z2, negatives=..., symmetric=...)` under the mapping
  `logits_of(cos)`: `logsumexp` over each anchor's candidates minus its positive's logit."""
  unit = lambda z: z / jnp.linalg.norm(z, axis=1, keepdims=True)  # noqa: E731
  u1, u2 = unit(z1), unit(z2)
  n = z1.shape[0]
  if negatives == "cross":
    logits = logits_of(u1 @ u2.T)
    rows = jax.nn.logsumexp(logits, axis=1) - jnp.diag(logits)
    if symmetric:
      rows = jnp.concatenate([rows, jax.nn.logsumexp(logits, axis=0) - jnp.diag(logits)])
    return rows
  u = jnp.concatenate([u1, u2])
  self_pairs = jnp.eye(2 * n, dtype=bool)  # masked before the mapping: f(1) is inf for Eq. 11
  logits = jnp.where(self_pairs, -jnp.inf, logits_of(jnp.where(self_pairs, 0.0, u @ u.T)))
  positive = logits[jnp.arange(2 * n), (jnp.arange(2 * n) + n) % (2 * n)]
  return jax.nn.logsumexp(logits, axis=1) - positive
