"""Supervised contrastive losses: positives share a label, in two forms.

* `"ntxent"`: each positive pair against the anchor's negatives only, the semantics of
  `optax.losses.ntxent` and of pytorch-metric-learning's `NTXentLoss` with labels;
* `"supcon"`: Khosla et al. 2020's `L_out` (pytorch-metric-learning's `SupConLoss`): every
  other sample, other positives included, in the denominator, and the log-probabilities
  averaged over each anchor's positives. On the engine's tiles: memory O(B * block).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks, mappings
from tfcl_jax.losses._engine import _arguments, _calibration, _layout
from tfcl_jax.losses._engine._sums import PositiveSum
from tfcl_jax.losses._engine._tiled import tile_reduce
from tfcl_jax.losses._engine._tiles import LogSumExp, Side
from tfcl_jax.losses._family import Evaluation, reported

FORMS = ("ntxent", "supcon")


def _masked_logsumexp(logits: jax.Array, mask: jax.Array) -> jax.Array:
  """Row-wise `log sum_{j: mask} exp(logits)`; `-inf` (zero, not NaN, gradient) for empty rows."""
  masked = jnp.where(mask, logits, -jnp.inf)
  row_max = jax.lax.stop_gradient(jnp.max(masked, axis=-1, keepdims=True))
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  total = jnp.sum(jnp.exp(masked - row_max), axis=-1)
  nonempty = total != 0  # NaN in, NaN out: a NaN logit is not an empty row
  return jnp.where(nonempty, jnp.log(jnp.where(nonempty, total, 1.0)) + row_max[:, 0], -jnp.inf)


def _ntxent(u: jax.Array, labels: jax.Array, mapping) -> jax.Array:
  same = labels[:, None] == labels[None, :]
  positives = same & ~jnp.eye(u.shape[0], dtype=bool)
  logits = mapping(u @ u.T)
  negative_lse = _masked_logsumexp(logits, ~same)[:, None]
  # -log(e^a / (e^a + e^b)) = softplus(b - a); b = -inf (no negatives) gives 0.
  pair_losses = jnp.where(positives, jax.nn.softplus(negative_lse - logits), 0.0)
  return jnp.sum(pair_losses) / jnp.maximum(jnp.sum(positives), 1)


def _supcon(u: jax.Array, labels: jax.Array, mapping, block_size, scale=None) -> jax.Array:
  """`L_out` on the tiles of the rows `u` (`_layout.operand_rows`); `scale`: `[B]` per-anchor
  scales of the free `mapping`, or None."""
  n = u.shape[0]
  ids = jnp.arange(n, dtype=jnp.int32)
  valid = jnp.ones((n,), bool)
  # The denominator: every other row (a row's only excluded candidate is itself).
  lse, _ = tile_reduce(Side(u, ids, ids, valid, scale=scale), None, mapping=mapping,
                       kind="symmetric", block_size=block_size, tile_reduction=LogSumExp())
  # The numerator: the sum of f over the other rows of the anchor's class.
  positive_sum, _ = tile_reduce(Side(u, ids, labels.astype(jnp.int32), valid, scale=scale), None,
                                mapping=mapping, kind="symmetric", block_size=block_size,
                                tile_reduction=PositiveSum())
  counts = jnp.sum(labels[:, None] == labels[None, :], axis=1) - 1  # O(B^2) ints, no D
  has_positive = counts > 0
  per_anchor = jnp.where(has_positive, lse - positive_sum / jnp.maximum(counts, 1), 0.0)
  return jnp.sum(per_anchor) / jnp.maximum(jnp.sum(has_positive), 1)


@reported
def supervised_info_nce(
    z: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    mapping: mappings.MappingLike | None = None,
    form: str = "ntxent",
    block_size: int | None = None,
    check_finite: bool | str = False,
) -> Evaluation:
  r"""Supervised contrastive loss: positives share a label; `form` picks how they are scored.

  With `P(i) = {p != i: y_p = y_i}` and `A(i) = {a != i}`:

  * `form="ntxent"` (`optax.losses.ntxent`; pytorch-metric-learning's `NTXentLoss` with
    labels): for every ordered positive pair, other positives not in the denominator,

    .. math:: L_{ip} = -\log \frac{e^{f(c_{ip})}}
              {e^{f(c_{ip})} + \sum_{k: y_k \ne y_i} e^{f(c_{ik})}}

    averaged over all positive pairs. Dense `[B, B]` logits.
  * `form="supcon"` (Khosla et al. 2020, Eq. 2, `L_out`; pytorch-metric-learning's
    `SupConLoss`): every other sample in the denominator,

    .. math:: L_i = \log \sum_{a \in A(i)} e^{f(c_{ia})}
              - \frac{1}{|P(i)|} \sum_{p \in P(i)} f(c_{ip})

    averaged over the anchors with at least one positive (`SupConLoss`'s reducer; the
    original code's `temperature / base_temperature` factor, 1 at its default τ = 0.07,
    is not applied). On the engine's tiles: two passes, memory O(B * block), for every mapping.

  `f = cos / tau` (Eq. 1, SupCon's recipe fixes τ = 0.1) or `2 artanh(cos)` (Eq. 11).
  With `mapping=temperature(tau)`, `"ntxent"` equals `optax.losses.ntxent(z, labels,
  temperature=tau)` (up to its cosine epsilon). For two views per example, pass
  `concat([z1, z2])` and the labels twice.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses, mappings
    >>> z = jax.random.normal(jax.random.key(0), (6, 4))
    >>> labels = jnp.array([0, 0, 1, 1, 2, 2])
    >>> losses.supervised_info_nce(z, labels, mapping=mappings.temperature(0.1)).shape
    ()
    >>> supcon = losses.supervised_info_nce(z, labels, form="supcon")  # temperature-free
    >>> bool(jnp.isfinite(supcon))
    True
    >>> losses.supervised_info_nce(z.at[5, 1].set(jnp.nan), labels, check_finite=True)
    Traceback (most recent call last):
    ...
    ValueError: z must be finite (check_finite), got 1 NaN/inf value(s), the first in row 5.

  Args:
    z: `[B, D]` float embeddings.
    labels: `[B]` integer labels; equal labels are positives.
    mapping: a `Mapping`, a mapping spec (`mappings.from_spec`; `"free_n"` takes `B - 1`
      candidates per anchor) or a callable `cos -> logits`; default
      `mappings.temperature_free()`. A mapping with trainable params is passed built and bound
      (`m.bind(params=...)`); its spec string is refused. A batch-scaled mapping's scale is
      solved on every row's softmax over the other rows, the positive's logit of
      `calibrated_free` the mean of the anchor's positives' (`losses.supervised_batch_scale`,
      both forms).
    form: `"ntxent"` or `"supcon"` (see above).
    block_size: `"supcon"`'s largest tile side, or None (`losses.auto_block_size`).
    check_finite: `False`, `True` or `"checkify"`, as in `losses.info_nce`: every input
      embedding finite and the mapping's parameters meet its conditions (`True`: concrete
      values, a `ValueError` naming `z` and the first bad row; `"checkify"`: under `jit`
      too, a `checkify` check the caller reports). Off by default.

  Returns:
    A float32 scalar. Concrete labels with no positive pair raise `ValueError`, and so do
    labels all equal under `"ntxent"` (no negative: every pair's loss would be `-log 1 = 0`);
    under `jit`, where the labels are not known, both give 0 (with no gradient).

  References:
    Khosla et al. 2020, "Supervised Contrastive Learning", Eq. 2; Kim & Kim,
    arXiv 2501.17683, Eq. 1 and 11.
  """
  if form == "supcon":  # on the tiles' custom VJP; "ntxent"'s dense logits take forward mode
    _arguments.refuse_forward_mode(z, mapping, loss="supervised_info_nce(form='supcon')")
  z = _arguments.check_embeddings(z, name="z", rows="B")
  if _arguments.check_finite_mode(check_finite):
    _arguments.check_finite(z, name="z", mode=check_finite)
  labels = jnp.asarray(labels)
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise TypeError(f"labels must have an integer dtype, got {labels.dtype}.")
  if labels.shape != (z.shape[0],):
    raise ValueError(f"labels must have shape [B] = ({z.shape[0]},), got {labels.shape}.")
  _checks.one_of(form, FORMS, name="form")
  block_size = _arguments.check_block_size(block_size)
  mapping = _arguments.loss_mapping(mapping, num_candidates=z.shape[0] - 1, inputs=(z,))
  if check_finite:
    _arguments.check_parameters(mapping, mode=check_finite)
  if _checks.is_concrete(labels):
    # NumPy: under `jit` jnp would trace even concrete labels (closed over) and not convert.
    values = np.asarray(labels)
    same = values[:, None] == values[None, :]
    if not np.any(same & ~np.eye(z.shape[0], dtype=bool)):
      raise ValueError("labels must contain at least one positive pair (two equal labels).")
    if form == "ntxent" and np.all(same):
      raise ValueError(
          "labels must contain two different labels for form='ntxent': it scores each positive "
          "pair against the anchor's negatives (the other labels' rows), and with one label "
          "every pair's loss is -log(1) = 0, with no gradient. form='supcon' scores the "
          "positives against every other row.")

  rows = _layout.operand_rows(z, _layout.operand_dtype(z.dtype))  # raw 16-bit rows, or unit
  mapping, scale, solved = _calibration.supervised_for_loss(mapping, rows, labels,
                                                            block_size=block_size)
  if form == "ntxent":
    return Evaluation(_ntxent(_layout.unit(rows), labels, mapping), solved)
  if scale is not None:  # per anchor: the free mapping, each row scaled as an anchor
    return Evaluation(_supcon(rows, labels, mappings.temperature_free(), block_size, scale),
                      solved)
  return Evaluation(_supcon(rows, labels, mapping, block_size), solved)
