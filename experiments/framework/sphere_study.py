"""What the temperature studies on the sphere share: the InfoNCE they minimise and one step.

The studies (`experiments.sphere`, `experiments.hard_negatives`, `experiments.learnable_vs_free`)
vary the mapping of InfoNCE (`config.mappings`: `tfcl_jax.mappings.from_spec` specs) on free
unit vectors; each imports this module, never another study.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from tfcl_jax import langevin, losses


def mean_loss(z1, z2, mapping, negatives: str) -> jax.Array:
  """InfoNCE per anchor with `mapping` (a `tfcl_jax.mappings.Mapping`, its parameters bound by
  `Mapping.bind`, so the loss keeps its closed forms): symmetric over the two views for `cross`
  (both directions averaged), NT-Xent for `all`."""
  return losses.info_nce(z1, z2, mapping=mapping, negatives=negatives,
                         symmetric=negatives == "cross")


def sphere_step(loss_fn: Callable, views, params, *, lr: float, t_lr: float, scale: float = 1.0,
                key=None, beta=float("inf")):
  """One joint step of the studies: Langevin/SGD on the sphere for `views`, SGD for `params`.

  `loss_fn(views, params) -> scalar`; the views move along `scale *` their gradient
  (`scale = M` turns a mean loss into the summed potential), the mapping's parameters
  (learnable t) along `t_lr *` theirs. Returns `(loss, views, params, gradients)`.
  """
  loss, (view_grads, param_grads) = jax.value_and_grad(loss_fn, argnums=(0, 1))(views, params)
  keys = [None] * len(views) if key is None else list(jax.random.split(key, len(views)))
  views = tuple(
      langevin.langevin_step(z, scale * g, key=k, lr=lr, beta=beta)
      for z, g, k in zip(views, view_grads, keys, strict=True))
  params = jax.tree.map(lambda p, g: p - t_lr * g, params, param_grads)
  return loss, views, params, (view_grads, param_grads)
