r"""Free mappings whose scale the loss solves from its own batch, `s 2 artanh(c)` (Eq. 11 times
`s`): their declaration (`BatchScaled`, the bounds of a solved scale) and constructors.

`s` is no parameter: each loss call solves it with the embeddings held fixed (stop-gradient),
from one forward-only pass over the similarities (the losses' engine; `losses.batch_scale`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks
from tfcl_jax.mappings._base import Mapping
from tfcl_jax.mappings._free import _free_logit, _InKernel
from tfcl_jax.mappings._function import MappingFunction, ParameterCheck, positive_check
from tfcl_jax.mappings._registry import SPECS

#: The upper bound of every solved scale: CLIP's cap of its learnt scale.
S_MAX = 100.0
#: The lower bound of every solved scale: `S_MAX` mirrored about free's `s = 1` in log space
#: (the loss's gradient is proportional to `s`: at `1/100` it stays alive).
S_MIN = 0.01
#: What each batch-scaled mapping solves for (`BatchScaled.target`).
TARGETS = ("calibrated", "perplexity", "accuracy")


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: a bound scale may be a tracer
class BatchScaled(MappingFunction):
  """`s 2 artanh(c)` with `s` solved by the loss for `target` (one of `TARGETS`), or bound.

  Unbound (`scale` None) it has no logits of its own: the losses solve `s` and call it bound.
  `kernel`: Eq. 11 in the fused kernels' form (`MappingFunction.kernel_form`).
  """

  target: str
  scale: jax.Array | None = None

  @property
  def per_anchor(self) -> bool:
    """Whether the scale is one per anchor (`perplexity`) rather than one per batch."""
    return self.target == "perplexity"

  def __call__(self, cos, params, step, kernel: bool = False):
    if self.scale is None:
      raise ValueError(
          f"the {self.target}_free mapping's scale is solved by a loss from its batch, so on "
          f"cosines alone it has none: bind one, m.bind(scale=s) (losses.batch_scale(z1, z2, "
          f"mapping=m) gives the batch's s), or pass the mapping to a loss.")
    scale = jnp.asarray(self.scale, cos.dtype)
    if self.per_anchor:
      if cos.ndim < 1 or cos.shape[0] != scale.shape[0]:
        raise ValueError(f"a per-anchor scale of shape {scale.shape} multiplies the rows of "
                         f"cosines [M, ...] with M = {scale.shape[0]} anchors, got cosines of "
                         f"shape {cos.shape}.")
      scale = scale.reshape(scale.shape + (1,) * (cos.ndim - 1))
    return scale * _free_logit(cos, kernel=kernel)

  def with_batch_scale(self, scale):
    want = "a 1-D array [M], one per anchor" if self.per_anchor else "a scalar"
    if not jnp.issubdtype(scale.dtype, jnp.floating) or scale.ndim != (1 if self.per_anchor else
                                                                       0):
      raise ValueError(f"scale of the {self.target}_free mapping must be {want} of floats, got "
                       f"shape {scale.shape} and dtype {scale.dtype}.")
    if _checks.is_concrete(scale) and not bool(jnp.all(jnp.isfinite(scale) & (scale > 0))):
      raise ValueError(f"scale of the {self.target}_free mapping must be finite and > 0, got "
                       f"{np.asarray(scale)}.")
    return dataclasses.replace(self, scale=scale)

  def logit_scale(self, params):
    return self.scale

  def parameter_checks(self, params, step) -> tuple[ParameterCheck, ...]:
    return () if self.scale is None else (positive_check("scale", self.scale),)

  def kernel_form(self) -> MappingFunction:
    return _InKernel(self)


def batch_scaled(mapping) -> bool:
  """Whether a loss solves `mapping`'s scale from each batch: an unbound `calibrated_free`,
  `perplexity_free` or `accuracy_free` (False for None, a bound one and every other mapping).

  Examples:
    >>> from tfcl_jax import mappings
    >>> m = mappings.calibrated_free()
    >>> mappings.batch_scaled(m), mappings.batch_scaled(m.bind(scale=2.0))
    (True, False)
    >>> mappings.batch_scaled(mappings.temperature_free()), mappings.batch_scaled(None)
    (False, False)
  """
  fn = getattr(mapping, "fn", None)
  return isinstance(fn, BatchScaled) and fn.scale is None


@SPECS.register("calibrated_free",
                help="free with the batch's maximum-likelihood scale s 2 artanh(cos), s solved "
                     "by the loss from its batch (no gradient), in [1/100, 100]")
def calibrated_free() -> Mapping:
  r"""Free with the batch's maximum-likelihood scale: `s* 2 artanh(c)` (Eq. 11 times `s*`).

  .. math:: s^* = \arg\min_{s \in [1/100, 100]} \frac{1}{|A|} \sum_{i \in A}
            \Big[\log \sum_{j \in K_i} e^{s l_{ij} + b_j} - s l_{i,i+} - b_{i+}\Big],
            \quad l = 2 \operatorname{artanh}(c)

  Temperature scaling (Guo et al. 2017) on the batch the loss is computing, its embeddings held
  fixed: the loss's own anchors `A` (both directions for CLIP's loss, all `2N` rows for
  `negatives="all"`, the global batch in a sharded loss), the candidate bias (`candidate_bias`,
  logQ) inside the softmax. Convex in `s`: `L'(s) = mean_i (E_{p_i}[l] - l_{i,i+})`,
  `L''(s) = mean_i Var_{p_i}[l]`; `s*` is the root of `L'` (the losses' engine solves it),
  clipped to `[S_MIN, S_MAX] = [1/100, 100]`. `s*` takes no gradient (it is no parameter), so
  the loss's gradient is the free loss's at a fixed scale `s*`. On Example 4.1's pattern
  `[C, -C, ..., -C]` every anchor's positive already scores highest, `L'(s) < 0` for all `s`,
  and `s* = 100`.
  The sigmoid loss (no softmax of its own) takes the scale of the softmax over each anchor's
  candidates; SupCon's `l_{i,i+}` is the mean of the anchor's positives' logits.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses, mappings
    >>> z1 = jax.random.normal(jax.random.key(0), (32, 16))
    >>> z2 = z1 + 1.5 * jax.random.normal(jax.random.key(1), (32, 16))
    >>> m = mappings.calibrated_free()
    >>> s = losses.batch_scale(z1, z2, mapping=m)          # what info_nce solves inside
    >>> bool(0.01 <= s <= 100), mappings.logit_scale(m) is None
    (True, True)
    >>> loss = losses.info_nce(z1, z2, mapping=m)
    >>> bool(jnp.allclose(loss, losses.info_nce(z1, z2, mapping=m.bind(scale=s))))
    True

  Returns:
    A `Mapping` with no parameters; `bind(scale=s)` fixes `s` (a float scalar).

  References:
    Guo et al., On Calibration of Modern Neural Networks, ICML 2017; Kim & Kim, arXiv
    2501.17683, Eq. 11-13.
  """
  return Mapping("calibrated_free", BatchScaled("calibrated"))


@SPECS.register("perplexity_free",
                help="free with a scale per anchor that sets its softmax's perplexity to "
                     "sqrt(N), solved by the loss (no gradient), in [1/100, 100]")
def perplexity_free() -> Mapping:
  r"""Free with a per-anchor scale that sets the softmax's perplexity to `sqrt(N_i)`.

  .. math:: s_i:\; H_i(s_i) = \tfrac12 \log N_i, \quad
            H_i(s) = \log \sum_{j \in K_i} e^{s l_{ij}} - s\, E_{p_i(s)}[l]

  Anchor `i`'s logits are `s_i 2 artanh(c_ij)` (Eq. 11 times `s_i`), `s_i` chosen as t-SNE
  calibrates its kernels: the anchor's softmax over its `N_i` candidates (under the mapping's own
  logits, without any candidate bias) has perplexity `sqrt(N_i)`, the geometric middle between
  one-hot (1) and uniform (`N_i`). `dH_i/ds = -s Var_{p_i}[l] <= 0`: one root (the losses'
  engine solves it), clipped to `[1/100, 100]`. Each `s_i` takes no gradient.

  On Example 3.3's pattern `[C, -C, ..., -C]` (`r = ((1 - C)/(1 + C))^{2 s}`, the positive's
  probability `p = 1 / (1 + (N - 1) r)`) the target is
  `-p log p - (1 - p) log((1 - p)/(N - 1)) = (1/2) log N`, whose root the tests check.

  The scale is per anchor, so the fused kernels (`implementation="pallas"`) refuse it. Calling
  the mapping on cosines needs a bound scale `[M]`, which multiplies the rows.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses, mappings
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 16))
    >>> z2 = z1 + 0.5 * jax.random.normal(jax.random.key(1), (8, 16))
    >>> m = mappings.perplexity_free()
    >>> losses.batch_scale(z1, z2, mapping=m, symmetric=True).shape   # both directions
    (16,)
    >>> bool(jnp.isfinite(losses.info_nce(z1, z2, mapping=m, symmetric=True)))
    True

  Returns:
    A `Mapping` with no parameters; `bind(scale=s)` fixes `s` (`[M]`, the loss's anchors in
    the loss's order).

  References:
    van der Maaten & Hinton, Visualizing Data using t-SNE, JMLR 2008; Kim & Kim, arXiv
    2501.17683, Eq. 6, 11 and 12.
  """
  return Mapping("perplexity_free", BatchScaled("perplexity"))


@SPECS.register("accuracy_free",
                help="free with one scale whose mean softmax entropy matches the batch's top-1 "
                     "accuracy, solved by the loss (no gradient), in [1/100, 100]")
def accuracy_free() -> Mapping:
  r"""Free with a scale as sharp as the batch's in-batch ranking has earned.

  .. math:: s:\; \frac{1}{|A|}\sum_{i \in A} H_i(s) = \frac{1}{|A|}\sum_{i \in A} H^*(a, N_i),
            \quad H^*(a, N) = -a \log a - (1 - a) \log\frac{1 - a}{N - 1}

  `a` is the in-batch top-1 accuracy, the fraction of the loss's anchors whose positive's logit
  is strictly above every negative's; `H*` the entropy of a softmax with mass `a` on one
  candidate and the rest spread evenly, `a` clipped to `[1/N_i, 1 - 1e-6]` per anchor; `H_i` the
  softmax entropy under the mapping's logits `s 2 artanh(c)` (Eq. 11), without any candidate
  bias. `mean_i H_i(s)` decreases in `s`: one root (the losses' engine solves it), clipped to
  `[1/100, 100]`.
  At chance accuracy the target is the uniform softmax (`s -> 1/100`); as the accuracy nears 1,
  a sharp one (`s -> 100`). One scale per batch, taking no gradient.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses, mappings
    >>> z = jax.random.normal(jax.random.key(0), (16, 8))
    >>> m = mappings.accuracy_free()
    >>> near = z + 0.3 * jax.random.normal(jax.random.key(2), (16, 8))
    >>> bool(losses.batch_scale(z, near, mapping=m) > 1.0)   # every positive ranks first
    True
    >>> other = jax.random.normal(jax.random.key(1), (16, 8))
    >>> round(float(losses.batch_scale(z, other, mapping=m)), 6)   # at chance: S_MIN
    0.01

  Returns:
    A `Mapping` with no parameters; `bind(scale=s)` fixes `s` (a float scalar).

  References:
    Kim & Kim, arXiv 2501.17683, Eq. 11-13.
  """
  return Mapping("accuracy_free", BatchScaled("accuracy"))
