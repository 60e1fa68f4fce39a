"""`Loss`, the base of the loss families, and `SPECS`, where each family registers its specs."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import jax

from tfcl_jax import mappings, specs
from tfcl_jax.losses._family import Evaluation, Family

#: The forms of a loss spec (a `tfcl_jax.specs.Registry`), each registered by the module of its
#: family; `<mapping>` is a mapping spec (`tfcl_jax.mappings.SPECS`), the builder's `mapping`.
SPECS = specs.Registry("loss spec", "loss", named=True,
                       args={"mapping": specs.Nested("mapping", mappings.SPECS)})
#: What a `+logq` loss's call takes as `log_q`: the candidates' log sampling probabilities, or a
#: pair of them for CLIP's symmetric loss (`z2`'s rows, then `z1`'s).
LogQ = jax.typing.ArrayLike | tuple[jax.typing.ArrayLike, jax.typing.ArrayLike]
#: The forms of a loss spec, one a line (`from_spec`'s errors print them; docs/specs.md).
SPEC_FORMS = specs.FormLines(SPECS)


class Loss(abc.ABC):
  """A loss: its family (the subclass), its mapping and its own parameters, as a spec names it.

  One subclass per family (`InfoNCELoss`, `SigmoidLoss`, `DotProductLoss`), a frozen dataclass
  that owns its fields and their checks, its call (`compute`) and its spec forms, which it
  registers in `SPECS` beside itself; a family declared on the engine (`_family.family`) derives
  its call from that declaration (`FamilyLoss`). Calling a loss evaluates it: the checks every
  family shares (`params`, `log_q`) run here, then `compute`. `evaluate` returns what the loss
  solved on the batch with its value (`Evaluation`: a batch-scaled mapping's scale).

  Examples:
    >>> import jax
    >>> from tfcl_jax import losses
    >>> siglip = losses.from_spec("sigmoid/learnable=0.1/learn_b=siglip")
    >>> type(siglip).__name__, siglip.mapping.spec, sorted(siglip.params)
    ('SigmoidLoss', 'learnable=0.1', ['bias', 't'])
    >>> z = jax.random.normal(jax.random.key(0), (4, 8))
    >>> siglip(z, z, params=siglip.params).shape
    ()

  Attributes:
    spec: the canonical loss spec (what result tables call the run).
    mapping: the `tfcl_jax.mappings.Mapping` of the cosines; None for a loss that scores no
      cosines (`dot`).
    logq: whether the call takes `log_q`, the candidates' log sampling probabilities, and
      subtracts them from the logits (the logQ correction, `+logq`).
    scores_cosines: whether the loss scores cosines of the embeddings (every family but `dot`).
    softmax: whether each anchor's candidates compete in one softmax (InfoNCE, `dot`), where the
      sigmoid loss scores each pair on its own; each family declares it.
  """

  spec: str
  mapping: mappings.Mapping | None
  logq: bool = False
  scores_cosines: ClassVar[bool] = True
  softmax: ClassVar[bool]

  @property
  def params(self) -> dict[str, Any]:
    """The trainable scalars, the mapping's params and the family's own (e.g. `"bias"`)."""
    return {} if self.mapping is None else dict(self.mapping.params)

  @property
  def supervised_form(self) -> bool:
    """Whether `supervised` (the supervised contrastive form of the loss) exists."""
    return False

  @property
  def log_q_sides(self) -> int:
    """How many sides' log sampling probabilities `log_q` holds: 0 (no `+logq`), 1 (`z2`'s
    rows, the candidates of `z1 -> z2`) or 2 (a pair, `z2`'s and `z1`'s: CLIP's loss)."""
    return int(self.logq)

  def __call__(self, z1: jax.typing.ArrayLike, z2: jax.typing.ArrayLike, *,
               params: dict | None = None, step: jax.typing.ArrayLike | None = None,
               log_q: LogQ | None = None, **kwargs) -> jax.Array:
    """The loss of `z1` against `z2` with trainable values `params` (default `self.params`): the
    value of `evaluate`.

    Args:
      z1, z2: `[N, D]` float embeddings; row `i` of `z2` is the positive of `z1[i]`.
      params: the trainable scalars (`self.params`' keys), e.g. the train state's
        `params["loss"]`; required when the loss has any (`self.params` holds their initial
        values), so that a train step cannot leave them untrained by leaving them out.
      step: the training step a scheduled mapping reads.
      log_q: `[N]` float log sampling probabilities of the rows of `z2` as candidates; needed by
        a `+logq` loss (each candidate's logit minus `log_q[j]`), refused by the others. CLIP's
        symmetric loss (`clip:<mapping>+logq`) takes a pair, `(z2's, z1's)`: each direction's
        candidates (e.g. the items' and the users' `log q`).
      **kwargs: to the family's loss function (`info_nce`: `negatives`, `where`, `reduction`,
        `block_size`, ...; `sigmoid_loss`; `dot_product_softmax`).

    Returns:
      The loss, as the family's function returns it.

    Raises:
      ValueError: `log_q` missing for a `+logq` loss or given to another; `params` missing for
        a loss with trainable params.
    """
    return self.evaluate(z1, z2, params=params, step=step, log_q=log_q, **kwargs).value

  def evaluate(self, z1: jax.typing.ArrayLike, z2: jax.typing.ArrayLike, *,
               params: dict | None = None, step: jax.typing.ArrayLike | None = None,
               log_q: LogQ | None = None, **kwargs) -> Evaluation:
    """`Evaluation(loss, scale)`: the loss as `__call__` gives it (the same arguments and
    checks), and the scale its batch-scaled mapping solved on this batch (`[M]`, one per
    anchor, for `perplexity_free`; None for every other mapping), solved once inside the loss.
    What an objective calls: `evaluation.metrics` is what its train step logs.

    Examples:
      >>> import jax
      >>> from tfcl_jax import losses
      >>> loss = losses.from_spec("calibrated_free")
      >>> z = jax.random.normal(jax.random.key(0), (8, 4))
      >>> value, scale = loss.evaluate(z, z + 0.1)
      >>> bool(jax.numpy.allclose(value, loss(z, z + 0.1))), bool(0.01 <= scale <= 100)
      (True, True)
    """
    if self.logq and log_q is None:
      raise ValueError(f"loss {self.spec!r} needs log_q, the candidates' log sampling "
                       "probabilities.")
    if not self.logq and log_q is not None:
      raise ValueError(f"log_q is the logQ correction of a '+logq' loss; loss {self.spec!r} "
                       "has none.")
    if params is None and self.params:
      raise ValueError(
          f"loss {self.spec!r} has trainable params {sorted(self.params)}: pass params=..., "
          "e.g. the train state's params['loss'] (loss.params holds their initial values, "
          "params=loss.params evaluates at them).")
    computed = self.compute(z1, z2, params=dict(self.params if params is None else params),
                            step=step, log_q=log_q, **kwargs)
    return computed if isinstance(computed, Evaluation) else Evaluation(computed)

  @abc.abstractmethod
  def compute(self, z1: jax.typing.ArrayLike, z2: jax.typing.ArrayLike, *,
              params: dict[str, Any], step: jax.typing.ArrayLike | None,
              log_q: LogQ | None, **kwargs) -> Evaluation | jax.Array:
    """The family's loss: `evaluate` after its shared checks, `params` always given; its
    `Evaluation`, or the loss alone (nothing solved)."""

  def supervised(self, z: jax.typing.ArrayLike, labels: jax.typing.ArrayLike, *, form: str,
                 params: dict[str, Any], step: jax.typing.ArrayLike | None = None
                 ) -> Evaluation:
    """The supervised contrastive form of the loss (SupCon), where `supervised_form`: its
    value and its scale, as `evaluate`.

    Raises:
      ValueError: the loss has no such form.
    """
    del z, labels, params, step
    raise ValueError(f"form={form!r} takes an InfoNCE loss (a mapping spec), got {self.spec!r}.")

  def bound_mapping(self, params: dict[str, Any], step) -> mappings.Mapping:
    """The mapping at the mapping's entries of `params` and at `step` (`Mapping.bind`)."""
    if self.mapping is None:
      raise ValueError(f"loss {self.spec!r} has no mapping.")
    return self.mapping.bind(params={k: params[k] for k in self.mapping.params}, step=step)


class FamilyLoss(Loss):
  """A `Loss` whose call its family's declaration derives (`_family.family`): the family's
  function under the bound mapping, with the keywords the loss's own fields set (`options`)."""

  #: The family whose function the loss evaluates (`Family.evaluate`).
  family: ClassVar[Family]

  def __post_init__(self):
    check_mapping(self.mapping, type(self).__name__)  # the family's function takes a `Mapping`

  def options(self, params: dict[str, Any], log_q: LogQ | None) -> dict[str, Any]:
    """The keywords of the family's function that the loss's own fields, `params` and `log_q`
    set (InfoNCE's `symmetric` and `candidate_bias`, the sigmoid loss's `bias`); none here."""
    del params, log_q
    return {}

  def compute(self, z1, z2, *, params, step, log_q, **kwargs) -> Evaluation:
    """The family's function under the bound mapping, with `options` and the call's keywords."""
    return self.family.evaluate(z1, z2, mapping=self.bound_mapping(params, step),
                                **self.options(params, log_q), **kwargs)


def check_mapping(mapping, family: str) -> None:
  """A family's check of its `mapping` field: a `Mapping`."""
  if not isinstance(mapping, mappings.Mapping):
    raise TypeError(f"mapping of {family} must be a tfcl_jax.mappings.Mapping, got "
                    f"{type(mapping).__name__}.")
