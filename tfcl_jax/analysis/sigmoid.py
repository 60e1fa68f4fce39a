r"""Gradient scales of the sigmoid (SigLIP) loss at the paper's pattern `[C, -C, ..., -C]`.

The sigmoid analogues of Eq. 7, 10 and 13: closed forms, and the same quantities by autodiff
through `losses.sigmoid_loss` (which they check, and which extends them to any mapping).

At the pattern, one anchor scores its positive at cosine `C` and `N - 1` negatives at `-C`;
for an odd mapping `f` (`cos / tau`, `exp(t) cos`, the scaled log-odds) with `x = f(C)`:

.. math:: L = \operatorname{softplus}(-x - b) + (N - 1)\operatorname{softplus}(b - x),
  \qquad \left|\frac{\partial L}{\partial C}\right|
  = f'(C)\left[\sigma(-x - b) + (N - 1)\,\sigma(b - x)\right].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfcl_jax import _checks, losses, mappings
from tfcl_jax.analysis.pattern import as_given, paper_pattern, pattern_embeddings


def _cast(*arrays):
  dtype = _checks.float_dtype(*arrays)
  return [jnp.asarray(a, dtype) for a in arrays]


def _bracket(x, b, N):
  return jax.nn.sigmoid(-x - b) + (N - 1.0) * jax.nn.sigmoid(b - x)


def sigmoid_loss_tau(C, tau, N, *, b=0.0) -> jax.Array:
  r"""Sigmoid loss of one anchor at `[C, -C, ..., -C]` with `f = cos / tau` (SigLIP's logits).

  .. math:: L = \operatorname{softplus}(-C/\tau - b) + (N - 1)\operatorname{softplus}(b - C/\tau)

  Examples:
    >>> from tfcl_jax.analysis import sigmoid
    >>> round(sigmoid.sigmoid_loss_tau(0.0, 1.0, 2).item(), 4)  # 2 log 2
    1.3863

  Args:
    C: cosine in `[-1, 1]`; tau: temperature `> 0`; N: candidates `>= 2`; b: the bias.

  Returns:
    The broadcast loss.
  """
  C, tau, N, b = _cast(_checks.cosine(C), _checks.temperature(tau), _checks.count(N), b)
  x = C / tau
  return jax.nn.softplus(-x - b) + (N - 1.0) * jax.nn.softplus(b - x)


def sigmoid_gradient_scale_tau(C, tau, N, *, b=0.0) -> jax.Array:
  r"""`|dL/dC|` of `sigmoid_loss_tau`: the sigmoid analogue of Eq. 7.

  .. math:: \left|\frac{\partial L}{\partial C}\right|
            = \frac{1}{\tau}\left[\sigma(-C/\tau - b) + (N - 1)\,\sigma(b - C/\tau)\right]

  At the optimum `C = 1` it is `(1/tau) [sigma(-1/tau - b) + (N - 1) sigma(b - 1/tau)]`: zero
  only in the limit `tau -> 0`, and it grows with `N` (with `b = 0`: `N sigma(-1/tau) / tau`),
  the trade-off of Eq. 4 and 7 again.

  Examples:
    >>> from tfcl_jax.analysis import sigmoid
    >>> round(sigmoid.sigmoid_gradient_scale_tau(1.0, 1.0, 2).item(), 4)  # 2 sigma(-1)
    0.5379

  Args:
    C: cosine in `[-1, 1]`; tau: temperature `> 0`; N: candidates `>= 2`; b: the bias.

  Returns:
    The broadcast gradient scale.
  """
  C, tau, N, b = _cast(_checks.cosine(C), _checks.temperature(tau), _checks.count(N), b)
  return _bracket(C / tau, b, N) / tau


def sigmoid_gradient_scale_free(C, N, *, b=0.0, k=1.0) -> jax.Array:
  r"""`|dL/dC|` of the sigmoid loss with the scaled log-odds `f = 2k artanh(c)`: the sigmoid
  analogue of Eq. 13 (`k = 1` is Eq. 11's mapping).

  With `e^x = ((1 + C)/(1 - C))^k` and `f' = 2k / (1 - C^2)`:

  .. math:: \left|\frac{\partial L}{\partial C}\right| = \frac{2k}{1 - C^2}
            \left[\sigma(-x - b) + (N - 1)\,\sigma(b - x)\right]

  For `k = 1, b = 0` the sigmoids are exact, `sigma(-x) = (1 - C)/2`, and the scale is
  `N / (1 + C)`: never vanishing, but `N / 2` at the optimum `C = 1` (the loss is
  `-N log((1 + C)/2)`, linear in `1 - C` there). With a bias it is
  `(e^{-b} + (N - 1) e^{b}) / 2` at `C = 1`, smallest (`sqrt(N - 1)`) at
  `b = -log(N - 1) / 2`. With `k = 2` it vanishes at `C = 1` for every `b` (the positive's
  sigmoid then approaches 1 quadratically) and is positive elsewhere.

  Examples:
    >>> from tfcl_jax.analysis import sigmoid
    >>> [round(sigmoid.sigmoid_gradient_scale_free(c, 4).item(), 4) for c in (0.0, 1.0)]
    [4.0, 2.0]

  Args:
    C: cosine in `[-1, 1]` (`1` included: the limit is finite); N: candidates `>= 2`;
    b: the bias; k: the log-odds scale, `> 0`.

  Returns:
    The broadcast gradient scale.
  """
  C, N, b, k = _cast(_checks.cosine(C, low_open=True), _checks.count(N), b,
                     _checks.temperature(k, name="k"))
  # sigma(-x - b) = (1 - C)^k / ((1 - C)^k + e^b (1 + C)^k), etc.: the (1 - C) factors cancel
  # 1/(1 - C^2)'s pole, so C = 1 is evaluated without 0/0.
  minus, plus = (1.0 - C) ** k, (1.0 + C) ** k
  positive = 1.0 / (minus + jnp.exp(b) * plus)
  negative = (N - 1.0) / (minus + jnp.exp(-b) * plus)
  return 2.0 * k * (1.0 - C) ** (k - 1.0) / (1.0 + C) * (positive + negative)


def sigmoid_gradient_t(C, t, N, *, b=0.0) -> jax.Array:
  r"""`|dL/dt|` of the sigmoid loss with `f = exp(t) cos` (SigLIP's learnable scale): the
  sigmoid analogue of Eq. 10.

  .. math:: \left|\frac{\partial L}{\partial t}\right|
            = e^t |C| \left[\sigma(-e^t C - b) + (N - 1)\,\sigma(b - e^t C)\right]

  Zero at `C = 0` for every `t` and `b`, as Eq. 10: the bias does not give `t` a gradient at
  an orthogonal start (the bias itself does get one, `sigmoid_gradient_b`).

  Examples:
    >>> from tfcl_jax.analysis import sigmoid
    >>> sigmoid.sigmoid_gradient_t(0.0, 2.3, 8, b=-10.0).item()
    0.0

  Args:
    C: cosine in `[-1, 1]`; t: log scale; N: candidates `>= 2`; b: the bias.

  Returns:
    The broadcast gradient scale.
  """
  C, t, N, b = _cast(_checks.cosine(C), _checks.log_scale(t), _checks.count(N), b)
  x = jnp.exp(t) * C
  return jnp.abs(x) * _bracket(x, b, N)


def sigmoid_gradient_b(C, t, N, *, b=0.0) -> jax.Array:
  r"""`dL/db` of the sigmoid loss with `f = exp(t) cos` (signed).

  .. math:: \frac{\partial L}{\partial b} = -\sigma(-x - b) + (N - 1)\,\sigma(b - x),
            \quad x = e^t C

  Examples:
    >>> from tfcl_jax.analysis import sigmoid
    >>> sigmoid.sigmoid_gradient_b(0.0, 0.0, 4).item()  # (N - 2) / 2 at C = 0, b = 0
    1.0

  Args:
    C: cosine in `[-1, 1]`; t: log scale; N: candidates `>= 2`; b: the bias.

  Returns:
    The broadcast derivative.
  """
  C, t, N, b = _cast(_checks.cosine(C), _checks.log_scale(t), _checks.count(N), b)
  x = jnp.exp(t) * C
  return -jax.nn.sigmoid(-x - b) + (N - 1.0) * jax.nn.sigmoid(b - x)


def _row0_sigmoid(cosines, mapping, bias):
  z1, z2 = pattern_embeddings(cosines)
  return losses.sigmoid_loss(z1, z2, mapping=mapping, bias=bias, reduction="none")[0]


def sigmoid_gradient_scale(mapping: mappings.MappingLike, C: jax.typing.ArrayLike, N: int,
                           *, bias=0.0) -> jax.Array:
  r"""`|dL/dC|` of the sigmoid loss at `[C, -C, ..., -C]` by autodiff through `sigmoid_loss`.

  Row 0's loss (`reduction="none"`) of `losses.sigmoid_loss` on
  `pattern.pattern_embeddings([C, -C, ..., -C])`, differentiated in `C`: what the library's
  loss really produces; equal to the closed forms above and defined for any mapping.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax import mappings
    >>> from tfcl_jax.analysis import sigmoid
    >>> free = mappings.temperature_free()
    >>> scale = sigmoid.sigmoid_gradient_scale(free, jnp.array([0.0, 0.5]), 4)
    >>> [round(s, 4) for s in scale.tolist()]  # N / (1 + C)
    [4.0, 2.6667]

  Args:
    mapping: a `Mapping`, a mapping spec or a callable `cos -> logits`.
    C: cosines in the open interval `(-1, 1)`.
    N: candidates, a Python int `>= 2`.
    bias: the loss's bias `b`, a float.

  Returns:
    `|dL/dC|`, with the shape of `C`.
  """
  mapping = as_given(mapping)
  C = _checks.cosine(C, low_open=True, high_open=True)
  n = _checks.static_count(N)
  C = C.astype(_checks.float_dtype(C))
  derivative = jax.grad(lambda c: _row0_sigmoid(paper_pattern(c, n), mapping, bias))
  flat = jax.jit(jax.vmap(derivative))(C.reshape(-1))
  return jnp.abs(flat).reshape(C.shape)


def sigmoid_parameter_gradients(C: jax.typing.ArrayLike, t: jax.typing.ArrayLike, N: int, *,
                                bias: jax.typing.ArrayLike = 0.0) -> tuple[jax.Array, jax.Array]:
  r"""`(dL/dt, dL/db)` of the sigmoid loss with `learnable_temperature`, by autodiff.

  Examples:
    >>> from tfcl_jax.analysis import sigmoid
    >>> dt, db = sigmoid.sigmoid_parameter_gradients(0.0, 2.3, 4, bias=-1.0)
    >>> float(dt), round(float(db), 4)
    (0.0, 0.0758)

  Args:
    C: cosine in `(-1, 1)` (scalar or array, broadcast against `t` and `bias`).
    t: log scale `exp(t)`.
    N: candidates, a Python int `>= 2`.
    bias: the bias `b`.

  Returns:
    The signed derivatives, broadcast.
  """
  C = _checks.cosine(C, low_open=True, high_open=True)
  n = _checks.static_count(N)
  C, t, bias = _cast(C, _checks.log_scale(t), bias)
  C, t, bias = jnp.broadcast_arrays(C, t, bias)

  def loss(c, t, b):
    return _row0_sigmoid(paper_pattern(c, n), mappings.learnable_temperature(t=t), b)

  grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(1, 2))))(
      C.reshape(-1), t.reshape(-1), bias.reshape(-1))
  return tuple(g.reshape(C.shape) for g in grads)
