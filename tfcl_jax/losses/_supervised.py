"""Supervised contrastive loss: positives share a label (the semantics of `optax.losses.ntxent`)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from tfcl_jax import _checks
from tfcl_jax.losses import _layout


def _masked_logsumexp(logits: jax.Array, mask: jax.Array) -> jax.Array:
  """Row-wise `log sum_{j: mask} exp(logits)`; `-inf` (zero, not NaN, gradient) for empty rows."""
  masked = jnp.where(mask, logits, -jnp.inf)
  row_max = jax.lax.stop_gradient(jnp.max(masked, axis=-1, keepdims=True))
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  total = jnp.sum(jnp.exp(masked - row_max), axis=-1)
  nonempty = total > 0
  return jnp.where(nonempty, jnp.log(jnp.where(nonempty, total, 1.0)) + row_max[:, 0], -jnp.inf)


def supervised_info_nce(
    z: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    mapping: Callable[[jax.Array], jax.Array] | None = None,
) -> jax.Array:
  r"""Supervised contrastive loss: positives share a label (the semantics of `optax.losses.ntxent`).

  For every ordered positive pair `(i, p)`, `p != i`, `labels[p] == labels[i]`:

  .. math:: L_{ip} = -\log \frac{\exp(f(c_{ip}))}
            {\exp(f(c_{ip})) + \sum_{k: y_k \ne y_i} \exp(f(c_{ik}))}

  averaged over all positive pairs; other positives are not in the
  denominator. With `mapping=temperature(tau)` this equals
  `optax.losses.ntxent(z, labels, temperature=tau)` (up to its cosine epsilon),
  in O(B^2) memory rather than its O(B^2 D).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses, mappings
    >>> z = jax.random.normal(jax.random.key(0), (6, 4))
    >>> labels = jnp.array([0, 0, 1, 1, 2, 2])
    >>> losses.supervised_info_nce(z, labels, mapping=mappings.temperature(0.1)).shape
    ()

  Args:
    z: `[B, D]` float embeddings.
    labels: `[B]` integer labels; equal labels are positives.
    mapping: a `Mapping` or callable `cos -> logits`; default `mappings.temperature_free()`.

  Returns:
    A float32 scalar: the mean over positive pairs (0 if there is none under
    `jit`; concrete labels with no positive pair raise `ValueError`).
  """
  z = _checks.float_matrix(z, name="z")
  labels = jnp.asarray(labels)
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise TypeError(f"labels must have an integer dtype, got {labels.dtype}.")
  if labels.shape != (z.shape[0],):
    raise ValueError(f"labels must have shape [B] = ({z.shape[0]},), got {labels.shape}.")
  mapping = _layout.check_mapping(mapping)
  same = labels[:, None] == labels[None, :]
  positives = same & ~jnp.eye(z.shape[0], dtype=bool)
  if _checks.is_concrete(labels) and not bool(jnp.any(positives)):
    raise ValueError("labels must contain at least one positive pair (two equal labels).")

  u = _layout.unit_rows(z, _checks.compute_dtype(z.dtype))
  logits = mapping(u @ u.T)
  negative_lse = _masked_logsumexp(logits, ~same)[:, None]
  # -log(e^a / (e^a + e^b)) = softplus(b - a); b = -inf (no negatives) gives 0.
  pair_losses = jax.nn.softplus(negative_lse - logits)
  pair_losses = jnp.where(positives, pair_losses, 0.0)
  return jnp.sum(pair_losses) / jnp.maximum(jnp.sum(positives), 1)
