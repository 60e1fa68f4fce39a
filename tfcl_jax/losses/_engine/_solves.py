r"""The root solves of the batch-scaled mappings (`mappings.calibrated_free`, `perplexity_free`,
`accuracy_free`): pure functions of every anchor's softmax moments on the grid of scales
(`_moments.GridMoments`), each target's root bracketed on the grid, interpolated and bisected.

Notation: anchor `i`, its candidates `K_i` (positive `i+` included, `N_i = |K_i|`),
`l_ij = 2 artanh(c_ij)`, `p_ij(s)` the softmax of `s l_ij` over `K_i` (`+ b_j` where a candidate
bias is included).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax.losses._engine._moments import GRID_EXPONENTS, GridMoments
from tfcl_jax.mappings import S_MAX, S_MIN

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
