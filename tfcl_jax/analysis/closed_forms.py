r"""Closed forms of Section 3-4's examples: losses (Eq. 3, 6, 9, 12) and gradient scales (Eq. 4, 7,
10, 13, and Eq. 10 and 13 for a scaled free mapping) at the cosine pattern [C, -C, ..., -C], plus
Example 3.1's softmax ceiling.

All functions broadcast over their array arguments (C, tau, N, t) like NumPy ufuncs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfcl_jax import _checks


def _cast(*arrays):
  dtype = _checks.float_dtype(*arrays)
  return [jnp.asarray(a, dtype) for a in arrays]


def _artanh(C: jax.Array) -> jax.Array:
  # log1p form: exact near 0 and no 1 - C cancellation before the log.
  return 0.5 * (jnp.log1p(C) - jnp.log1p(-C))


def eq3(C: jax.typing.ArrayLike, tau: jax.typing.ArrayLike) -> jax.Array:
  r"""InfoNCE loss at `[C, -C]` with division by temperature (Eq. 2-3).

  .. math:: L_i = \log\left(1 + e^{-2C/\tau}\right)

  Computed as `softplus(-2C/tau)`: the naive form overflows `exp` for small
  `tau` and loses all digits to `log(1 + tiny)` for large `C/tau`.

  Examples:
    >>> from tfcl_jax import analysis
    >>> round(analysis.eq3(0.5, 1.0).item(), 4)  # log(1 + e^-1)
    0.3133

  Args:
    C: cosine half-distance in `[-1, 1]`, float or floating array.
    tau: temperature `> 0`.

  Returns:
    The broadcast loss, float32 (float64 under x64 float64 inputs).

  References:
    Kim & Kim, arXiv 2501.17683, Example 3.2, Eq. 3.
  """
  C, tau = _cast(_checks.cosine(C), _checks.temperature(tau))
  return jax.nn.softplus(-2.0 * C / tau)


def eq4(C: jax.typing.ArrayLike, tau: jax.typing.ArrayLike) -> jax.Array:
  r"""Gradient scale `|dL_i/dC|` of Eq. 3 (Eq. 4; Figures 2 and 3).

  .. math:: \left|\frac{\partial L_i}{\partial C}\right| = \frac{2/\tau}{1 + e^{2C/\tau}}
            = \frac{2}{\tau}\,\sigma(-2C/\tau)

  The sigmoid form never evaluates `exp` of a large positive argument.

  Examples:
    >>> from tfcl_jax import analysis
    >>> round(analysis.eq4(1.0, 1.0).item(), 4)  # nonzero at the optimum C = 1
    0.2384

  Args:
    C: cosine half-distance in `[-1, 1]`.
    tau: temperature `> 0`.

  Returns:
    The broadcast gradient scale.

  References:
    Kim & Kim, arXiv 2501.17683, Example 3.2, Eq. 4.
  """
  C, tau = _cast(_checks.cosine(C), _checks.temperature(tau))
  return 2.0 / tau * jax.nn.sigmoid(-2.0 * C / tau)


def eq6(C: jax.typing.ArrayLike, tau: jax.typing.ArrayLike, N: jax.typing.ArrayLike) -> jax.Array:
  r"""InfoNCE loss at `[C, -C, ..., -C]` (one positive, `N - 1` negatives) (Eq. 5-6).

  .. math:: L_i = \log\left(1 + (N - 1)\, e^{-2C/\tau}\right)

  Computed as `softplus(log(N - 1) - 2C/tau)` (see `eq3`).

  Examples:
    >>> from tfcl_jax import analysis
    >>> round(analysis.eq6(0.5, 1.0, 2).item(), 4)  # equals Eq. 3 at N = 2
    0.3133

  Args:
    C: cosine half-distance in `[-1, 1]`.
    tau: temperature `> 0`.
    N: number of candidates (integer `>= 2`).

  Returns:
    The broadcast loss.

  References:
    Kim & Kim, arXiv 2501.17683, Example 3.3, Eq. 6.
  """
  C, tau, N = _cast(_checks.cosine(C), _checks.temperature(tau), _checks.count(N))
  return jax.nn.softplus(jnp.log(N - 1.0) - 2.0 * C / tau)


def eq7(C: jax.typing.ArrayLike, tau: jax.typing.ArrayLike, N: jax.typing.ArrayLike) -> jax.Array:
  r"""Gradient scale `|dL_i/dC|` of Eq. 6 (Eq. 7; Figure 4).

  .. math:: \left|\frac{\partial L_i}{\partial C}\right|
            = \frac{(N - 1)\, 2/\tau}{(N - 1) + e^{2C/\tau}}
            = \frac{2}{\tau}\,\sigma\left(\log(N - 1) - 2C/\tau\right)

  Examples:
    >>> from tfcl_jax import analysis
    >>> [round(analysis.eq7(1.0, 0.25, n).item(), 3) for n in (2, 16)]
    [0.003, 0.04]

  Args:
    C: cosine half-distance in `[-1, 1]`.
    tau: temperature `> 0`.
    N: number of candidates (integer `>= 2`).

  Returns:
    The broadcast gradient scale.

  References:
    Kim & Kim, arXiv 2501.17683, Example 3.3, Eq. 7.
  """
  C, tau, N = _cast(_checks.cosine(C), _checks.temperature(tau), _checks.count(N))
  return 2.0 / tau * jax.nn.sigmoid(jnp.log(N - 1.0) - 2.0 * C / tau)


def eq9(C: jax.typing.ArrayLike, t: jax.typing.ArrayLike) -> jax.Array:
  r"""InfoNCE loss at `[C, -C]` with CLIP's learnable scale `exp(t)` (Eq. 8-9).

  .. math:: L_i = \log\left(1 + e^{-2C e^t}\right)

  Examples:
    >>> from tfcl_jax import analysis
    >>> round(analysis.eq9(0.5, 0.0).item(), 4)  # t = 0 is tau = 1: Eq. 3
    0.3133

  Args:
    C: cosine half-distance in `[-1, 1]`.
    t: log inverse temperature (`tau = exp(-t)`), finite.

  Returns:
    The broadcast loss.

  References:
    Kim & Kim, arXiv 2501.17683, Example 3.4, Eq. 9; Radford et al. 2021 (CLIP).
  """
  C, t = _cast(_checks.cosine(C), _checks.log_scale(t))
  return jax.nn.softplus(-2.0 * C * jnp.exp(t))


def eq10(C: jax.typing.ArrayLike, t: jax.typing.ArrayLike) -> jax.Array:
  r"""Gradient scale `|dL_i/dt|` of Eq. 9 with respect to the learnable `t` (Eq. 10).

  .. math:: \left|\frac{\partial L_i}{\partial t}\right| = \frac{2 |C| e^t}{1 + e^{2C e^t}}
            = 2 |C| e^t\,\sigma(-2C e^t)

  Zero at `C = 0` for every `t`: `t` gets no update at the initial state.

  Examples:
    >>> from tfcl_jax import analysis
    >>> [round(analysis.eq10(c, 1.0).item(), 4) for c in (0.0, 0.5)]
    [0.0, 0.1683]

  Args:
    C: cosine half-distance in `[-1, 1]`.
    t: log inverse temperature, finite.

  Returns:
    The broadcast gradient scale.

  References:
    Kim & Kim, arXiv 2501.17683, Example 3.4, Eq. 10.
  """
  C, t = _cast(_checks.cosine(C), _checks.log_scale(t))
  scale = jnp.exp(t)
  return 2.0 * jnp.abs(C) * scale * jax.nn.sigmoid(-2.0 * C * scale)


def eq12(C: jax.typing.ArrayLike, N: jax.typing.ArrayLike) -> jax.Array:
  r"""Temperature-free InfoNCE loss at `[C, -C, ..., -C]` (Eq. 12).

  .. math:: L_i = -\log\frac{(1 + C)^2}{(1 + C)^2 + (N - 1)(1 - C)^2}
            = \operatorname{softplus}\left(\log(N - 1) - 4 \operatorname{artanh} C\right)

  The softplus form stays finite and accurate as `C -> -1` and `C -> 1`.

  Examples:
    >>> from tfcl_jax import analysis
    >>> round(analysis.eq12(0.5, 2).item(), 4)  # log(1 + 1/9)
    0.1054

  Args:
    C: cosine half-distance in `(-1, 1]`.
    N: number of candidates (integer `>= 2`).

  Returns:
    The broadcast loss.

  References:
    Kim & Kim, arXiv 2501.17683, Example 4.1, Eq. 12.
  """
  C, N = _cast(_checks.cosine(C, low_open=True), _checks.count(N))
  return jax.nn.softplus(jnp.log(N - 1.0) - 4.0 * _artanh(C))


def eq13(C: jax.typing.ArrayLike, N: jax.typing.ArrayLike) -> jax.Array:
  r"""Gradient scale `|dL_i/dC|` of the temperature-free loss (Eq. 13; Figure 5).

  .. math:: \left|\frac{\partial L_i}{\partial C}\right|
            = \frac{4 (N - 1)(1 - C)}{(1 + C)\left(N (1 - C)^2 + 4C\right)}

  Zero only at the optimum `C = 1`, for every `N`. The factor `N(1-C)^2 + 4C`
  is computed as `(1 + C)^2 + (N - 1)(1 - C)^2`, a sum of non-negative terms,
  which does not cancel for negative `C`.

  Examples:
    >>> from tfcl_jax import analysis
    >>> [round(analysis.eq13(c, 2).item(), 4) for c in (0.0, 0.5, 1.0)]
    [2.0, 0.5333, 0.0]

  Args:
    C: cosine half-distance in `(-1, 1]`.
    N: number of candidates (integer `>= 2`).

  Returns:
    The broadcast gradient scale.

  References:
    Kim & Kim, arXiv 2501.17683, Example 4.1, Eq. 13.
  """
  C, N = _cast(_checks.cosine(C, low_open=True), _checks.count(N))
  denominator = (1.0 + C) * (jnp.square(1.0 + C) + (N - 1.0) * jnp.square(1.0 - C))
  return 4.0 * (N - 1.0) * (1.0 - C) / denominator


def scaled_free_gradient_scale(C: jax.typing.ArrayLike, N: jax.typing.ArrayLike,
                               s: jax.typing.ArrayLike) -> jax.Array:
  r"""Gradient scale `|dL_i/dC|` of InfoNCE under `s 2 artanh(c)` (Eq. 13 with a scale `s`).

  .. math:: \left|\frac{\partial L_i}{\partial C}\right|
            = \frac{4 s}{1 - C^2} \frac{(N - 1) r^{2s}}{1 + (N - 1) r^{2s}},
            \qquad r = \frac{1 - C}{1 + C}

  The loss at `[C, -C, ..., -C]` is `log(1 + (N - 1) r^{2s})` (Eq. 12 with the scale). It
  generalises Eq. 13 (`s = 1`) to `mappings.n_aware_free` (`s = free_scale(N)`) and to
  `mappings.learnable_free` at a given `t` (`s = exp(t)`). Computed as
  `4 s / (1 - C^2) * sigmoid(log(N - 1) - 4 s artanh C)`: no overflow of `r^{2s}`.

  Examples:
    >>> from tfcl_jax import analysis
    >>> [round(analysis.scaled_free_gradient_scale(c, 2, 1.0).item(), 4) for c in (0.0, 0.5)]
    [2.0, 0.5333]
    >>> # s(10) = 2: free's probability at N = 2 (n_aware_free), twice its gradient
    >>> round(analysis.scaled_free_gradient_scale(0.5, 10, 2.0).item(), 4)
    1.0667

  Args:
    C: cosine half-distance in `(-1, 1)`.
    N: number of candidates (integer `>= 2`).
    s: the mapping's scale, finite and > 0.

  Returns:
    The broadcast gradient scale.

  References:
    Kim & Kim, arXiv 2501.17683, Example 4.1, Eq. 12-13.
  """
  C, N, s = _cast(_checks.cosine(C, low_open=True, high_open=True), _checks.count(N),
                  _checks.temperature(s, name="s"))
  odds = jnp.log(N - 1.0) - 4.0 * s * _artanh(C)
  return 4.0 * s / ((1.0 - C) * (1.0 + C)) * jax.nn.sigmoid(odds)


def learnable_free_t_gradient_scale(C: jax.typing.ArrayLike, N: jax.typing.ArrayLike,
                                    t: jax.typing.ArrayLike) -> jax.Array:
  r"""Gradient scale `|dL_i/dt|` of InfoNCE under `exp(t) 2 artanh(c)` (Eq. 10 for free).

  .. math:: \left|\frac{\partial L_i}{\partial t}\right|
            = 4 s \left|\operatorname{artanh} C\right|
              \frac{(N - 1) r^{2s}}{1 + (N - 1) r^{2s}},
            \qquad s = e^t, \; r = \frac{1 - C}{1 + C}

  The gradient of `mappings.learnable_free`'s `t` at `[C, -C, ..., -C]`. It generalises
  Eq. 10 (CLIP's `exp(t) cos` at `N = 2`) to the free mapping: zero at `C = 0` for every `t`, so
  `t` is left where it starts, at the free mapping (`t = 0`), until the positive moves away from
  its negatives.

  Examples:
    >>> from tfcl_jax import analysis
    >>> [round(analysis.learnable_free_t_gradient_scale(c, 2, 0.0).item(), 4)
    ...  for c in (0.0, 0.5)]
    [0.0, 0.2197]

  Args:
    C: cosine half-distance in `(-1, 1)`.
    N: number of candidates (integer `>= 2`).
    t: log-scale, finite.

  Returns:
    The broadcast gradient scale.

  References:
    Kim & Kim, arXiv 2501.17683, Example 3.4 and 4.1, Eq. 10 and 12.
  """
  C, N, t = _cast(_checks.cosine(C, low_open=True, high_open=True), _checks.count(N),
                  _checks.log_scale(t))
  s = jnp.exp(t)
  artanh = _artanh(C)
  return 4.0 * s * jnp.abs(artanh) * jax.nn.sigmoid(jnp.log(N - 1.0) - 4.0 * s * artanh)


def softmax_ceiling(tau: jax.typing.ArrayLike) -> jax.Array:
  r"""Largest softmax probability of the positive under `cos / tau` (Example 3.1).

  At the optimum `[1, -1]` the positive's softmax output is

  .. math:: \sigma(2/\tau) = \frac{1}{1 + e^{-2/\tau}} < 1,

  the representational limit of Eq. 1. The paper's text prints `sigma(2 tau)`,
  but the values it quotes, `sigma(2) = 0.88` at `tau = 1` and `sigma(20) = 0.99`
  at `tau = 0.1`, are `sigma(2/tau)`, which is what the softmax gives.
  `gradients.optimum_probability` computes the same quantity for any mapping.

  Examples:
    >>> from tfcl_jax import analysis
    >>> [round(analysis.softmax_ceiling(tau).item(), 2) for tau in (1.0, 0.1)]
    [0.88, 1.0]

  Args:
    tau: temperature `> 0`.

  Returns:
    The broadcast probability.

  References:
    Kim & Kim, arXiv 2501.17683, Example 3.1.
  """
  (tau,) = _cast(_checks.temperature(tau))
  return jax.nn.sigmoid(2.0 / tau)
