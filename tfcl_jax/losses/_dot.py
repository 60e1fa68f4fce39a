"""The softmax over raw dot products: InfoNCE without normalisation or mapping (the `dot` loss)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tfcl_jax import _checks
from tfcl_jax.losses._engine import _arguments, _layout
from tfcl_jax.losses._loss import SPECS, Loss


def dot_product_softmax(
    q: jax.typing.ArrayLike,
    c: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    candidate_bias: jax.typing.ArrayLike | None = None,
    reduction: str = "mean",
) -> jax.Array:
  r"""`-log softmax_j(<q_i, c_j> + b_j)` at `j = i`: in-batch softmax over raw dot products.

  .. math:: L_i = \log \sum_{j} \exp(q_i \cdot c_j + b_j) - (q_i \cdot c_i + b_i)

  The loss of TensorFlow Recommenders' retrieval tutorial (the `dot` loss spec): the towers'
  outputs are scored as they are, neither normalised nor mapped, so their norms set the
  scale. One direction, `q -> c`; candidates are the rows of `c` (in-batch negatives).
  Padded pairs (`where` False) are neither anchors nor candidates. Dense `[N, N]` logits.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax import losses
    >>> q = c = jnp.eye(3)
    >>> round(float(losses.dot_product_softmax(q, c)), 4)   # log(2 + e) - 1
    0.5514

  Args:
    q: `[N, D]` float queries (anchors).
    c: `[N, D]` float candidates; row `i` is the positive of `q[i]`.
    where: optional `[N]` bool mask of valid pairs.
    candidate_bias: optional `[N]` float offsets `b_j` of the candidates' logits (no gradient);
      `-log q_j` is the sampling-bias (logQ) correction (Yi et al. 2019).
    reduction: `"mean"` (over valid anchors), `"sum"`, or `"none"` (per-row losses, 0 where
      `where` is False).

  Returns:
    A scalar, or `[N]` per-row losses.

  References:
    Yi et al., Sampling-Bias-Corrected Neural Modeling for Large Corpus Item Recommendations,
    RecSys 2019.
  """
  q, c = _arguments.check_pair(q, c, names=("q", "c"))
  _checks.one_of(reduction, _arguments.REDUCTIONS, name="reduction")
  n = q.shape[0]
  valid = _arguments.check_where(where, n)
  dtype = _checks.compute_dtype(q.dtype, c.dtype)
  logits = q.astype(dtype) @ c.astype(dtype).T
  if candidate_bias is not None:
    bias = _arguments.check_bias_row(candidate_bias, n, rows="c")
    logits = logits + jax.lax.stop_gradient(bias.astype(dtype))[None, :]
  mask = jnp.ones((n,), bool) if valid is None else valid
  logits = jnp.where(mask[None, :], logits, -jnp.inf)
  per_row = jax.nn.logsumexp(logits, axis=1) - jnp.diagonal(logits)
  return _layout.reduce(per_row, mask, reduction, masked=valid is not None)


@SPECS.register("dot[+logq]",
                help="raw dot products, no normalisation and no mapping; +logq: the logQ "
                     "correction")
@dataclasses.dataclass(frozen=True)
class DotProductLoss(Loss):
  """The softmax over raw dot products (`dot_product_softmax`) as a `Loss`: no mapping, no
  normalisation, one direction `z1 -> z2` (`negatives="cross"`).

  Attributes:
    spec, logq: as `Loss`'s.
  """

  spec: str
  logq: bool = False
  mapping = None
  scores_cosines = False
  softmax = True

  def compute(self, z1, z2, *, params, step, log_q, **kwargs) -> jax.Array:
    del params, step  # no mapping, nothing learnt
    negatives = kwargs.pop("negatives", "cross")
    if negatives != "cross":
      raise ValueError("the dot loss scores each row of z1 against the rows of z2: "
                       f"negatives must be 'cross', got {negatives!r}.")
    return dot_product_softmax(z1, z2, candidate_bias=None if log_q is None
                               else -jnp.asarray(log_q), **kwargs)
