r"""Mean-Shifted Contrastive (MSC) loss: fine-tune a pretrained encoder on one normal class.

Section 5.3 of Kim & Kim (arXiv 2501.17683) swaps MSC's `cos / 0.25` (Eq. 1) for the
temperature-free mapping (Eq. 11); everything else follows Reiss & Hoshen (AAAI 2023) and their
code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from tfcl_jax import _checks, losses, mappings

#: The key of `TrainState.model_state` that holds the center during fine-tuning, a non-trained
#: variable of the objective, replicated and checkpointed with the BatchNorm statistics.
CENTER_KEY = "msc_center"


def center(features: jax.typing.ArrayLike) -> jax.Array:
  r"""MSC's center: the normalised mean of the L2-normalised features of the normal training set.

  .. math:: c = \frac{\bar u}{\|\bar u\|}, \quad \bar u = \frac1M \sum_j \frac{f(x_j)}{\|f(x_j)\|}

  Computed once, before fine-tuning, from the pretrained encoder.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.anomaly import msc
    >>> msc.center(jnp.array([[2.0, 0.0], [0.0, 3.0]])).tolist()
    [0.7071067690849304, 0.7071067690849304]

  Args:
    features: `[M, D]` float features of the normal training examples, `M >= 1`.

  Returns:
    `[D]` float32 unit vector.

  Raises:
    ValueError: no features, non-finite features, or a zero mean direction (no center).
  """
  features = _checks.float_matrix(features, name="features")
  if features.shape[0] == 0:
    raise ValueError("features must hold at least one normal training example, got M = 0.")
  mean = jnp.mean(losses.l2_normalize(features.astype(_checks.compute_dtype(features.dtype))), 0)
  if _checks.is_concrete(mean):
    if not bool(jnp.all(jnp.isfinite(mean))):
      raise ValueError("features contain NaN or inf: no center (check the encoder's weights).")
    if not float(jnp.linalg.norm(mean)) > 1e-6:
      raise ValueError("the mean of the normalised features is ~0: the center has no direction.")
  return losses.l2_normalize(mean)


def _check_center(center_vector, features: jax.Array) -> jax.Array:
  center_vector = jnp.asarray(center_vector)
  if center_vector.shape != (features.shape[1],):
    raise ValueError(f"center must have shape [D] = ({features.shape[1]},), got "
                     f"{center_vector.shape}.")
  return center_vector


def mean_shift(features: jax.typing.ArrayLike, center_vector: jax.typing.ArrayLike) -> jax.Array:
  r"""`u - c` with `u = f(x) / ||f(x)||`: the mean-shifted features (before re-normalisation).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.anomaly import msc
    >>> msc.mean_shift(jnp.array([[0.0, 2.0]]), jnp.array([1.0, 0.0])).tolist()
    [[-1.0, 1.0]]
  """
  features = _checks.float_matrix(features, name="features")
  center_vector = _check_center(center_vector, features)
  return losses.l2_normalize(features.astype(_checks.compute_dtype(features.dtype))) - center_vector


def angular_center_loss(
    z1: jax.typing.ArrayLike, z2: jax.typing.ArrayLike, *, center: jax.typing.ArrayLike
) -> jax.Array:
  r"""MSC's angular center term: `mean_i ||u1_i - c||^2 + mean_i ||u2_i - c||^2`.

  On unit vectors `||u - c||^2 = 2 - 2 cos(u, c)`: it pulls both views toward the center.
  The sum of the two views' means (not their average) is what MSC's code adds to the loss.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.anomaly import msc
    >>> z = jnp.array([[0.0, 1.0], [1.0, 0.0]])
    >>> float(msc.angular_center_loss(z, z, center=jnp.array([1.0, 0.0])))
    2.0
  """
  s1, s2 = mean_shift(z1, center), mean_shift(z2, center)
  return jnp.mean(jnp.sum(s1 * s1, -1)) + jnp.mean(jnp.sum(s2 * s2, -1))


def msc_loss(
    z1: jax.typing.ArrayLike,
    z2: jax.typing.ArrayLike,
    *,
    center: jax.typing.ArrayLike,
    mapping: mappings.MappingLike | None = None,
    angular: bool = True,
) -> jax.Array:
  r"""The MSC objective of two views: InfoNCE on mean-shifted features plus the angular center term.

  With `u = f(x) / ||f(x)||` and the center `c` (`center`),

  .. math:: L = L_{\text{NT-Xent}}\Big(\frac{u_1 - c}{\|u_1 - c\|}, \frac{u_2 - c}{\|u_2 - c\|}\Big)
     + [\text{angular}] \big(\overline{\|u_1 - c\|^2} + \overline{\|u_2 - c\|^2}\big)

  where NT-Xent is `losses.info_nce(negatives="all")` with `mapping` (Eq. 1 for
  `temperature(0.25)`, MSC's choice; Eq. 11 for `temperature_free()`, the default here, as in
  every loss of the library). `info_nce` re-normalises the shifted features.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import mappings
    >>> from tfcl_jax.anomaly import msc
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 16))
    >>> z2 = z1 + 0.1 * jax.random.normal(jax.random.key(1), (8, 16))
    >>> c = msc.center(z1)
    >>> tau = mappings.temperature(0.25)  # MSC's choice; the default is temperature-free
    >>> jax.jit(lambda a, b: msc.msc_loss(a, b, center=c, mapping=tau))(z1, z2).shape
    ()

  Args:
    z1: `[N, D]` float features of the first views (`N >= 2`).
    z2: `[N, D]` float features of the second views.
    center: `[D]` the center (`center(...)` of the normal training features).
    mapping: a `Mapping`, a mapping spec or a callable `cos -> logits`; default
      `mappings.temperature_free()`.
    angular: add the angular center term (MSC's `--angular`, used for its results).

  Returns:
    A float32 scalar.

  References:
    Reiss & Hoshen, Mean-Shifted Contrastive Loss for Anomaly Detection, AAAI 2023, Eq. 3-5;
    Kim & Kim, arXiv 2501.17683, Section 5.3, Eq. 1 and 11.
  """
  s1, s2 = mean_shift(z1, center), mean_shift(z2, center)
  loss = losses.info_nce(s1, s2, mapping=mapping, negatives="all")
  if angular:
    loss = loss + jnp.mean(jnp.sum(s1 * s1, -1)) + jnp.mean(jnp.sum(s2 * s2, -1))
  return loss


def freeze(
    tx: optax.GradientTransformation, params: Any, *, frozen: Sequence[str]
) -> optax.GradientTransformation:
  """`tx` for the encoder's parameters except the top-level modules named in `frozen` (no update).

  MSC freezes `conv1, bn1, layer1, layer2` of its ResNet-152; with `models.ResNet` that is
  `("Conv_0", "BatchNorm_0", "BasicBlock_0", ..., "BasicBlock_{blocks of stages 1-2 - 1}")`.
  Frozen parameters get no update at all (no weight decay either).

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> from tfcl_jax.anomaly import msc
    >>> params = {"model": {"Conv_0": {"kernel": jnp.ones(2)}, "Conv_1": {"kernel": jnp.ones(2)}},
    ...           "loss": {}}
    >>> tx = msc.freeze(optax.sgd(1.0), params, frozen=["Conv_0"])
    >>> grads = jax.tree.map(jnp.ones_like, params)
    >>> updates, _ = tx.update(grads, tx.init(params), params)
    >>> updates["model"]["Conv_0"]["kernel"].tolist(), updates["model"]["Conv_1"]["kernel"].tolist()
    ([0.0, 0.0], [-1.0, -1.0])

  Args:
    tx: the optimiser of the trained parameters.
    params: `TrainState.params`, `{"model": encoder params, "loss": ...}`.
    frozen: names of top-level modules of `params["model"]`.

  Returns:
    An `optax.GradientTransformation`; `tx` itself when `frozen` is empty.

  Raises:
    ValueError: a name in `frozen` is not a module of the encoder (the known ones are listed).
  """
  frozen = [str(name) for name in frozen]
  if not frozen:
    return tx
  unknown = sorted(set(frozen) - set(params["model"]))
  if unknown:
    raise ValueError(f"frozen names {unknown} are not modules of the encoder; its modules are "
                     f"{sorted(params['model'])}.")
  labels = {
      "model": {name: jax.tree.map(lambda _, f=(name in frozen): "frozen" if f else "trained", sub)
                for name, sub in params["model"].items()},
      "loss": jax.tree.map(lambda _: "trained", params["loss"]),
  }
  return optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, labels)
