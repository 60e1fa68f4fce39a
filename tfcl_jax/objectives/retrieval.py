r"""Two-tower retrieval with in-batch negatives as a `loss_fn` for `training.make_train_step`.

A batch is `B` (user, item) interaction pairs; each user's candidates are the batch's items
(in-batch negatives), scored by the towers' embeddings under a loss (`losses.Loss`, named by
a loss spec; the forms, from one-directional InfoNCE user -> item to `dot+logq`, are in
docs/specs.md).

Duplicate items in a batch stay negatives of each other's users, as in TensorFlow Recommenders'
retrieval tutorial (its `remove_accidental_hits` is off by default).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import flax.linen as nn
import jax

from tfcl_jax import losses, mappings


def gather(features: Mapping[str, jax.Array], rows: jax.Array) -> dict[str, jax.Array]:
  """Each feature table's `rows` (`[R, ...] -> [B, ...]`)."""
  return {name: table[rows] for name, table in features.items()}


def make_retrieval_loss(
    model: nn.Module,
    loss: losses.Loss | mappings.Mapping,
    *,
    user_features: Mapping[str, jax.Array],
    item_features: Mapping[str, jax.Array],
    log_q: jax.Array | None = None,
    users_log_q: jax.Array | None = None,
    reduction: str = "sum",
) -> Callable[..., tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]]:
  """`loss_fn(params, model_state, batch, key, step)` on a batch of `{"user", "item",
  "valid"}` row indices (`tfcl_jax.data.interactions.batches`).

  The towers (`models.towers.TwoTower`) embed `gather(user_features, batch["user"])` and
  `gather(item_features, batch["item"])`; the value is `loss(users, items,
  negatives="cross")` with its trainable scalars from `params["loss"]` at `step`. Padded rows
  (`valid` False) are neither anchors nor candidates. `reduction="sum"` is the tutorial's
  (Keras `Reduction.SUM`).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses
    >>> from tfcl_jax.models import towers
    >>> from tfcl_jax.objectives import retrieval
    >>> model = towers.TwoTower(
    ...     towers.Tower(vocab_sizes={"user_id": 4}, categorical=("user_id",), dim=8),
    ...     towers.Tower(vocab_sizes={"item_id": 6}, categorical=("item_id",), dim=8))
    >>> users, items = {"user_id": jnp.arange(1, 4)}, {"item_id": jnp.arange(1, 6)}
    >>> loss = losses.from_spec("free")
    >>> loss_fn = retrieval.make_retrieval_loss(model, loss, user_features=users,
    ...                                         item_features=items)
    >>> batch = {"user": jnp.array([0, 1, 2]), "item": jnp.array([4, 0, 2]),
    ...          "valid": jnp.array([True, True, True])}
    >>> params = {"model": model.init(jax.random.key(0), retrieval.gather(users, batch["user"]),
    ...                               retrieval.gather(items, batch["item"]))["params"],
    ...           "loss": loss.params}
    >>> value, _ = loss_fn(params, {}, batch, jax.random.key(1), 0)
    >>> value.shape
    ()

  Args:
    model: the two towers.
    loss: a `losses.Loss` (`losses.from_spec(...)`), or a `Mapping` (InfoNCE under it).
    user_features, item_features: `{name: [rows, ...] int}` tables (`data.movielens_features`).
    log_q: `[I]` log sampling probabilities of the items, needed by a `+logq` loss.
    users_log_q: `[U]` log sampling probabilities of the users, the candidates of the direction
      item -> user, needed by CLIP's symmetric loss with `+logq` (`clip:<mapping>+logq`).
    reduction: `"sum"` or `"mean"` over the valid anchors.

  Raises:
    ValueError: a `+logq` loss without `log_q` (or, symmetric, `users_log_q`).
  """
  loss = losses.as_loss(loss)
  if loss.logq and log_q is None:
    raise ValueError(f"loss {loss.spec!r} needs log_q, the items' log sampling probabilities.")
  both = loss.log_q_sides == 2
  if both and users_log_q is None:
    raise ValueError(f"loss {loss.spec!r} corrects both directions: it needs users_log_q, the "
                     "users' log sampling probabilities, as well as log_q.")

  def loss_fn(params, model_state, batch, key, step):
    del key
    # Flax types apply's result as either the output or (output, mutated variables).
    q, c = cast("tuple[jax.Array, jax.Array]", model.apply(
        {"params": params["model"]}, gather(user_features, batch["user"]),
        gather(item_features, batch["item"])))
    batch_log_q: losses.LogQ | None = None
    if loss.logq and log_q is not None:
      batch_log_q = log_q[batch["item"]]
      if both and users_log_q is not None:
        batch_log_q = (batch_log_q, users_log_q[batch["user"]])
    evaluation = loss.evaluate(q, c, params=params["loss"], step=step, log_q=batch_log_q,
                               negatives="cross", where=batch["valid"], reduction=reduction)
    return evaluation.value, (model_state, evaluation.metrics)

  return loss_fn
