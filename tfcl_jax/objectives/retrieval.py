r"""Two-tower retrieval with in-batch negatives as a `loss_fn` for `training.make_train_step`.

A batch is `B` (user, item) interaction pairs; each user's candidates are the batch's items
(in-batch negatives), scored by the towers' embeddings. The objective is named by a spec:

* `<loss spec>`: one-directional InfoNCE, user -> item (the recommender form; YouTube's and
  TensorFlow Recommenders' in-batch softmax) under the loss spec's mapping
  (`tau=0.1`, `free`, `learnable=0.07:100`, ... : `tfcl_jax.losses.from_spec`);
* `clip:<mapping spec>`: CLIP's symmetric loss, user -> item and item -> user;
* `sigmoid/...`: SigLIP's sigmoid loss (`sigmoid/learnable=0.1/learn_b=siglip`);
* `dot`: the tutorial's own loss, a softmax over raw dot products `q . c` (no normalisation,
  no map);
* a `+logq` suffix (one-directional forms and `dot`): the sampling-bias correction, each
  candidate's logit minus `log q_j` (Yi et al. 2019; `losses.info_nce(candidate_bias=...)`).

Duplicate items in a batch stay negatives of each other's users, as in the tutorial (its
`remove_accidental_hits` is off by default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfcl_jax import losses

#: The objective's forms (`RetrievalSpec.form`).
FORMS = ("query", "clip", "sigmoid", "dot")
#: The spec suffix that adds the logQ correction.
LOGQ_SUFFIX = "+logq"
#: The forms of a retrieval spec, one a line (`parse_spec`'s errors print them).
SPEC_FORMS = (
    "<loss spec>          one-directional InfoNCE user -> item, e.g. free, tau=0.1",
    "clip:<mapping>       CLIP's symmetric loss, e.g. clip:learnable=0.07:100",
    "sigmoid/...          the sigmoid loss, e.g. sigmoid/learnable=0.1/learn_b=siglip",
    "dot                  softmax over raw dot products (the TFRS tutorial's loss)",
    "...+logq             with the logQ correction (one-directional forms and dot)",
)


@dataclasses.dataclass(frozen=True)
class RetrievalSpec:
  """A parsed retrieval objective: its canonical `spec`, `form` (one of `FORMS`), the
  `loss` (a `losses.LossSpec`; None for `dot`) and whether it corrects by `log q`."""

  spec: str
  form: str
  loss: losses.LossSpec | None
  logq: bool = False

  @property
  def params(self) -> dict:
    """The trainable scalars (`loss.params`), for the train state's `"mapping"` entry."""
    return {} if self.loss is None else self.loss.params

  @property
  def cosine(self) -> bool:
    """Whether the model's scores are cosines (every form but `dot`)."""
    return self.form != "dot"


def parse_spec(text: str, *, num_candidates: int | None = None) -> RetrievalSpec:
  """Parses a retrieval objective (see the module docstring).

  Examples:
    >>> from tfcl_jax.objectives import retrieval
    >>> s = retrieval.parse_spec(" clip:learnable=0.07:100 ")
    >>> s.spec, s.form, sorted(s.params)
    ('clip:learnable=0.07:100', 'clip', ['t'])
    >>> retrieval.parse_spec("free+logq").spec, retrieval.parse_spec("dot").loss
    ('free+logq', None)

  Args:
    text: the spec.
    num_candidates: candidates per anchor, for a sigmoid loss's `prior` bias.

  Raises:
    ValueError: a malformed spec, listing the accepted forms.
  """
  if not isinstance(text, str):
    raise TypeError(f"retrieval spec must be a str, got {type(text).__name__}.")
  body = text.strip().replace(" ", "")
  logq = body.endswith(LOGQ_SUFFIX)
  if logq:
    body = body[:-len(LOGQ_SUFFIX)]
  try:
    if body == "dot":
      form, loss = "dot", None
    elif body.startswith("clip:"):
      form, loss = "clip", losses.from_spec(body[len("clip:"):], num_candidates=num_candidates)
      if loss.loss != "info_nce":
        raise ValueError("clip: takes a mapping (CLIP's loss is InfoNCE); the sigmoid loss is "
                         "written sigmoid/...")
    else:
      loss = losses.from_spec(body, num_candidates=num_candidates)
      form = "sigmoid" if loss.loss == "sigmoid" else "query"
    if logq and form in ("clip", "sigmoid"):
      raise ValueError(f"{LOGQ_SUFFIX} corrects the user -> item softmax; the {form} form "
                       "scores both directions")
  except ValueError as error:
    forms = "\n  ".join(SPEC_FORMS)
    raise ValueError(f"Invalid retrieval spec {text!r}: {str(error).splitlines()[0]}\n"
                     f"Accepted forms:\n  {forms}") from None
  name = "dot" if loss is None else loss.spec
  name = f"clip:{name}" if form == "clip" else name
  return RetrievalSpec(name + (LOGQ_SUFFIX if logq else ""), form, loss, logq)


def dot_product_softmax(q: jax.Array, c: jax.Array, *, where: jax.Array | None = None,
                        candidate_bias: jax.Array | None = None,
                        reduction: str = "sum") -> jax.Array:
  """The tutorial's loss: `-log softmax_j(<q_i, c_j> + b_j)` at `j = i`, over valid pairs.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.objectives import retrieval
    >>> q = c = jnp.eye(3)
    >>> round(float(retrieval.dot_product_softmax(q, c, reduction="mean")), 4)
    0.5514
  """
  logits = q @ c.T
  if candidate_bias is not None:
    logits = logits + jax.lax.stop_gradient(candidate_bias)[None, :]
  valid = jnp.ones(q.shape[0], bool) if where is None else where
  logits = jnp.where(valid[None, :], logits, -jnp.inf)
  per_row = jax.nn.logsumexp(logits, axis=1) - jnp.diagonal(logits)
  per_row = jnp.where(valid, per_row, 0.0)
  if reduction == "sum":
    return jnp.sum(per_row)
  if reduction == "mean":
    return jnp.sum(per_row) / jnp.maximum(jnp.sum(valid), 1)
  raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}.")


def gather(features: Mapping[str, jax.Array], rows: jax.Array) -> dict[str, jax.Array]:
  """Each feature table's `rows` (`[R, ...] -> [B, ...]`)."""
  return {name: table[rows] for name, table in features.items()}


def make_retrieval_loss(
    model: nn.Module,
    objective: RetrievalSpec,
    *,
    user_features: Mapping[str, jax.Array],
    item_features: Mapping[str, jax.Array],
    log_q: jax.Array | None = None,
    reduction: str = "sum",
) -> Callable[..., tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]]:
  """`loss_fn(params, model_state, batch, key, step)` on a batch of `{"user", "item",
  "valid"}` row indices (`tfcl_jax.data.interactions.batches`).

  The towers (`models.towers.TwoTower`) embed `gather(user_features, batch["user"])` and
  `gather(item_features, batch["item"])`; padded rows (`valid` False) are neither anchors nor
  candidates. `reduction="sum"` is the tutorial's (Keras `Reduction.SUM`).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.models import towers
    >>> from tfcl_jax.objectives import retrieval
    >>> model = towers.TwoTower(
    ...     towers.Tower(vocab_sizes={"user_id": 4}, categorical=("user_id",), dim=8),
    ...     towers.Tower(vocab_sizes={"item_id": 6}, categorical=("item_id",), dim=8))
    >>> users, items = {"user_id": jnp.arange(1, 4)}, {"item_id": jnp.arange(1, 6)}
    >>> loss_fn = retrieval.make_retrieval_loss(
    ...     model, retrieval.parse_spec("free"), user_features=users, item_features=items)
    >>> batch = {"user": jnp.array([0, 1, 2]), "item": jnp.array([4, 0, 2]),
    ...          "valid": jnp.array([True, True, True])}
    >>> params = {"model": model.init(jax.random.key(0), retrieval.gather(users, batch["user"]),
    ...                               retrieval.gather(items, batch["item"]))["params"],
    ...           "mapping": {}}
    >>> loss, _ = loss_fn(params, {}, batch, jax.random.key(1), 0)
    >>> loss.shape
    ()

  Args:
    model: the two towers.
    objective: `parse_spec(...)`.
    user_features, item_features: `{name: [rows, ...] int}` tables (`data.movielens_features`).
    log_q: `[I]` log sampling probabilities of the items, needed by `+logq` objectives.
    reduction: `"sum"` or `"mean"` over the valid anchors.
  """
  if objective.logq and log_q is None:
    raise ValueError(f"{objective.spec} needs log_q, the items' log sampling probabilities.")

  def loss_fn(params, model_state, batch, key, step):
    del key
    # Flax types apply's result as either the output or (output, mutated variables).
    q, c = cast("tuple[jax.Array, jax.Array]", model.apply(
        {"params": params["model"]}, gather(user_features, batch["user"]),
        gather(item_features, batch["item"])))
    valid = batch["valid"]
    bias = -log_q[batch["item"]] if objective.logq and log_q is not None else None
    if objective.form == "dot":
      value = dot_product_softmax(q, c, where=valid, candidate_bias=bias, reduction=reduction)
    else:
      assert objective.loss is not None  # every form but dot has one
      kwargs = {"negatives": "cross", "where": valid, "reduction": reduction}
      if objective.form != "sigmoid":
        kwargs["symmetric"] = objective.form == "clip"
      if bias is not None:
        kwargs["candidate_bias"] = bias
      value = objective.loss(q, c, params=params["mapping"], step=step, **kwargs)
    return value, (model_state, {})

  return loss_fn
