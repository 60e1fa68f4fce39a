r"""The scale a batch-scaled mapping takes on a batch (`mappings.calibrated_free`,
`perplexity_free`, `accuracy_free`), solved as the losses solve it: to log, or to bind once."""

from __future__ import annotations

import jax

from tfcl_jax import mappings
from tfcl_jax.losses._engine import _batch, _calibration
from tfcl_jax.losses._engine._devices import ONE_DEVICE, Sharded


def _batch_scaled(mapping) -> mappings.BatchScaled:
  fn = getattr(mapping, "fn", None)
  if not isinstance(fn, mappings.BatchScaled):
    spec = getattr(mapping, "spec", mapping)
    raise ValueError(f"mapping must be a batch-scaled mapping (mappings.calibrated_free(), "
                     f"perplexity_free() or accuracy_free()), whose scale a loss solves from its "
                     f"batch; got {spec!r}, which has none to solve.")
  return fn


def batch_scale(
    z1: jax.typing.ArrayLike,
    z2: jax.typing.ArrayLike,
    *,
    mapping: mappings.Mapping,
    negatives: str = "cross",
    symmetric: bool = False,
    where: jax.typing.ArrayLike | None = None,
    extra_negatives: jax.typing.ArrayLike | None = None,
    extra_where: jax.typing.ArrayLike | None = None,
    candidate_bias: jax.typing.ArrayLike | None = None,
    block_size: int | None = None,
    axis_name: str | None = None,
    strategy: str = "all_gather",
) -> jax.Array:
  r"""The scale `info_nce` (or `sigmoid_loss`) solves for a batch-scaled `mapping` on this batch.

  The same code as inside the losses: one forward-only pass of the softmax's moments over the
  loss's similarity matrix (its anchors, candidates, masks and bank, through the same tiles),
  the positive merged analytically, and the target solved on the grid `s_k = 2^k`,
  `k = -7..7`, clipped to `[mappings.S_MIN, mappings.S_MAX] = [1/100, 100]`:

  * `calibrated_free`: `argmin_s` of the batch's mean InfoNCE loss (root of
    `mean_i E_{p_i}[l] - l_{i,i+}`), the candidate bias in the softmax;
  * `perplexity_free`: per anchor, `H_i(s_i) = (1/2) log N_i` (no bias);
  * `accuracy_free`: `mean_i H_i(s) = mean_i H*(a, N_i)`, `a` the top-1 accuracy (no bias).

  Pass the loss's own arguments, then `mapping.bind(scale=s)` to the loss: it skips the solve
  and gives the same loss (the scale takes no gradient either way). The sigmoid loss solves on
  the softmax over the same candidates: call this with its `z1, z2, negatives, where`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses, mappings
    >>> z1 = jax.random.normal(jax.random.key(0), (16, 8))
    >>> z2 = z1 + 0.8 * jax.random.normal(jax.random.key(1), (16, 8))
    >>> m = mappings.accuracy_free()
    >>> s = losses.batch_scale(z1, z2, mapping=m, negatives="all")
    >>> s.shape, bool(mappings.S_MIN <= s <= mappings.S_MAX)
    ((), True)
    >>> bound = losses.info_nce(z1, z2, mapping=m.bind(scale=s), negatives="all")
    >>> bool(jnp.allclose(bound, losses.info_nce(z1, z2, mapping=m, negatives="all")))
    True

  Args:
    z1, z2: `[N, D]` float views (inside `shard_map` with `axis_name`: this device's `[n, D]`).
    mapping: a batch-scaled mapping; a bound one returns its bound scale.
    negatives, symmetric, where, extra_negatives, extra_where, candidate_bias, block_size: as
      in `info_nce` (`candidate_bias`: one direction of `cross`, single device).
    axis_name: None, or the mesh axis of `sharded_info_nce` / `sharded_sigmoid_loss` when
      called inside `jax.shard_map` (the global scales then pool every device's anchors).
    strategy: the sharded loss's `"all_gather"` or `"ring"`.

  Returns:
    A float scalar (`calibrated_free`, `accuracy_free`), or `[M]` (`perplexity_free`), one per
    anchor in the loss's order: `N` (`cross`), `2N` (`symmetric=True`, `all`); this device's
    with `axis_name`.

  Raises:
    ValueError: `mapping` is not batch-scaled; any argument `info_nce` refuses.
  """
  fn = _batch_scaled(mapping)
  devices = ONE_DEVICE
  if axis_name is not None:
    if candidate_bias is not None:
      raise ValueError("candidate_bias is for the single-device loss (axis_name=None), as in "
                       "info_nce.")
    devices = Sharded(axis_name, strategy)
  batch = _batch.setup(z1, z2, devices=devices, family="info_nce", mapping=mapping,
                       negatives=negatives, symmetric=symmetric, reduction="mean", where=where,
                       block_size=block_size, extra_negatives=extra_negatives,
                       extra_where=extra_where, candidate_bias=candidate_bias)
  return _calibration.solve_batch(fn, batch, devices=devices)


def supervised_batch_scale(z: jax.typing.ArrayLike, labels: jax.typing.ArrayLike, *,
                           mapping: mappings.Mapping, block_size: int | None = None
                           ) -> jax.Array:
  r"""The scale `supervised_info_nce` solves for a batch-scaled `mapping` (both forms).

  Every row is an anchor and every other row its candidate; `calibrated_free` takes the mean
  of an anchor's positives' logits as its positive's (the derivative of SupCon's `L_out` in
  `s`), `accuracy_free` counts an anchor correct when its best candidate shares its label; the
  global scales average over the anchors with a positive.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses, mappings
    >>> z = jax.random.normal(jax.random.key(0), (12, 6))
    >>> labels = jnp.arange(12) % 3
    >>> losses.supervised_batch_scale(z, labels, mapping=mappings.perplexity_free()).shape
    (12,)

  Args:
    z: `[B, D]` float embeddings.
    labels: `[B]` integer labels.
    mapping: a batch-scaled mapping; a bound one returns its bound scale.
    block_size: the largest tile side, or None (automatic).

  Returns:
    A float scalar, or `[B]` for `perplexity_free`.
  """
  return _calibration.supervised_scale(_batch_scaled(mapping), z, labels, block_size=block_size)
