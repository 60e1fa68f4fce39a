r"""Free mappings whose scale the loss solves from its own batch, `s 2 artanh(c)` (Eq. 11 times
`s`), and the solves: pure functions of the softmax's moments on a grid of scales.

`s` is no parameter: each loss call solves it with the embeddings held fixed (stop-gradient),
from one forward-only pass over the similarities (`tfcl_jax.losses.batch_scale`). Notation:
anchor `i`, its candidates `K_i` (positive `i+` included, `N_i = |K_i|`), `l_ij = 2 artanh(c_ij)`,
`p_ij(s)` the softmax of `s l_ij` over `K_i` (`+ b_j` where a candidate bias is included).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks
from tfcl_jax.mappings._base import Mapping, MappingFunction, ParameterCheck, positive_check
from tfcl_jax.mappings._registry import SPECS
from tfcl_jax.mappings._scaled_free import _free_logit

#: The upper bound of every solved scale: CLIP's cap of its learnt scale.
S_MAX = 100.0
#: The lower bound of every solved scale: `S_MAX` mirrored about free's `s = 1` in log space
#: (the loss's gradient is proportional to `s`: at `1/100` it stays alive).
S_MIN = 0.01
#: The exponents `k` of the grid of scales `s_k = 2^k` the pass takes the moments at: 15 points
#: covering the bounds.
GRID_EXPONENTS = tuple(range(-7, 8))
#: What each batch-scaled mapping solves for (`BatchScaled.target`).
TARGETS = ("calibrated", "perplexity", "accuracy")
# The largest accuracy the `accuracy_free` target takes: a = 1 would ask for s -> infinity. Used
# as the error rate 1 - _MAX_ACCURACY = 1e-6 (`accuracy_entropy`).
_MAX_ACCURACY = 1.0 - 1e-6
_STEP = math.log(2.0)  # the grid's spacing in u = log s
_BISECTIONS = 30


def _hermite_matrix() -> np.ndarray:
  """`[8, 8]`: the power-basis coefficients of the degree-7 polynomial on `[0, 1]` with given
  value and first three derivatives at both ends, as a matrix applied to those eight values."""
  conditions = np.array([[math.perm(i, d) * float(node) ** (i - d) if i >= d else 0.0
                          for i in range(8)] for node in (0, 1) for d in range(4)])
  return np.linalg.inv(conditions)


_HERMITE = _hermite_matrix()


class GridMoments(NamedTuple):
  r"""Per anchor, its softmax over its candidates at every grid scale `s_k = 2^k`.

  With `M_i = max_{j in K_i} l_ij` and weights `w_ij(s) = exp(s (l_ij - M_i) [+ b_j - beta])`,
  `psi_i(u) = log sum_j w_ij(e^u)` (`log Z_i(s) - s M_i` up to the bias shift), a function of
  `u = log s` whose derivatives are the softmax's cumulants `k_1 .. k_4` of `l - M_i`:
  `psi' = s k_1`, `psi'' = s k_1 + s^2 k_2`, `psi''' = s k_1 + 3 s^2 k_2 + s^3 k_3`,
  `psi'''' = s k_1 + 7 s^2 k_2 + 6 s^3 k_3 + s^4 k_4`. So `E_p[l] = M_i + psi' / s`,
  `Var_p[l] = (psi'' - psi') / s^2`, and the entropy (without a bias)
  `H_i = log Z_i - s E_p[l] = psi - psi'`, whose `n`-th derivative is `psi^(n) - psi^(n+1)`.

  Attributes:
    psi: `[M, K, 5]`, `psi_i` and its first four `u`-derivatives at the `K` grid points.
    top: `[M]`, `M_i`.
    count: `[M]`, `N_i` (float).
  """

  psi: jax.Array
  top: jax.Array
  count: jax.Array


def _solve(psi: jax.Array, target: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
           ) -> jax.Array:
  r"""The root `s` of `target(f, f', u)`, increasing in `u = log s`, from grid values of `f`.

  Brackets the root between two grid points by the signs of `target` there, interpolates `f`
  on that interval by the degree-7 Hermite polynomial through its value and three derivatives at
  both ends (`f` and `f'` of the interpolant are exact at the nodes, so the bracket holds),
  bisects `target` of the interpolant (30 steps), and clips to `[S_MIN, S_MAX]`: below the
  grid's first point `S_MIN`, above its last `S_MAX`.

  Args:
    psi: `[..., K, 4]`, `f` and its first three `u`-derivatives at the grid points.
    target: `(f [...], f' [...], u) -> [...]`, increasing in `u`.

  Returns:
    `[...]` scales.
  """
  # `target` sees `[..., K]` at the grid points and `[..., 1]` inside an interval.
  u = _STEP * jnp.asarray(GRID_EXPONENTS, psi.dtype)
  values = target(psi[..., 0], psi[..., 1], u)
  # `target <= 0` is below the root: a target that underflows to 0 at large scales (every
  # positive far ahead: L'(s) = -0) still asks for S_MAX, as its sign in exact arithmetic does.
  below = jnp.sum(values <= 0, axis=-1)
  index = jnp.clip(below - 1, 0, len(GRID_EXPONENTS) - 2)
  ends = jnp.take_along_axis(psi, jnp.stack([index, index + 1], -1)[..., None], axis=-2)
  # Per end: psi and its u-derivatives times h^d, the t-derivatives on [0, 1].
  data = (ends * _STEP ** jnp.arange(4, dtype=psi.dtype)).reshape(*ends.shape[:-2], 8)
  coefficients = data @ jnp.asarray(_HERMITE.T, psi.dtype)
  start = jnp.take(u, index)[..., None]

  def at(t):
    value = jnp.zeros_like(t)
    slope = jnp.zeros_like(t)
    for i in range(7, -1, -1):  # Horner: the value and its derivative in t together
      slope = slope * t + value
      value = value * t + coefficients[..., i, None]
    return target(value, slope / _STEP, start + _STEP * t)

  def bisect(_, bounds):
    low, high = bounds
    middle = 0.5 * (low + high)
    negative = at(middle) <= 0
    return jnp.where(negative, middle, low), jnp.where(negative, high, middle)

  zeros = jnp.zeros_like(start)  # varying as `start` does inside `shard_map`
  low, high = jax.lax.fori_loop(0, _BISECTIONS, bisect, (zeros, zeros + 1.0))
  scale = jnp.exp(start + _STEP * 0.5 * (low + high))[..., 0]
  scale = jnp.where(below == 0, S_MIN, jnp.where(below == len(GRID_EXPONENTS), S_MAX, scale))
  return jnp.clip(scale, S_MIN, S_MAX)


def _sum(x: jax.Array) -> jax.Array:
  return jnp.sum(x, axis=0)


def calibrated_scale(moments: GridMoments, positive: jax.Array, valid: jax.Array, *,
                     total: Callable[[jax.Array], jax.Array] = _sum) -> jax.Array:
  r"""`s* = argmin_s L(s)`: the maximum-likelihood scale of the batch's own loss.

  `L(s) = mean_i [log sum_{j in K_i} exp(s l_ij + b_j) - s l_{i,i+} - b_{i+}]` is convex in `s`:
  `L'(s) = mean_i (E_{p_i}[l] - l_{i,i+})`, `L''(s) = mean_i Var_{p_i}[l] >= 0`. `s*` is the root
  of `L'`, i.e. of `sum_i (M_i - l_{i,i+}) + Psi'(u) / s` with `Psi = sum_i psi_i`; `S_MIN` where
  `L'(S_MIN) >= 0`, `S_MAX` where `L'(S_MAX) <= 0`.

  Args:
    moments: `GridMoments` of every anchor (bias included in the softmax, if any).
    positive: `[M]`, `l_{i,i+}` (for SupCon, the mean of the anchor's positives' logits).
    valid: `[M]` bool, the anchors that count.
    total: the sum over anchors (`axis=0`); a sharded loss adds its `psum` over devices.

  Returns:
    A scalar; 1 where no anchor counts.
  """
  weight = valid.astype(moments.psi.dtype)
  offset = total(weight * (moments.top - positive))
  psi = total(weight[:, None, None] * moments.psi[..., :4])
  scale = _solve(psi, lambda value, slope, u: offset + slope * jnp.exp(-u))
  return jnp.where(total(weight) > 0, scale, 1.0)


def _entropy(psi: jax.Array) -> jax.Array:
  """`[..., K, 4]`: `H = psi - psi'` and its first three `u`-derivatives."""
  return psi[..., :4] - psi[..., 1:]


def _log_entropy(entropy: jax.Array) -> jax.Array:
  r"""`[..., K, 4]`: `log H` and its first three `u`-derivatives from `H`'s (the cumulant
  formulas, `r_n = H^(n) / H`: `r_1`, `r_2 - r_1^2`, `r_3 - 3 r_1 r_2 + 2 r_1^3`). The entropy
  targets are interpolated in `log H`: near a one-hot softmax `H` falls by orders of magnitude
  over one grid interval, `log H` by a few units. `H` is floored at the dtype's smallest normal
  number (a softmax one-hot to float precision)."""
  tiny = jnp.finfo(entropy.dtype).tiny
  value = jnp.maximum(entropy[..., 0], tiny)
  r1, r2, r3 = (entropy[..., n] / value for n in (1, 2, 3))
  return jnp.stack([jnp.log(value), r1, r2 - r1 * r1, r3 - 3.0 * r1 * r2 + 2.0 * r1**3], -1)


def perplexity_scale(moments: GridMoments, valid: jax.Array) -> jax.Array:
  r"""Per anchor, `s_i` such that `H_i(s_i) = (1/2) log N_i` (perplexity `sqrt(N_i)`).

  `H_i(s) = log Z_i(s) - s E_{p_i}[l] = psi_i - psi_i'`, `dH_i/ds = -s Var_{p_i}[l] <= 0`:
  decreasing from `log N_i` at `s = 0`, one root (`S_MAX` where ties keep `H_i` above the
  target), found on `log H_i` (`_log_entropy`).

  Args:
    moments: `GridMoments` of every anchor (no bias).
    valid: `[M]` bool, the anchors to solve; the others, and anchors with fewer than two
      candidates, get 1.

  Returns:
    `[M]` scales.
  """
  counted = valid & (moments.count >= 2)
  wanted = jnp.log(0.5 * jnp.log(jnp.where(counted, moments.count, 2.0)))
  scale = _solve(_log_entropy(_entropy(moments.psi)),
                 lambda value, slope, u: wanted[:, None] - value)
  return jnp.where(counted, scale, 1.0)


def accuracy_entropy(accuracy: jax.Array, count: jax.Array) -> jax.Array:
  r"""`H*(a, N) = -a log a - (1 - a) log((1 - a) / (N - 1))`, `a` clipped to `[1/N, 1 - 1e-6]`:
  the entropy of a softmax over `N` candidates with mass `a` on one and the rest spread evenly
  (`log N` at `a = 1/N`). Computed from the error rate `q = 1 - a`, as
  `-(1 - q) log1p(-q) - q log(q / (N - 1))`: `1 - 1e-6` has no float32 value, `q = 1e-6` has."""
  error = jnp.clip(1.0 - accuracy, 1.0 - _MAX_ACCURACY, 1.0 - 1.0 / count)
  return -(1.0 - error) * jnp.log1p(-error) - error * jnp.log(error / (count - 1.0))


def accuracy_scale(moments: GridMoments, correct: jax.Array, valid: jax.Array, *,
                   total: Callable[[jax.Array], jax.Array] = _sum) -> jax.Array:
  r"""`s` such that `mean_i H_i(s) = mean_i H*(a, N_i)`, `a` the batch's top-1 accuracy.

  `a` is the fraction of counted anchors whose positive scores strictly above every negative
  (`correct`); `H*` is `accuracy_entropy`. `mean_i H_i(s)` decreases in `s`: one root, found on
  `log sum_i H_i` (`_log_entropy`); `a` at chance asks for the uniform softmax (`S_MIN`),
  `a -> 1` for a sharp one (`S_MAX`).

  Args:
    moments: `GridMoments` of every anchor (no bias).
    correct: `[M]` bool, the anchor's positive is its best candidate.
    valid: `[M]` bool, the anchors that count (those with fewer than two candidates do not).

  Returns:
    A scalar; 1 where no anchor counts.
  """
  counted = valid & (moments.count >= 2)
  weight = counted.astype(moments.psi.dtype)
  anchors = total(weight)
  accuracy = total(weight * correct) / jnp.maximum(anchors, 1.0)
  wanted = jnp.log(total(weight * accuracy_entropy(accuracy, jnp.maximum(moments.count, 2.0))))
  entropy = total(weight[:, None, None] * _entropy(moments.psi))
  scale = _solve(_log_entropy(entropy), lambda value, slope, u: wanted - value)
  return jnp.where(anchors > 0, scale, 1.0)


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: a bound scale may be a tracer
class BatchScaled(MappingFunction):
  """`s 2 artanh(c)` with `s` solved by the loss for `target` (one of `TARGETS`), or bound.

  Unbound (`scale` None) it has no logits of its own: the losses solve `s` and call it bound.
  """

  target: str
  scale: jax.Array | None = None

  @property
  def per_anchor(self) -> bool:
    """Whether the scale is one per anchor (`perplexity`) rather than one per batch."""
    return self.target == "perplexity"

  def __call__(self, cos, params, step):
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
    return scale * _free_logit(cos)

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


@dataclasses.dataclass(frozen=True)
class _ScaleParameter(MappingFunction):
  """`params["scale"] 2 artanh(c)`: a solved global scale as the losses hand it to their tiles,
  a parameter, as a learnt scale is (the engine's custom VJP and the fused kernels take it; a
  closed-over value inside `shard_map` would vary unlike the tiles'). It takes no gradient: the
  losses stop it."""

  def __call__(self, cos, params, step):
    return jnp.asarray(params["scale"], cos.dtype) * _free_logit(cos)


def with_scale_parameter(mapping: Mapping, scale: jax.Array) -> Mapping:
  """`mapping`'s `s 2 artanh(c)` with `s = scale` (a scalar) as its parameter `"scale"`."""
  return Mapping(mapping.spec, _ScaleParameter(), {"scale": scale}, bound=True)


def calibrated_free() -> Mapping:
  r"""Free with the batch's maximum-likelihood scale: `s* 2 artanh(c)` (Eq. 11 times `s*`).

  .. math:: s^* = \arg\min_{s \in [1/100, 100]} \frac{1}{|A|} \sum_{i \in A}
            \Big[\log \sum_{j \in K_i} e^{s l_{ij} + b_j} - s l_{i,i+} - b_{i+}\Big],
            \quad l = 2 \operatorname{artanh}(c)

  Temperature scaling (Guo et al. 2017) on the batch the loss is computing, its embeddings held
  fixed: the loss's own anchors `A` (both directions for CLIP's loss, all `2N` rows for
  `negatives="all"`, the global batch in a sharded loss), the candidate bias (`candidate_bias`,
  logQ) inside the softmax. Convex in `s`: `L'(s) = mean_i (E_{p_i}[l] - l_{i,i+})`,
  `L''(s) = mean_i Var_{p_i}[l]`; `s*` is the root of `L'` (`calibrated_scale`), clipped to
  `[S_MIN, S_MAX] = [1/100, 100]`. `s*` takes no gradient (it is no parameter), so the loss's
  gradient is the free loss's at a fixed scale `s*`. On Example 4.1's pattern `[C, -C, ..., -C]`
  every anchor's positive already scores highest, `L'(s) < 0` for all `s`, and `s* = 100`.
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


def perplexity_free() -> Mapping:
  r"""Free with a per-anchor scale that sets the softmax's perplexity to `sqrt(N_i)`.

  .. math:: s_i:\; H_i(s_i) = \tfrac12 \log N_i, \quad
            H_i(s) = \log \sum_{j \in K_i} e^{s l_{ij}} - s\, E_{p_i(s)}[l]

  Anchor `i`'s logits are `s_i 2 artanh(c_ij)` (Eq. 11 times `s_i`), `s_i` chosen as t-SNE
  calibrates its kernels: the anchor's softmax over its `N_i` candidates (under the mapping's own
  logits, without any candidate bias) has perplexity `sqrt(N_i)`, the geometric middle between
  one-hot (1) and uniform (`N_i`). `dH_i/ds = -s Var_{p_i}[l] <= 0`: one root
  (`perplexity_scale`), clipped to `[1/100, 100]`. Each `s_i` takes no gradient.

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


def accuracy_free() -> Mapping:
  r"""Free with a scale as sharp as the batch's in-batch ranking has earned.

  .. math:: s:\; \frac{1}{|A|}\sum_{i \in A} H_i(s) = \frac{1}{|A|}\sum_{i \in A} H^*(a, N_i),
            \quad H^*(a, N) = -a \log a - (1 - a) \log\frac{1 - a}{N - 1}

  `a` is the in-batch top-1 accuracy, the fraction of the loss's anchors whose positive's logit
  is strictly above every negative's; `H*` the entropy of a softmax with mass `a` on one
  candidate and the rest spread evenly, `a` clipped to `[1/N_i, 1 - 1e-6]` per anchor; `H_i` the
  softmax entropy under the mapping's logits `s 2 artanh(c)` (Eq. 11), without any candidate
  bias. `mean_i H_i(s)` decreases in `s`: one root (`accuracy_scale`), clipped to `[1/100, 100]`.
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


SPECS.register("calibrated_free", calibrated_free,
               help="free with the batch's maximum-likelihood scale s 2 artanh(cos), s solved "
                    "by the loss from its batch (no gradient), in [1/100, 100]")
SPECS.register("perplexity_free", perplexity_free,
               help="free with a scale per anchor that sets its softmax's perplexity to "
                    "sqrt(N), solved by the loss (no gradient), in [1/100, 100]")
SPECS.register("accuracy_free", accuracy_free,
               help="free with one scale whose mean softmax entropy matches the batch's top-1 "
                    "accuracy, solved by the loss (no gradient), in [1/100, 100]")
