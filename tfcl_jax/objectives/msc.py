"""The MSC objective as a `loss_fn` for `training.make_train_step`: mean-shifted views.

Section 5.3 of Kim & Kim (arXiv 2501.17683) fine-tunes a pretrained encoder with MSC (Reiss &
Hoshen, AAAI 2023) and swaps its `cos / 0.25` (Eq. 1) for the temperature-free mapping (Eq. 11).
The loss's math (center, mean shift, angular term) is `tfcl_jax.anomaly.msc`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfcl_jax import losses, mappings
from tfcl_jax.anomaly import msc
from tfcl_jax.objectives import views


def make_msc_loss(
    encoder: nn.Module,
    *,
    loss: losses.Loss | mappings.Mapping,
    augment: views.AugmentFn,
    angular: bool = True,
) -> Callable[..., tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]]:
  """`loss_fn(params, model_state, batch, key, step)` of MSC for `training.make_train_step`.

  The encoder runs with `train=False`: BatchNorm uses and keeps its pretrained running statistics
  (MSC's code calls `model.eval()` once before fine-tuning; training-mode BatchNorm on one class
  breaks the reproduction). `model_state` holds the BatchNorm statistics and the center under
  `anomaly.msc.CENTER_KEY`; both pass through unchanged. Metrics: `contrastive`, `angular` (the
  two terms), `center_cos` (mean cosine of the features to the center), `pos_cos`, `neg_cos` (of
  the shifted features).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import mappings, models
    >>> from tfcl_jax.anomaly import msc
    >>> from tfcl_jax.objectives import msc as msc_objective
    >>> encoder = models.make_backbone("small_cnn", width=4)
    >>> images = jnp.ones((4, 8, 8, 1))
    >>> variables = jax.eval_shape(lambda: encoder.init(jax.random.key(0), images, train=False))
    >>> noise = lambda key, x: tuple(x + 0.1 * jax.random.normal(k, x.shape)
    ...                              for k in jax.random.split(key))
    >>> loss_fn = msc_objective.make_msc_loss(encoder, loss=mappings.temperature(0.25),
    ...                                       augment=noise)
    >>> model_state = {"batch_stats": variables["batch_stats"], msc.CENTER_KEY: jnp.ones(16) / 4}
    >>> params = {"model": variables["params"], "loss": {}}
    >>> loss, (new_state, metrics) = jax.eval_shape(  # traced, not compiled
    ...     loss_fn, params, model_state, {"image": images}, jax.random.key(1), 0)
    >>> sorted(metrics)
    ['angular', 'center_cos', 'contrastive', 'neg_cos', 'pos_cos']

  Args:
    encoder: a backbone `x, train=... -> [B, D]` features (`models.make_backbone(...)`).
    loss: a `losses.Loss` (`losses.from_spec(...)`: InfoNCE or the sigmoid loss, with its
      mapping), or a `Mapping` (`mappings.from_spec(...)`: InfoNCE under it, MSC's own loss).
    augment: `augment(key, images) -> (view1, view2)`.
    angular: add the angular center term.

  Returns:
    The loss function.
  """
  loss = losses.as_loss(loss)

  def loss_fn(params, model_state, batch, key, step):
    center_vector = model_state[msc.CENTER_KEY]
    variables = {k: v for k, v in model_state.items() if k != msc.CENTER_KEY}
    z1, z2, _ = views.encode_two_views(
        lambda x: (encoder.apply({"params": params["model"], **variables}, x, train=False), None),
        *augment(key, batch["image"]))
    s1, s2 = msc.mean_shift(z1, center_vector), msc.mean_shift(z2, center_vector)
    evaluation = loss.evaluate(s1, s2, params=params["loss"], step=step, negatives="all")
    contrastive = evaluation.value
    angular_term = jnp.mean(jnp.sum(s1 * s1, -1)) + jnp.mean(jnp.sum(s2 * s2, -1))
    value = contrastive + angular_term if angular else contrastive
    unit = losses.l2_normalize(jnp.concatenate([z1, z2]))
    metrics = {"contrastive": contrastive, "angular": angular_term,
               "center_cos": jnp.mean(unit @ center_vector), **views.cosine_diagnostics(s1, s2),
               **evaluation.metrics}
    return value, (model_state, metrics)

  return loss_fn
