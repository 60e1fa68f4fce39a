r"""InfoNCE / NT-Xent losses (Section 2, Eq. 1) with a pluggable similarity-to-logit map.

Every loss takes `mapping=`: `temperature(tau)` gives the usual NT-Xent,
`temperature_free()` (the default) gives the paper's Eq. 11-12.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from tfcl_jax import _checks
from tfcl_jax import blockwise as blockwise_lib
from tfcl_jax import mappings as mappings_lib

# Squared-norm floor of the L2 normalisation: a zero vector maps to zero
# (cosine 0 with everything) with finite gradients (at most 1/sqrt(floor)) instead of 0/0.
_NORM_EPS = 1e-12


def norm_floor(dtype) -> float:
  """Squared-norm floor for inputs of `dtype`: 1e-12, or float16's smallest normal (6e-5).

  The gradient at a zero vector is `1/sqrt(floor)`: 1e6, or 128 for float16, whose
  largest finite value is 65504.
  """
  return max(_NORM_EPS, float(jnp.finfo(dtype).tiny))


def l2_normalize(z: jax.typing.ArrayLike, *, axis: int = -1, eps: float = _NORM_EPS) -> jax.Array:
  r"""`z / sqrt(max(||z||^2, eps))` along `axis`: finite values and gradients at z = 0.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax import losses
    >>> losses.l2_normalize(jnp.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]
  """
  z = jnp.asarray(z)
  squared_norm = jnp.sum(z * z, axis=axis, keepdims=True)
  return z * jax.lax.rsqrt(jnp.maximum(squared_norm, eps))


def _masked_logsumexp(logits: jax.Array, mask: jax.Array) -> jax.Array:
  """Row-wise `log sum_{j: mask} exp(logits)`; `-inf` (zero, not NaN, gradient) for empty rows."""
  masked = jnp.where(mask, logits, -jnp.inf)
  row_max = jax.lax.stop_gradient(jnp.max(masked, axis=-1, keepdims=True))
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  total = jnp.sum(jnp.exp(masked - row_max), axis=-1)
  nonempty = total > 0
  return jnp.where(nonempty, jnp.log(jnp.where(nonempty, total, 1.0)) + row_max[:, 0], -jnp.inf)


def _row_losses(logits: jax.Array, positive: jax.Array, candidates: jax.Array) -> jax.Array:
  """`logsumexp_{j in candidates} logits[i, j] - logits[i, positive[i]]` per row.

  Computed as `softplus(logsumexp_{negatives} - positive)`: `lse - positive` cancels to 0 in
  float32 once the loss drops below ~1e-7, exactly where Eq. 12 says L -> 0 matters.
  """
  columns = jnp.arange(logits.shape[1])
  negatives = candidates & (columns[None, :] != positive[:, None])
  positive_logit = jnp.take_along_axis(logits, positive[:, None], axis=-1)[:, 0]
  return jax.nn.softplus(_masked_logsumexp(logits, negatives) - positive_logit)


def _reduce(per_row: jax.Array, valid: jax.Array | None, reduction: str) -> jax.Array:
  if valid is not None:
    per_row = jnp.where(valid, per_row, 0.0)
  if reduction == "none":
    return per_row
  if reduction == "sum":
    return jnp.sum(per_row)
  count = per_row.shape[0] if valid is None else jnp.maximum(jnp.sum(valid), 1)
  return jnp.sum(per_row) / count


def _check_where(where, n: int) -> jax.Array | None:
  if where is None:
    return None
  where = jnp.asarray(where)
  if where.dtype != jnp.bool_:
    raise TypeError(f"where must be a boolean mask, got dtype {where.dtype}.")
  if where.shape != (n,):
    raise ValueError(f"where must have shape [N] = ({n},), got {where.shape}.")
  return where


def _check_mapping(mapping) -> Callable:
  if not callable(mapping):
    raise TypeError(
        f"mapping must be a callable cos -> logits (see tfcl_jax.mappings), got "
        f"{type(mapping).__name__}.")
  return mapping


def info_nce(
    z1: jax.typing.ArrayLike,
    z2: jax.typing.ArrayLike,
    *,
    mapping: Callable[[jax.Array], jax.Array] | None = None,
    negatives: str = "cross",
    reduction: str = "mean",
    where: jax.typing.ArrayLike | None = None,
    block_size: int | None = None,
) -> jax.Array:
  r"""InfoNCE of two views with a pluggable similarity-to-logit map (Eq. 1, 11).

  For anchor `i` with positive `i+` and candidate set `K_i`,

  .. math:: L_i = -\log \frac{\exp(f(\cos\theta_{i,i+}))}{\sum_{j \in K_i} \exp(f(\cos\theta_{ij}))}

  with `f = cos / tau` (Eq. 1) or `f = 2 artanh(cos)` (Eq. 11, the default).

  * `negatives="cross"` (Eq. 1): anchor `z1[i]`, candidates every row of `z2`,
    positive `z2[i]`: N logits per row, `N` per-row losses.
  * `negatives="all"` (SimCLR NT-Xent, also GRACE's loss): the `2N` rows of
    `concat([z1, z2])` are anchors; each is scored against the other `2N - 1`
    rows (itself excluded), positive the other view of the same pair.
    Per-row losses are ordered `z1` rows then `z2` rows.

  Embeddings are L2-normalised inside (`l2_normalize`: a zero vector gives
  cosine 0 and finite gradients). Half-precision inputs are computed in float32
  and the result is float32. Cost: one `[N, D] x [D, N]` (cross) or
  `[2N, D] x [D, 2N]` (all) matmul; memory O(N^2) for the logits. With `block_size`,
  the logits are computed tile by tile (`tfcl_jax.blockwise`): memory
  O(N * block_size + N * D), the same loss and gradients, for every mapping.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses, mappings
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 16))
    >>> z2 = z1 + 0.1 * jax.random.normal(jax.random.key(1), (8, 16))
    >>> loss = losses.info_nce(z1, z2)  # temperature-free
    >>> bool(loss < jnp.log(8))
    True
    >>> nt_xent = losses.info_nce(z1, z2, mapping=mappings.temperature(0.5), negatives="all")
    >>> nt_xent.shape
    ()

  Args:
    z1: `[N, D]` float embeddings of the first view.
    z2: `[N, D]` float embeddings of the second view; row `i` is the positive of `z1[i]`.
    mapping: callable `cos -> logits`, applied elementwise; default
      `mappings.temperature_free()`.
    negatives: `"cross"` or `"all"` (see above).
    reduction: `"mean"` (over valid anchors), `"sum"`, or `"none"` (per-row losses).
    where: optional `[N]` bool mask of valid pairs (padded batches). Masked
      pairs are neither anchors nor candidates, so the loss equals the loss on
      the valid subset; their per-row losses are 0. With no valid pair the mean is 0.
    block_size: `None` (dense logits) or an int > 0: tile side of the blockwise path.

  Returns:
    A float32 (float64 under x64 inputs) scalar, or `[N]` / `[2N]` per-row losses.

  References:
    van den Oord et al. 2018 (InfoNCE); Chen et al. 2020 (SimCLR, NT-Xent);
    Kim & Kim, arXiv 2501.17683, Eq. 1 and 11.
  """
  z1 = _checks.float_matrix(z1, name="z1")
  z2 = _checks.float_matrix(z2, name="z2")
  if z1.shape != z2.shape:
    raise ValueError(f"z1 and z2 must have the same shape [N, D], got {z1.shape} and {z2.shape}.")
  n = z1.shape[0]
  if n < 2:
    raise ValueError(f"z1 and z2 need N >= 2 pairs to have a negative, got N = {n}.")
  _checks.one_of(negatives, ("cross", "all"), name="negatives")
  _checks.one_of(reduction, ("mean", "sum", "none"), name="reduction")
  mapping = _check_mapping(mappings_lib.temperature_free() if mapping is None else mapping)
  valid = _check_where(where, n)
  block_size = blockwise_lib.check_block_size(block_size)

  dtype = _checks.compute_dtype(z1.dtype, z2.dtype)
  u1 = l2_normalize(z1.astype(dtype), eps=norm_floor(z1.dtype))
  u2 = l2_normalize(z2.astype(dtype), eps=norm_floor(z2.dtype))

  if block_size is not None:
    per_row, anchors = blockwise_lib.info_nce_rows(
        u1, u2, mapping=mapping, negatives=negatives, valid=valid, block_size=block_size)
    return _reduce(per_row, anchors, reduction)
  if negatives == "cross":
    logits = mapping(u1 @ u2.T)
    positive = jnp.arange(n)
    candidates = jnp.broadcast_to(True if valid is None else valid[None, :], (n, n))
    anchors = valid
  else:
    u = jnp.concatenate([u1, u2], axis=0)
    logits = mapping(u @ u.T)
    index = jnp.arange(2 * n)
    positive = (index + n) % (2 * n)
    candidates = index[:, None] != index[None, :]
    anchors = None
    if valid is not None:
      anchors = jnp.concatenate([valid, valid])
      candidates = candidates & anchors[None, :]
  per_row = _row_losses(logits, positive, candidates)
  return _reduce(per_row, anchors, reduction)


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
    mapping: callable `cos -> logits`; default `mappings.temperature_free()`.

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
  mapping = _check_mapping(mappings_lib.temperature_free() if mapping is None else mapping)
  same = labels[:, None] == labels[None, :]
  positives = same & ~jnp.eye(z.shape[0], dtype=bool)
  if _checks.is_concrete(labels) and not bool(jnp.any(positives)):
    raise ValueError("labels must contain at least one positive pair (two equal labels).")

  u = l2_normalize(z.astype(_checks.compute_dtype(z.dtype)), eps=norm_floor(z.dtype))
  logits = mapping(u @ u.T)
  negative_lse = _masked_logsumexp(logits, ~same)[:, None]
  # -log(e^a / (e^a + e^b)) = softplus(b - a); b = -inf (no negatives) gives 0.
  pair_losses = jax.nn.softplus(negative_lse - logits)
  pair_losses = jnp.where(positives, pair_losses, 0.0)
  return jnp.sum(pair_losses) / jnp.maximum(jnp.sum(positives), 1)
