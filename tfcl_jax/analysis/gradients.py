r"""Gradient scales by autodiff through `losses.info_nce` (Section 3-4) and the hardness view
(Wang & Liu 2021): how much each negative is weighted and pushed, per mapping.

These functions differentiate the library's loss itself, so they check Eq. 4, 7, 10 and 13
against the code that trains models, and extend them to mappings with no closed form.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfcl_jax import _checks, losses, mappings
from tfcl_jax.analysis.pattern import as_given, paper_pattern, pattern_embeddings


def _row0_loss(cosines: jax.Array, mapping: mappings.Mapping) -> jax.Array:
  z1, z2 = pattern_embeddings(cosines)
  return losses.info_nce(z1, z2, mapping=mapping, reduction="none")[0]


def gradient_scale(mapping: mappings.MappingLike, C: jax.typing.ArrayLike, N: int
                   ) -> jax.Array:
  r"""`|dL_i/dC|` at the pattern `[C, -C, ..., -C]` by autodiff through `info_nce`.

  Row 0's per-row loss (`reduction="none"`) of `losses.info_nce` on
  `pattern_embeddings([C, -C, ..., -C])`, differentiated in `C`. With
  `mappings.temperature(tau)` it is Eq. 4 (`N = 2`) and Eq. 7; with
  `mappings.temperature_free()` Eq. 13; any other mapping (dynamic, annealed
  at a step) has no closed form and is read here. For a grid of `tau`, vmap over
  the mapping's argument:
  `jax.vmap(lambda tau: gradient_scale(mappings.temperature(tau), C, N))(taus)`.

  Numerics: this is the gradient `info_nce` really produces. Its softplus row
  loss gives the positive `sigmoid(lse_negatives - positive)` rather than
  `p_positive - 1`, so the value keeps its relative accuracy near the optimum
  (~1e-7 relative error in float32 up to `C = 0.999`, checked by the tests).
  Use float64 to compare with the closed forms.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax import mappings
    >>> from tfcl_jax.analysis import gradients
    >>> scale = gradients.gradient_scale(mappings.temperature_free(), jnp.array([0.0, 0.5]), 2)
    >>> [round(s, 4) for s in scale.tolist()]  # Eq. 13: 2 and 8/15
    [2.0, 0.5333]

  Args:
    mapping: a `tfcl_jax.mappings.Mapping`, a mapping spec or a callable `cos -> logits`.
    C: float or floating array of cosines in the open interval `(-1, 1)`.
    N: number of candidates, a Python int `>= 2` (static: it sets shapes).

  Returns:
    `|dL_i/dC|`, with the shape of `C`.

  References:
    Kim & Kim, arXiv 2501.17683, Eq. 4, 7 and 13.
  """
  mapping = as_given(mapping)
  C = _checks.cosine(C, low_open=True, high_open=True)
  n = _checks.static_count(N)
  C = C.astype(_checks.float_dtype(C))
  derivative = jax.grad(lambda c: _row0_loss(paper_pattern(c, n), mapping))
  # One compiled program: op-by-op eager dispatch of the vmapped grad is ~10x slower.
  flat = jax.jit(jax.vmap(derivative))(C.reshape(-1))
  return jnp.abs(flat).reshape(C.shape)


def temperature_gradient_scale(C: jax.typing.ArrayLike, t: jax.typing.ArrayLike) -> jax.Array:
  r"""`|dL_i/dt|` of CLIP's learnable temperature at `[C, -C]` by autodiff (Eq. 10).

  Row 0's loss of `info_nce` with `mappings.learnable_temperature(t)` at `N = 2`,
  differentiated in `t`. Broadcasts `C` against `t`.

  Examples:
    >>> from tfcl_jax.analysis import gradients
    >>> [round(s, 4) for s in gradients.temperature_gradient_scale([0.0, 0.5], 1.0).tolist()]
    [0.0, 0.1683]

  Args:
    C: float or floating array of cosines in `(-1, 1)`.
    t: log inverse temperature (`tau = exp(-t)`), finite; broadcasts with `C`.

  Returns:
    `|dL_i/dt|` with the broadcast shape of `C` and `t`.

  References:
    Kim & Kim, arXiv 2501.17683, Eq. 10; Radford et al. 2021 (CLIP).
  """
  C = _checks.cosine(C, low_open=True, high_open=True)
  t = _checks.log_scale(t)
  dtype = _checks.float_dtype(C, t)
  C, t = jnp.broadcast_arrays(C.astype(dtype), t.astype(dtype))

  def loss(t_value, c):
    return _row0_loss(paper_pattern(c, 2), mappings.learnable_temperature(t=t_value))

  flat = jax.jit(jax.vmap(jax.grad(loss)))(t.reshape(-1), C.reshape(-1))
  return jnp.abs(flat).reshape(C.shape)


def optimum_probability(mapping: mappings.MappingLike, *, N: int = 2) -> jax.Array:
  r"""The positive's softmax probability at the optimum `[1, -1, ..., -1]` (Example 3.1).

  `softmax(f([1, -1, ..., -1]))[0]` for the mapping `f`. With
  `temperature(tau)` and `N = 2` it is `closed_forms.softmax_ceiling(tau)`
  `= sigma(2/tau) < 1`; with `temperature_free()` the logits are unbounded in
  theory and limited only by `mappings.max_free_logit` in practice, so it is 1
  to float32 precision.

  Examples:
    >>> from tfcl_jax import mappings
    >>> from tfcl_jax.analysis import gradients
    >>> round(gradients.optimum_probability(mappings.temperature(1.0)).item(), 4)
    0.8808
    >>> gradients.optimum_probability(mappings.temperature_free()).item()
    1.0

  Args:
    mapping: a `Mapping`, a mapping spec or a callable `cos -> logits`.
    N: number of candidates, a Python int `>= 2` (keyword-only).

  Returns:
    A float32 scalar (float64 under x64).
  """
  mapping = as_given(mapping)
  n = _checks.static_count(N)
  cosines = jnp.concatenate([jnp.ones((1,)), -jnp.ones((n - 1,))])
  return jax.nn.softmax(mapping(cosines))[0]


def _hardness_inputs(cos_positive, cos_negatives):
  cos_positive = _checks.cosine(cos_positive, name="cos_positive")
  cos_negatives = _checks.cosine(cos_negatives, name="cos_negatives")
  if cos_negatives.ndim < 1 or cos_negatives.shape[-1] < 1:
    raise ValueError(f"cos_negatives must have a last axis of negatives ([..., K], K >= 1), "
                     f"got shape {cos_negatives.shape}.")
  dtype = _checks.float_dtype(cos_positive, cos_negatives)
  batch = jnp.broadcast_shapes(cos_positive.shape, cos_negatives.shape[:-1])
  cos_positive = jnp.broadcast_to(cos_positive.astype(dtype), batch)
  cos_negatives = jnp.broadcast_to(cos_negatives.astype(dtype), batch + cos_negatives.shape[-1:])
  return cos_positive, cos_negatives


def negative_weights(
    mapping: mappings.MappingLike, cos_positive: jax.typing.ArrayLike,
    cos_negatives: jax.typing.ArrayLike
) -> jax.Array:
  r"""Softmax weight of each negative: the hardness-aware weighting (Wang & Liu 2021).

  .. math:: w_k = \frac{e^{f(s_k)}}{e^{f(s_+)} + \sum_j e^{f(s_j)}}

  The gradient of `L_i` in the logit of negative `k` is `w_k`; together with the
  positive's probability `1 - sum_k w_k` they sum to 1. A harder negative
  (larger `s_k`) gets more weight; how much more depends on the mapping: `cos/tau`
  grows as `e^{s/tau}`, the temperature-free mapping as `((1 + s)/(1 - s))^2`.

  Examples:
    >>> from tfcl_jax import mappings
    >>> from tfcl_jax.analysis import gradients
    >>> w = gradients.negative_weights(mappings.temperature(0.5), 0.8, [0.0, 0.4])
    >>> [round(x, 4) for x in w.tolist()]
    [0.1223, 0.2721]

  Args:
    mapping: a `Mapping`, a mapping spec or a callable `cos -> logits`.
    cos_positive: `[...]` cosine of the positive pair, in `[-1, 1]`.
    cos_negatives: `[..., K]` cosines of the `K` negatives, in `[-1, 1]`.

  Returns:
    `[..., K]` weights.

  References:
    Wang & Liu, Understanding the Behaviour of Contrastive Loss, CVPR 2021.
  """
  mapping = as_given(mapping)
  cos_positive, cos_negatives = _hardness_inputs(cos_positive, cos_negatives)
  logits = mapping(jnp.concatenate([cos_positive[..., None], cos_negatives], axis=-1))
  return jax.nn.softmax(logits, axis=-1)[..., 1:]


def negative_gradients(
    mapping: mappings.MappingLike, cos_positive: jax.typing.ArrayLike,
    cos_negatives: jax.typing.ArrayLike
) -> jax.Array:
  r"""`dL_i/ds_k`: the push each negative's cosine receives, by autodiff through `info_nce`.

  .. math:: \frac{\partial L_i}{\partial s_k} = w_k\, f'(s_k)

  with `w_k` from `negative_weights`. For `cos/tau` this is `w_k / tau`
  (Wang & Liu's hardness-aware gradient); the temperature-free mapping multiplies
  by `f'(s) = 2/(1 - s^2)`, which grows without bound for near-duplicate
  negatives.

  Examples:
    >>> from tfcl_jax import mappings
    >>> from tfcl_jax.analysis import gradients
    >>> g = gradients.negative_gradients(mappings.temperature(0.5), 0.8, [0.0, 0.4])
    >>> [round(x, 4) for x in g.tolist()]  # weights / tau
    [0.2445, 0.5442]

  Args:
    mapping: a `Mapping`, a mapping spec or a callable `cos -> logits`.
    cos_positive: `[...]` cosine of the positive pair, in `(-1, 1)`.
    cos_negatives: `[..., K]` cosines of the negatives, in `(-1, 1)`.

  Returns:
    `[..., K]` gradients (non-negative for increasing mappings).

  References:
    Wang & Liu, CVPR 2021.
  """
  mapping = as_given(mapping)
  _checks.cosine(cos_positive, name="cos_positive", low_open=True, high_open=True)
  _checks.cosine(cos_negatives, name="cos_negatives", low_open=True, high_open=True)
  cos_positive, cos_negatives = _hardness_inputs(cos_positive, cos_negatives)
  batch = cos_positive.shape
  k = cos_negatives.shape[-1]

  def gradient(positive, negatives):
    return jax.grad(lambda s: _row0_loss(jnp.concatenate([positive[None], s]), mapping))(negatives)

  flat = jax.jit(jax.vmap(gradient))(cos_positive.reshape(-1), cos_negatives.reshape(-1, k))
  return flat.reshape(batch + (k,))


