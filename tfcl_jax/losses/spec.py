r"""Loss specs: a loss family with its mapping and its own parameters, named by one string.

Configs and command lines name a training objective by a loss spec (`free`, `clip:tau=0.1`,
`sigmoid/learnable=0.1/learn_b=siglip`, `dot+logq`, ...). `from_spec` parses it into a `Loss`
whose `params` go into the train state (`params["loss"]`) and whose `__call__` evaluates the
loss with the state's values; `canonical_spec` gives its canonical string without building it.
The grammar, with a table of every form, is docs/specs.md.
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp

from tfcl_jax import _checks, mappings
from tfcl_jax.losses import _layout
from tfcl_jax.losses._dot import dot_product_softmax
from tfcl_jax.losses._info_nce import info_nce
from tfcl_jax.losses._sigmoid import BIAS_INITS, sigmoid_bias_init, sigmoid_loss
from tfcl_jax.mappings import _spec as mapping_spec

#: The loss families a loss spec names (`Loss.family`).
FAMILIES = ("info_nce", "sigmoid", "dot")
#: The suffix of a loss spec that adds the logQ correction (`Loss.logq`).
LOGQ_SUFFIX = "+logq"
#: The prefix of a loss spec that makes InfoNCE symmetric, CLIP's loss (`Loss.symmetric`).
SYMMETRIC_PREFIX = "clip:"
#: The forms of a loss spec, one a line (`from_spec`'s errors print them; docs/specs.md).
SPEC_FORMS = (
    "<mapping>                         InfoNCE under the mapping: free, tau=0.5, learnable=0.07",
    "clip:<mapping>                    CLIP's symmetric InfoNCE, e.g. clip:learnable=0.07:100",
    "sigmoid/<mapping>                 sigmoid loss, bias 0",
    "sigmoid/<mapping>/b=<init>        fixed bias: a number, siglip (-10) or prior",
    "sigmoid/<mapping>/learn_b=<init>  learnable bias starting at <init>",
    "dot                               raw dot products, no normalisation and no mapping",
    "<mapping>+logq, dot+logq          minus log q of each candidate (the logQ correction)",
)


@dataclasses.dataclass(frozen=True)
class Loss:
  """A loss: its family, its mapping, and its own parameters, as a loss spec names them.

  Calling it evaluates the loss (see `__call__`); `params` are its trainable scalars, the train
  state's `params["loss"]`.

  Examples:
    >>> import jax
    >>> from tfcl_jax import losses
    >>> siglip = losses.from_spec("sigmoid/learnable=0.1/learn_b=siglip")
    >>> siglip.family, siglip.mapping.spec, sorted(siglip.params)
    ('sigmoid', 'learnable=0.1', ['bias', 't'])
    >>> z = jax.random.normal(jax.random.key(0), (4, 8))
    >>> siglip(z, z, params=siglip.params).shape
    ()

  Attributes:
    spec: the canonical loss spec (what result tables call the run).
    family: one of `FAMILIES`: `"info_nce"` (Eq. 1; Eq. 11-12 under `free`), `"sigmoid"`
      (SigLIP) or `"dot"` (`dot_product_softmax`: raw dot products, no mapping).
    mapping: the `tfcl_jax.mappings.Mapping` of the cosines; None for `"dot"`.
    bias: the sigmoid loss's fixed bias, or its learnable bias's initial value.
    learn_bias: whether `bias` is a trainable parameter (the `"bias"` entry of `params`).
    symmetric: CLIP's symmetric InfoNCE (`clip:`): both directions, `z1 -> z2` and `z2 -> z1`.
    logq: the logQ correction (`+logq`): each candidate's logit minus `log q_j`, its log
      sampling probability (`log_q` of `__call__`); InfoNCE `z1 -> z2` and `dot` only.
  """

  spec: str
  family: str
  mapping: mappings.Mapping | None = None
  bias: float = 0.0
  learn_bias: bool = False
  symmetric: bool = False
  logq: bool = False

  def __post_init__(self):
    _checks.one_of(self.family, FAMILIES, name="family")
    if (self.mapping is None) != (self.family == "dot"):
      raise ValueError(f"mapping must be None for the dot family and a Mapping for the others; "
                       f"got family={self.family!r}, mapping={self.mapping!r}.")
    if self.family != "sigmoid" and (self.bias != 0.0 or self.learn_bias):
      raise ValueError(f"bias and learn_bias belong to the sigmoid family, got "
                       f"family={self.family!r}, bias={self.bias!r}, "
                       f"learn_bias={self.learn_bias!r}.")
    if self.symmetric and self.family != "info_nce":
      raise ValueError(f"symmetric is InfoNCE's (CLIP's loss), got family={self.family!r}.")
    if self.logq and (self.family == "sigmoid" or self.symmetric):
      raise ValueError("logq corrects the one-directional softmax z1 -> z2 (InfoNCE, dot); got "
                       f"family={self.family!r}, symmetric={self.symmetric!r}.")

  @property
  def params(self) -> dict:
    """The trainable scalars, the mapping's params plus `"bias"` when it is learnt."""
    params = {} if self.mapping is None else dict(self.mapping.params)
    if self.learn_bias:
      params["bias"] = jnp.asarray(self.bias, jnp.float32)
    return params

  @property
  def scores_cosines(self) -> bool:
    """Whether the loss scores cosines of the embeddings (every family but `"dot"`)."""
    return self.family != "dot"

  def __call__(self, z1: jax.typing.ArrayLike, z2: jax.typing.ArrayLike, *,
               params: dict | None = None, step: jax.typing.ArrayLike | None = None,
               log_q: jax.typing.ArrayLike | None = None, **kwargs) -> jax.Array:
    """The loss of `z1` against `z2` with trainable values `params` (default `self.params`).

    Args:
      z1, z2: `[N, D]` float embeddings; row `i` of `z2` is the positive of `z1[i]`.
      params: the trainable scalars (`self.params`' keys), e.g. the train state's
        `params["loss"]`; required when the loss has any (`self.params` holds their initial
        values), so that a train step cannot leave them untrained by leaving them out.
      step: the training step a scheduled mapping reads.
      log_q: `[N]` float log sampling probabilities of the rows of `z2` as candidates; needed by
        a `+logq` loss (each candidate's logit minus `log_q[j]`), refused by the others.
      **kwargs: to `info_nce` (`negatives`, `where`, `reduction`, `block_size`, ...; the spec
        sets `symmetric`), `sigmoid_loss`, or `dot_product_softmax` (`where`, `reduction`;
        `negatives` must be `"cross"`).

    Returns:
      The loss, as the family's function returns it.

    Raises:
      ValueError: `log_q` missing for a `+logq` loss or given to another; `params` missing for
        a loss with trainable params.
    """
    if self.logq and log_q is None:
      raise ValueError(f"loss {self.spec!r} needs log_q, the candidates' log sampling "
                       "probabilities.")
    if not self.logq and log_q is not None:
      raise ValueError(f"log_q is the logQ correction of a '{LOGQ_SUFFIX}' loss; loss "
                       f"{self.spec!r} has none.")
    candidate_bias = None if log_q is None else -jnp.asarray(log_q)
    if self.family == "dot":
      negatives = kwargs.pop("negatives", "cross")
      if negatives != "cross":
        raise ValueError("the dot loss scores each row of z1 against the rows of z2: "
                         f"negatives must be 'cross', got {negatives!r}.")
      return dot_product_softmax(z1, z2, candidate_bias=candidate_bias, **kwargs)
    assert self.mapping is not None  # every family but dot has a mapping (__post_init__)
    if params is None and self.params:
      raise ValueError(
          f"loss {self.spec!r} has trainable params {sorted(self.params)}: pass params=..., "
          "e.g. the train state's params['loss'] (loss.params holds their initial values, "
          "params=loss.params evaluates at them).")
    params = dict(self.params if params is None else params)
    bias = params.pop("bias", self.bias)
    mapping = self.mapping.bind(params=params, step=step)
    if self.family == "info_nce":
      if candidate_bias is not None:
        kwargs["candidate_bias"] = candidate_bias
      return info_nce(z1, z2, mapping=mapping, symmetric=self.symmetric, **kwargs)
    return sigmoid_loss(z1, z2, mapping=mapping, bias=bias, **kwargs)


def as_loss(loss: Loss | mappings.Mapping) -> Loss:
  """`loss` as a `Loss`: a `Loss` as it is, a `Mapping` as InfoNCE under it.

  Examples:
    >>> from tfcl_jax import losses, mappings
    >>> loss = losses.as_loss(mappings.temperature(0.5))
    >>> loss.spec, loss.family, losses.as_loss(loss) is loss
    ('tau=0.5', 'info_nce', True)

  Raises:
    TypeError: `loss` is neither.
  """
  if isinstance(loss, mappings.Mapping):
    return Loss(loss.spec, "info_nce", loss)
  if not isinstance(loss, Loss):
    raise TypeError("loss must be a tfcl_jax.losses.Loss (losses.from_spec) or a "
                    f"tfcl_jax.mappings.Mapping (InfoNCE under it), got {type(loss).__name__}.")
  return loss


def num_candidates(batch_size: int, *, negatives: str) -> int:
  """Candidates per anchor of InfoNCE or the sigmoid loss on a batch of `batch_size` pairs:
  `2 N - 1` for `negatives="all"` (every other row of both views), `N` for `"cross"`.

  Examples:
    >>> from tfcl_jax import losses
    >>> losses.num_candidates(256, negatives="all"), losses.num_candidates(256, negatives="cross")
    (511, 256)
  """
  if negatives not in ("all", "cross"):
    raise ValueError(f"negatives must be 'all' or 'cross', got {negatives!r}.")
  return _layout.candidates_per_anchor(batch_size, negatives)


class _Parsed(NamedTuple):
  """A loss spec read and checked: the canonical spec and `Loss`'s fields but the bias,
  which is `(learnt, init text)` (a `prior` init needs the candidates to become a number)."""

  spec: str
  family: str
  mapping: mapping_spec.ParsedMapping | None
  bias: tuple[bool, str] | None = None
  symmetric: bool = False
  logq: bool = False


def canonical_spec(text: str) -> str:
  """The canonical form of a loss spec (what `from_spec(text).spec` is), checked without
  building the loss: a `prior` bias needs no batch to be named.

  Examples:
    >>> from tfcl_jax import losses
    >>> losses.canonical_spec(" tau=0.50 "), losses.canonical_spec("sigmoid/free/learn_b=prior")
    ('tau=0.5', 'sigmoid/free/learn_b=prior')
    >>> losses.canonical_spec("clip:learnable=0.070:100"), losses.canonical_spec("dot + logq")
    ('clip:learnable=0.07:100', 'dot+logq')

  Raises:
    TypeError: `text` is not a str.
    ValueError: a malformed spec, listing the accepted forms.
  """
  return _parse(text).spec


def from_spec(text: str, *, num_candidates: int | None = None) -> Loss:
  """Parses a loss spec (docs/specs.md) into its `Loss`.

  Examples:
    >>> from tfcl_jax import losses
    >>> s = losses.from_spec("sigmoid/learnable=0.1/learn_b=siglip")
    >>> s.family, s.mapping.spec, s.bias, sorted(s.params)
    ('sigmoid', 'learnable=0.1', -10.0, ['bias', 't'])
    >>> clip = losses.from_spec("clip:learnable=0.07:100")
    >>> clip.family, clip.symmetric, clip.mapping.spec
    ('info_nce', True, 'learnable=0.07:100')
    >>> dot = losses.from_spec("dot+logq")
    >>> dot.family, dot.mapping, dot.logq, dot.scores_cosines
    ('dot', None, True, False)
    >>> n_aware = losses.from_spec("free_n", num_candidates=511)   # the map's N from the loss
    >>> n_aware.spec, n_aware.mapping.spec
    ('free_n', 'free_n=511')

  Args:
    text: the spec.
    num_candidates: candidates per anchor (`losses.num_candidates`: `2N - 1` for
      `negatives="all"`, `N` for `"cross"`); needed only by a `prior` bias and the mapping
      `free_n` (`mappings.n_aware_free`).

  Raises:
    TypeError: `text` is not a str.
    ValueError: for a malformed spec (listing the accepted forms), or a `prior` bias or the
      mapping `free_n` without `num_candidates`.
  """
  parsed = _parse(text)
  mapping = None
  if parsed.mapping is not None and parsed.mapping.needs_candidates:
    if num_candidates is None:
      raise ValueError(f"Invalid loss spec {text!r}: the mapping {parsed.mapping.spec!r} needs "
                       "num_candidates (candidates per anchor, losses.num_candidates).")
    mapping = parsed.mapping.build(num_candidates)
  elif parsed.mapping is not None:
    mapping = parsed.mapping.build()
  bias, learn_bias = 0.0, False
  if parsed.bias is not None:
    learn_bias, init = parsed.bias
    try:
      bias = _bias(init, num_candidates)
    except ValueError as error:
      raise ValueError(f"Invalid loss spec {text!r}: {error}") from None
  return Loss(parsed.spec, parsed.family, mapping, bias, learn_bias, parsed.symmetric,
                  parsed.logq)


def _parse(text: str) -> _Parsed:
  if not isinstance(text, str):
    raise TypeError(f"loss spec must be a str, got {type(text).__name__}.")
  body = text.strip().replace(" ", "")
  try:
    logq = body.endswith(LOGQ_SUFFIX)
    if logq:
      body = body[:-len(LOGQ_SUFFIX)]
    if body == "dot":
      return _Parsed("dot" + (LOGQ_SUFFIX if logq else ""), "dot", None, logq=logq)
    if body.startswith(SYMMETRIC_PREFIX):
      inner = body[len(SYMMETRIC_PREFIX):]
      if inner.split("/")[0] == "sigmoid":
        raise ValueError(f"{SYMMETRIC_PREFIX} takes a mapping spec (CLIP's loss is InfoNCE); the "
                         "sigmoid loss is written sigmoid/<mapping>")
      _no_logq(logq, "the symmetric loss (clip:)")
      mapping = mapping_spec.parse(inner)
      return _Parsed(SYMMETRIC_PREFIX + mapping.spec, "info_nce", mapping, symmetric=True)
    parts = body.split("/")
    if parts[0] != "sigmoid":
      if len(parts) != 1:
        raise ValueError("only a sigmoid loss takes '/' options (e.g. sigmoid/free/learn_b=0)")
      mapping = mapping_spec.parse(body)
      return _Parsed(mapping.spec + (LOGQ_SUFFIX if logq else ""), "info_nce", mapping,
                     logq=logq)
    _no_logq(logq, "the sigmoid loss")
    if len(parts) not in (2, 3):
      raise ValueError("expected sigmoid/<mapping>[/b=<init> | /learn_b=<init>]")
    mapping = mapping_spec.parse(parts[1])
    if len(parts) == 2:
      return _Parsed(f"sigmoid/{mapping.spec}", "sigmoid", mapping, (False, "0"))
    match = re.fullmatch(r"(b|learn_b)=(.+)", parts[2])
    if match is None:
      raise ValueError(f"bias option {parts[2]!r} is not b=<init> or learn_b=<init>")
    init = match[2]
    if init not in BIAS_INITS:
      _bias(init, None)  # a number, checked here
    return _Parsed(f"sigmoid/{mapping.spec}/{match[1]}={init}", "sigmoid", mapping,
                   (match[1] == "learn_b", init))
  except ValueError as error:
    forms = "\n  ".join(SPEC_FORMS)
    mapping_forms = "\n  ".join(mapping_spec.SPEC_FORMS)
    raise ValueError(f"Invalid loss spec {text!r}: {error}\nAccepted forms:\n  {forms}\n"
                     f"where <mapping> is a mapping spec:\n  {mapping_forms}") from None


def _no_logq(logq: bool, what: str) -> None:
  if logq:
    raise ValueError(f"{LOGQ_SUFFIX} corrects the one-directional softmax z1 -> z2; {what} "
                     "scores both directions")


def _bias(init: str, num_candidates: int | None) -> float:
  if init in BIAS_INITS:
    if init == "prior" and num_candidates is None:
      raise ValueError("a prior bias needs num_candidates (candidates per anchor)")
    return sigmoid_bias_init(init, num_candidates=num_candidates)
  try:
    return float(init)
  except ValueError:
    raise ValueError(f"bias init {init!r} is not a number, 'siglip' or 'prior'") from None
