"""A dense float64 transcription of the batch-scaled mappings for the tests: every anchor's
candidates as dense logits, the three scales as SciPy roots of the exact `L'(s)` and `H(s)`, and
the losses at a given scale (JAX, float64, to differentiate with the scale held constant).

Written from the definitions (docs/analysis.md), not from the library's code: no grid, no
moments, no tiles.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import brentq
from scipy.special import logsumexp

S_MIN, S_MAX = 0.01, 100.0


class Dense(NamedTuple):
  """Anchors `[M]` against candidates `[C]`: cosines, which candidates are an anchor's, its
  positive's column, whether the anchor counts, and each candidate's bias as each anchor sees it
  (CLIP's two directions correct their candidates by different biases)."""

  cos: jax.Array  # [M, C]
  candidate: jax.Array  # [M, C] bool, the positive included
  positive: jax.Array  # [M] int
  valid: jax.Array  # [M] bool
  bias: jax.Array  # [M, C]


def _unit(z):
  z = jnp.asarray(z, jnp.float64)
  return z / jnp.linalg.norm(z, axis=-1, keepdims=True)


def dense(z1, z2, *, mode="cross", where=None, bank=None, bank_where=None, bias=None) -> Dense:
  """The anchors and candidates of `info_nce` (`mode`: `cross`, `symmetric`, `all`)."""
  u1, u2 = _unit(z1), _unit(z2)
  n = u1.shape[0]
  valid = jnp.ones(n, bool) if where is None else jnp.asarray(where)
  extra = jnp.zeros((0, u1.shape[1])) if bank is None else _unit(bank)
  extra_valid = jnp.ones(extra.shape[0], bool) if bank_where is None else jnp.asarray(bank_where)
  if mode == "all":
    rows = jnp.concatenate([u1, u2])
    columns = jnp.concatenate([rows, extra])
    column_valid = jnp.concatenate([valid, valid, extra_valid])
    anchor_valid = jnp.concatenate([valid, valid])
    itself = jnp.eye(2 * n, columns.shape[0], dtype=bool)
    candidate = anchor_valid[:, None] & column_valid[None, :] & ~itself
    positive = jnp.concatenate([jnp.arange(n, 2 * n), jnp.arange(n)])
    # A row with itself (cosine 1, an infinite logit) is no candidate: 0 there, no NaN gradient.
    return Dense(jnp.where(itself, 0.0, rows @ columns.T), candidate, positive, anchor_valid,
                 jnp.zeros((rows.shape[0], columns.shape[0])))

  def direction(anchors, others):
    columns = jnp.concatenate([others, extra])
    column_valid = jnp.concatenate([valid, extra_valid])
    return anchors @ columns.T, valid[:, None] & column_valid[None, :]

  def candidate_bias(b):  # [n, C]: the same for every anchor of a direction
    b = jnp.zeros(n) if b is None else jnp.asarray(b, jnp.float64)
    return jnp.broadcast_to(jnp.concatenate([b, jnp.zeros(extra.shape[0])]),
                            (n, n + extra.shape[0]))

  # `bias`: z2's rows' (the candidates of z1 -> z2), or with "symmetric" a pair (z2's, z1's).
  forward_bias, back_bias = bias if isinstance(bias, tuple) else (bias, None)
  cos, candidate = direction(u1, u2)
  all_bias = candidate_bias(forward_bias)
  if mode == "symmetric":
    cos_back, candidate_back = direction(u2, u1)
    cos, candidate = jnp.concatenate([cos, cos_back]), jnp.concatenate([candidate,
                                                                          candidate_back])
    all_bias = jnp.concatenate([all_bias, candidate_bias(back_bias)])
    valid = jnp.concatenate([valid, valid])
  positive = jnp.arange(cos.shape[0]) % n
  return Dense(cos, candidate, positive, valid, all_bias)


def free(cos):
  return jnp.log1p(cos) - jnp.log1p(-cos)


def _anchors(d: Dense, *, with_bias: bool):
  """Per counted anchor: `(logits, biases, positive logit, positive column)` in NumPy."""
  logits = np.asarray(free(d.cos))
  out = []
  for i in np.flatnonzero(np.asarray(d.valid)):
    keep = np.flatnonzero(np.asarray(d.candidate[i]))
    bias = np.asarray(d.bias)[i, keep] if with_bias else np.zeros(len(keep))
    where_positive = int(np.flatnonzero(keep == int(d.positive[i]))[0])
    out.append((logits[i, keep], bias, logits[i, int(d.positive[i])], where_positive))
  return out


def _softmax(s, logits, bias):
  x = s * logits + bias
  return np.exp(x - logsumexp(x))


def entropy(s, logits):
  p = _softmax(s, logits, 0.0)
  return float(-np.sum(p * np.log(np.where(p > 0, p, 1.0))))


def _root(g):
  """The root of an increasing `g(s)` on `[S_MIN, S_MAX]`, clipped to the bounds."""
  if g(S_MIN) >= 0:
    return S_MIN
  if g(S_MAX) <= 0:
    return S_MAX
  return float(np.exp(brentq(lambda u: g(np.exp(u)), np.log(S_MIN), np.log(S_MAX),
                             xtol=1e-13)))


def calibrated(anchors) -> float:
  """`argmin_s mean_i [logsumexp(s l + b) - s l+ - b+]`: the root of `mean_i E_p[l] - l+`."""
  def slope(s):  # E_p[l - l+]: the positive's own term exactly 0, no cancellation near 0
    return np.mean([np.sum(_softmax(s, row, b) * (row - positive))
                    for row, b, positive, _ in anchors])
  return _root(slope)


def perplexity(logits) -> float:
  """`s` with `H(s) = log(N) / 2` for one anchor's candidate logits."""
  return _root(lambda s: 0.5 * np.log(len(logits)) - entropy(s, logits))


def accuracy_target(a, count):
  a = np.clip(a, 1.0 / count, 1.0 - 1e-6)
  return -a * np.log(a) - (1 - a) * np.log((1 - a) / (count - 1))


def accuracy(anchors, correct) -> float:
  a = float(np.mean(correct))
  wanted = np.mean([accuracy_target(a, len(row)) for row, *_ in anchors])
  return _root(lambda s: wanted - np.mean([entropy(s, row) for row, *_ in anchors]))


def solve(target: str, d: Dense):
  """The reference scale of `info_nce` on `d`: a float, or `[M]` for `"perplexity"` (1 for
  anchors that do not count)."""
  anchors = _anchors(d, with_bias=target == "calibrated")
  if target == "calibrated":
    return calibrated(anchors)
  if target == "accuracy":
    correct = [positive > np.max(np.delete(row, k), initial=-np.inf)
               for row, _, positive, k in anchors]
    return accuracy(anchors, correct)
  scales = np.ones(d.cos.shape[0])
  scales[np.flatnonzero(np.asarray(d.valid))] = [perplexity(row) for row, *_ in anchors]
  return scales


def info_nce(d: Dense, scale, *, masked: bool):
  """Mean InfoNCE at `scale` (a scalar or `[M]`), dense JAX in float64."""
  scale = jnp.broadcast_to(jnp.asarray(scale, jnp.float64), d.valid.shape)[:, None]
  logits = scale * free(d.cos) + d.bias
  # Rows that do not count score every column (finite, then zeroed): no NaN in the gradient.
  candidate = d.candidate | ~d.valid[:, None]
  lse = jax.nn.logsumexp(jnp.where(candidate, logits, -jnp.inf), axis=1)
  per_row = jnp.where(d.valid, lse - jnp.take_along_axis(logits, d.positive[:, None], 1)[:, 0],
                      0.0)
  return jnp.sum(per_row) / (jnp.sum(d.valid) if masked else d.valid.shape[0])


def sigmoid(d: Dense, scale, bias: float):
  """Mean sigmoid loss at `scale`: `sum_j softplus(-y (s_i l_ij + b))` over the candidates."""
  scale = jnp.broadcast_to(jnp.asarray(scale, jnp.float64), d.valid.shape)[:, None]
  sign = jnp.where(jnp.arange(d.cos.shape[1])[None, :] == d.positive[:, None], 1.0, -1.0)
  terms = jax.nn.softplus(-sign * (scale * free(d.cos) + bias))
  return jnp.sum(jnp.where(d.candidate, terms, 0.0)) / d.valid.shape[0]


def supervised_solve(target: str, z, labels):
  """`supervised_info_nce`'s scale: candidates every other row, the positive's logit the mean
  of the positives', accuracy from the best candidate's label, over anchors with a positive."""
  u = np.asarray(_unit(z))
  labels = np.asarray(labels)
  logits = np.asarray(free(jnp.asarray(np.clip(u @ u.T, -1 + 1e-12, 1 - 1e-12))))
  n = len(labels)
  if target == "perplexity":
    return np.array([perplexity(np.delete(logits[i], i)) for i in range(n)])
  anchors, correct = [], []
  for i in range(n):
    others = np.delete(np.arange(n), i)
    same = labels[others] == labels[i]
    if not same.any():
      continue
    row = logits[i, others]
    anchors.append((row, np.zeros(len(row)), row[same].mean(), None))
    correct.append(row[same].max() > np.max(row[~same], initial=-np.inf))
  return calibrated(anchors) if target == "calibrated" else accuracy(anchors, correct)


def supervised(z, labels, scale, *, form: str):
  """`supervised_info_nce` at `scale`, dense JAX in float64."""
  u = _unit(z)
  n = u.shape[0]
  scale = jnp.broadcast_to(jnp.asarray(scale, jnp.float64), (n,))[:, None]
  logits = scale * free(jnp.clip(u @ u.T, -1 + 1e-12, 1 - 1e-12))
  same = labels[:, None] == labels[None, :]
  others = ~jnp.eye(n, dtype=bool)
  positives = same & others
  if form == "ntxent":
    negative = jax.nn.logsumexp(jnp.where(same, -jnp.inf, logits), axis=1)[:, None]
    pairs = jnp.where(positives, jax.nn.softplus(negative - logits), 0.0)
    return jnp.sum(pairs) / jnp.sum(positives)
  lse = jax.nn.logsumexp(jnp.where(others, logits, -jnp.inf), axis=1)
  count = jnp.sum(positives, axis=1)
  mean_positive = jnp.sum(jnp.where(positives, logits, 0.0), axis=1) / jnp.maximum(count, 1)
  per_anchor = jnp.where(count > 0, lse - mean_positive, 0.0)
  return jnp.sum(per_anchor) / jnp.sum(count > 0)
