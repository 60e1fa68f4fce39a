"""The step every Section 5 objective shares: two augmented views of a batch through one model.

SimCLR (Section 5.1), GRACE (5.2) and MSC (5.3) of Kim & Kim (arXiv 2501.17683) all draw two
random views of the same examples, encode both with the same network and compare the two sets
of representations with InfoNCE (Eq. 1, or Eq. 11 temperature-free); they differ in the views,
the network and what they do with the representations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from tfcl_jax import losses

#: `augment(key, images) -> (view1, view2)`: two random views of a batch (e.g.
#: `tfcl_jax.augment.two_views` with its recipe), float arrays `[B, H, W, C]`.
AugmentFn = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def encode_two_views(
    apply: Callable[..., Any],
    view1: jax.Array,
    view2: jax.Array,
) -> tuple[Any, Any, Any]:
  """`apply` on both views in one call (batch statistics over the 2B views); returns per view.

  `apply(views) -> (outputs, aux)`, where `outputs` is an array or a tuple of arrays with the
  views on axis 0 (concatenated `[view1; view2]`) and `aux` anything (e.g. the model's new
  BatchNorm state). Returns `(outputs of view1, outputs of view2, aux)`.

  One call rather than two is what SimCLR does: BatchNorm normalises the 2B views together, and
  the network's weights are read once.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.objectives import views
    >>> apply = lambda x: ((x.sum(-1), 2 * x), None)
    >>> (s1, d1), (s2, d2), _ = views.encode_two_views(apply, jnp.ones((2, 3)), jnp.zeros((2, 3)))
    >>> s1.tolist(), s2.tolist(), d1.shape
    ([3.0, 3.0], [0.0, 0.0], (2, 3))
  """
  if view1.shape != view2.shape:
    raise ValueError(f"view1 and view2 must have the same shape, got {view1.shape} and "
                     f"{view2.shape}.")
  outputs, aux = apply(jnp.concatenate([view1, view2], axis=0))
  halves = jax.tree.map(lambda x: jnp.split(x, 2, axis=0), outputs)
  first = jax.tree.map(lambda x: x[0], halves, is_leaf=lambda x: isinstance(x, list))
  second = jax.tree.map(lambda x: x[1], halves, is_leaf=lambda x: isinstance(x, list))
  return first, second, aux


def cosine_diagnostics(z1: jax.typing.ArrayLike, z2: jax.typing.ArrayLike) -> dict[str, jax.Array]:
  """Mean cosine of positive pairs (`z1[i], z2[i]`) and of negative pairs (`z1[i], z2[j]`, i != j).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.objectives import views
    >>> z = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    >>> {k: float(v) for k, v in views.cosine_diagnostics(z, z).items()}
    {'pos_cos': 1.0, 'neg_cos': 0.0}
  """
  u1 = losses.l2_normalize(jnp.asarray(z1, jnp.float32))
  u2 = losses.l2_normalize(jnp.asarray(z2, jnp.float32))
  cos = u1 @ u2.T
  n = cos.shape[0]
  positive = jnp.trace(cos) / n
  negative = (jnp.sum(cos) - jnp.trace(cos)) / (n * (n - 1))
  return {"pos_cos": positive, "neg_cos": negative}
