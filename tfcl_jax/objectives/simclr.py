"""The SimCLR objective as a `loss_fn` for `training.make_train_step`: two views, InfoNCE.

Section 5.1 of Kim & Kim (arXiv 2501.17683) trains SimCLR with NT-Xent (Eq. 1, `cos / tau`) or
with the temperature-free mapping (Eq. 11); the mapping is the only difference. With labels, the
same two views train SupCon (Khosla et al. 2020): positives are the views of one class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfcl_jax import losses, mappings
from tfcl_jax.objectives import views as views_lib

#: The forms of SupCon, as `losses.supervised_info_nce` names them (`form=`).
FORMS = ("supcon", "ntxent")


def make_simclr_loss(
    model: nn.Module,
    *,
    loss: losses.Loss | mappings.Mapping,
    augment: views_lib.AugmentFn,
    negatives: str = "all",
    form: str | None = None,
) -> Callable[..., tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]]:
  """`loss_fn(params, model_state, batch, key, step)` for SimCLR on `batch["image"]`.

  Both views go through the model in one call (BatchNorm statistics over the 2B views, as in
  SimCLR); the value is `loss(z1, z2, negatives=negatives)` with its trainable scalars from
  `params["loss"]` at `step`: InfoNCE (Eq. 1 for `tau=...`, Eq. 11 for `free`) or the
  sigmoid loss (SigCLR), as the loss (`losses.Loss`) names it.
  Metrics: `pos_cos`, `neg_cos` (`views.cosine_diagnostics` of the projections).

  With a `form` (SupCon, Khosla et al. 2020), the positives of a view are every other view
  of its class: the value is `losses.supervised_info_nce` of the `2B` projections
  `z = [z1; z2]` with labels `y = [batch["label"]; batch["label"]]`, under the loss's mapping
  (bound to `params["loss"]` at `step`) and that `form`; the other view of the same image is
  one positive among those of its class.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import mappings, models
    >>> from tfcl_jax.objectives import simclr
    >>> model = models.make_contrastive_model("small_cnn", width=4, projection_hidden_dim=8,
    ...                                       projection_dim=4)
    >>> noise = lambda key, x: tuple(x + 0.1 * jax.random.normal(k, x.shape)
    ...                              for k in jax.random.split(key))
    >>> loss_fn = simclr.make_simclr_loss(model, loss=mappings.temperature_free(),
    ...                                   augment=noise)
    >>> images = jnp.zeros((4, 8, 8, 1))
    >>> variables = jax.eval_shape(lambda: model.init(jax.random.key(0), images, train=False))
    >>> params = {"model": variables["params"], "loss": {}}
    >>> loss, (model_state, metrics) = jax.eval_shape(  # shapes only; jit it to run it
    ...     loss_fn, params, {"batch_stats": variables["batch_stats"]}, {"image": images},
    ...     jax.random.key(1), 0)
    >>> loss.shape, sorted(metrics)
    ((), ['neg_cos', 'pos_cos'])
    >>> supcon_fn = simclr.make_simclr_loss(model, loss=mappings.temperature(0.1),
    ...                                     augment=noise, form="supcon")
    >>> batch = {"image": images, "label": jnp.array([0, 1, 0, 1])}
    >>> jax.eval_shape(supcon_fn, params, {"batch_stats": variables["batch_stats"]}, batch,
    ...                jax.random.key(1), 0)[0].shape
    ()

  Args:
    model: returns `(features, projections)` given `(images, train=...)`
      (`models.ContrastiveModel`).
    loss: a `losses.Loss` (`losses.from_spec(...)`: InfoNCE or the sigmoid loss, with its
      mapping and bias), or a `Mapping` (`mappings.from_spec(...)`: InfoNCE under it).
    augment: `augment(key, images) -> (view1, view2)`, e.g.
      `functools.partial(tfcl_jax.augment.two_views, recipe="digits")`.
    negatives: `"all"` (SimCLR's 2N-2 negatives) or `"cross"`; `"all"` with a `form`.
    form: None (SimCLR, no labels: a view's one positive is the other view of its image), or
      SupCon in a form of `losses.supervised_info_nce`: `"supcon"` (Khosla et al.'s `L_out`:
      every other view in the denominator) or `"ntxent"` (each positive pair against the
      anchor's negatives only); positives share `batch["label"]` (`[B]` int).

  Returns:
    The loss function.

  Raises:
    ValueError: an unknown `form`, or a `form` with a loss other than InfoNCE under a mapping
      (a mapping spec) or with `negatives="cross"`.

  References:
    Chen et al. 2020, "A Simple Framework for Contrastive Learning of Visual
    Representations"; Khosla et al. 2020, "Supervised Contrastive Learning", Eq. 2.
  """
  loss = losses.as_loss(loss)
  if form is not None:
    if form not in FORMS:
      raise ValueError(f"form must be None (SimCLR) or one of {', '.join(map(repr, FORMS))} "
                       f"(SupCon), got {form!r}.")
    if not loss.supervised_form:
      raise ValueError(f"form={form!r} takes an InfoNCE loss (a mapping spec), got "
                       f"{loss.spec!r}.")
    if negatives != "all":
      raise ValueError(f"form={form!r} compares every view with every other "
                       f"(negatives='all'), got negatives={negatives!r}.")

  def loss_fn(params, model_state, batch, key, step):
    def apply(views):
      (_, projections), new_model_state = model.apply(
          {"params": params["model"], **model_state}, views, train=True,
          mutable=list(model_state))
      return projections, new_model_state

    z1, z2, new_model_state = views_lib.encode_two_views(apply, *augment(key, batch["image"]))
    if form is None:
      evaluation = loss.evaluate(z1, z2, params=params["loss"], step=step, negatives=negatives)
    else:
      labels = jnp.concatenate([batch["label"], batch["label"]])
      evaluation = loss.supervised(jnp.concatenate([z1, z2]), labels, form=form,
                                   params=params["loss"], step=step)
    return evaluation.value, (new_model_state, {**views_lib.cosine_diagnostics(z1, z2),
                                                **evaluation.metrics})

  return loss_fn


def make_feature_fn(model: nn.Module) -> Callable[[Any, Any, jax.Array], jax.Array]:
  """`features(model_params, model_state, images) -> [B, F]` backbone features, eval mode, jitted.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import models
    >>> from tfcl_jax.objectives import simclr
    >>> model = models.make_contrastive_model("small_cnn", width=4, projection_hidden_dim=8,
    ...                                       projection_dim=4)
    >>> images = jnp.zeros((3, 8, 8, 1))
    >>> variables = jax.eval_shape(lambda: model.init(jax.random.key(0), images, train=False))
    >>> features = simclr.make_feature_fn(model)
    >>> jax.eval_shape(features, variables["params"], {"batch_stats": variables["batch_stats"]},
    ...                images).shape
    (3, 16)
  """

  @jax.jit
  def features(model_params, model_state, images):
    return model.apply({"params": model_params, **model_state}, images,
                       method=lambda module, x: module.features(x))

  return features


def embed(
    feature_fn: Callable[[Any, Any, jax.Array], jax.Array],
    model_params: Any,
    model_state: Any,
    images: Any,
    *,
    batch_size: int = 512,
    preprocess: Callable[[Any], jax.Array] | None = None,
) -> jax.Array:
  """Features of `images` in chunks of `batch_size` (the last chunk padded, so one compile)."""
  chunks = []
  n = len(images)
  for start in range(0, n, batch_size):
    chunk = images[start:start + batch_size]
    size = len(chunk)
    chunk = jnp.asarray(chunk if preprocess is None else preprocess(chunk))
    if size < batch_size and n > batch_size:
      chunk = jnp.concatenate([chunk, jnp.zeros((batch_size - size, *chunk.shape[1:]),
                                                chunk.dtype)])
    chunks.append(feature_fn(model_params, model_state, chunk)[:size])
  return jnp.concatenate(chunks)
