r"""Which contrastive loss, under which similarity-to-logit map, with which bias: one spec string.

Configs and command lines name a training objective by a short string; `from_spec` parses it
into a `LossSpec` whose `params` go into the train state and whose `__call__` evaluates the
loss with the state's values.

* `<mapping>`: InfoNCE (Eq. 1, or Eq. 11-12 under `free`) with that mapping
  (`tfcl_jax.mappings.from_spec`: `free`, `tau=0.5`, `learnable=0.1`, ...).
* `sigmoid/<mapping>`: the sigmoid loss (SigLIP) with `b = 0`.
* `sigmoid/<mapping>/b=<init>`: a fixed bias; `sigmoid/<mapping>/learn_b=<init>`: a learnable
  bias starting at `<init>`, a number, `siglip` (-10) or `prior` (the log-odds of one positive
  among the candidates, `sigmoid_bias_init("prior")`).

SigLIP itself is `sigmoid/learnable=0.1/learn_b=siglip` (`t = log 10`, `b = -10`, both learnt).
"""

from __future__ import annotations

import dataclasses
import re

import jax

from tfcl_jax import mappings as mappings_lib
from tfcl_jax.losses._info_nce import info_nce
from tfcl_jax.losses._sigmoid import BIAS_INITS, sigmoid_bias_init, sigmoid_loss

#: The loss families a spec names (`LossSpec.loss`).
LOSSES = ("info_nce", "sigmoid")
#: The forms of a loss spec, one a line (`from_spec`'s errors print them).
SPEC_FORMS = (
    "<mapping>                     InfoNCE, e.g. free, tau=0.5, learnable=0.07",
    "sigmoid/<mapping>             sigmoid loss, bias 0",
    "sigmoid/<mapping>/b=<init>    fixed bias: a number, siglip (-10) or prior",
    "sigmoid/<mapping>/learn_b=<init>  learnable bias starting at <init>",
)


@dataclasses.dataclass(frozen=True)
class LossSpec:
  """A parsed loss spec: the loss, its mapping, and its bias (sigmoid loss only).

  Attributes:
    spec: the canonical spec string (what result tables call the run).
    loss: `"info_nce"` or `"sigmoid"`.
    mapping: the `tfcl_jax.mappings.Mapping`.
    bias: the fixed bias, or the learnable bias's initial value.
    learn_bias: whether `bias` is a trainable parameter (the `"bias"` entry of `params`).
  """

  spec: str
  loss: str
  mapping: mappings_lib.Mapping
  bias: float = 0.0
  learn_bias: bool = False

  @property
  def params(self) -> dict:
    """The trainable scalars, the mapping's params plus `"bias"` when it is learnt."""
    params = dict(self.mapping.params)
    if self.learn_bias:
      params["bias"] = jax.numpy.asarray(self.bias, jax.numpy.float32)
    return params

  def __call__(self, z1: jax.typing.ArrayLike, z2: jax.typing.ArrayLike, *,
               params: dict | None = None, step: jax.typing.ArrayLike | None = None,
               **kwargs) -> jax.Array:
    """The loss of `z1`, `z2` with trainable values `params` (default `self.params`) at `step`.

    `kwargs` go to `info_nce` / `sigmoid_loss` (`negatives`, `block_size`, `where`, ...).
    """
    params = dict(self.params if params is None else params)
    bias = params.pop("bias", self.bias)
    mapping = self.mapping.bind(params=params, step=step)
    if self.loss == "info_nce":
      return info_nce(z1, z2, mapping=mapping, **kwargs)
    return sigmoid_loss(z1, z2, mapping=mapping, bias=bias, **kwargs)


def as_loss(loss: LossSpec | mappings_lib.Mapping) -> LossSpec:
  """`loss` as a `LossSpec`: a `LossSpec` as it is, a `Mapping` as InfoNCE under it.

  Examples:
    >>> from tfcl_jax import losses, mappings
    >>> loss = losses.as_loss(mappings.temperature(0.5))
    >>> loss.spec, loss.loss, losses.as_loss(loss) is loss
    ('tau=0.5', 'info_nce', True)

  Raises:
    TypeError: `loss` is neither.
  """
  if isinstance(loss, mappings_lib.Mapping):
    return LossSpec(loss.spec, "info_nce", loss)
  if not isinstance(loss, LossSpec):
    raise TypeError("loss must be a tfcl_jax.losses.LossSpec (losses.from_spec) or a "
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
  return 2 * batch_size - 1 if negatives == "all" else batch_size


def canonical_spec(text: str) -> str:
  """The canonical form of a loss spec (what `from_spec(text).spec` is), checked without a
  batch: a `prior` bias needs none to be named.

  Examples:
    >>> from tfcl_jax import losses
    >>> losses.canonical_spec(" tau=0.50 "), losses.canonical_spec("sigmoid/free/learn_b=prior")
    ('tau=0.5', 'sigmoid/free/learn_b=prior')

  Raises:
    ValueError: a malformed spec, listing the accepted forms.
  """
  return _parse(text)[0]


def from_spec(text: str, *, num_candidates: int | None = None) -> LossSpec:
  """Parses a loss spec (see the module docstring).

  Examples:
    >>> from tfcl_jax import losses
    >>> s = losses.from_spec("sigmoid/learnable=0.1/learn_b=siglip")
    >>> s.loss, s.mapping.spec, s.bias, sorted(s.params)
    ('sigmoid', 'learnable=0.1', -10.0, ['bias', 't'])
    >>> losses.from_spec(" free ").spec, losses.from_spec("sigmoid/free").spec
    ('free', 'sigmoid/free')

  Args:
    text: the spec.
    num_candidates: candidates per anchor (`losses.num_candidates`: `2N - 1` for
      `negatives="all"`, `N` for `"cross"`); needed only by a `prior` bias.

  Raises:
    ValueError: for a malformed spec (listing the accepted forms), or a `prior` bias without
      `num_candidates`.
  """
  spec, loss, mapping, bias = _parse(text)
  if bias is None:
    return LossSpec(spec, loss, mapping)
  learn, init = bias
  try:
    value = _bias(init, num_candidates)
  except ValueError as error:
    raise ValueError(f"Invalid loss spec {text!r}: {error}") from None
  return LossSpec(spec, loss, mapping, value, learn)


def _parse(text: str):
  """`(canonical spec, loss, mapping, bias)`; `bias` is `(learnt, init text)` or None."""
  if not isinstance(text, str):
    raise TypeError(f"loss spec must be a str, got {type(text).__name__}.")
  parts = text.strip().replace(" ", "").split("/")
  try:
    if parts[0] != "sigmoid":
      if len(parts) != 1:
        raise ValueError("only a sigmoid loss takes '/' options (e.g. sigmoid/free/learn_b=0)")
      mapping = mappings_lib.from_spec(parts[0])
      return mapping.spec, "info_nce", mapping, None
    if len(parts) not in (2, 3):
      raise ValueError("expected sigmoid/<mapping>[/b=<init> | /learn_b=<init>]")
    mapping = mappings_lib.from_spec(parts[1])
    if len(parts) == 2:
      return f"sigmoid/{mapping.spec}", "sigmoid", mapping, (False, "0")
    match = re.fullmatch(r"(b|learn_b)=(.+)", parts[2])
    if match is None:
      raise ValueError(f"bias option {parts[2]!r} is not b=<init> or learn_b=<init>")
    init = match[2]
    if init not in BIAS_INITS:
      _bias(init, None)  # a number, checked here
    return (f"sigmoid/{mapping.spec}/{match[1]}={init}", "sigmoid", mapping,
            (match[1] == "learn_b", init))
  except ValueError as error:
    forms = "\n  ".join(SPEC_FORMS)
    raise ValueError(f"Invalid loss spec {text!r}: {error}\nAccepted forms:\n  {forms}") from None


def _bias(init: str, num_candidates: int | None) -> float:
  if init in BIAS_INITS:
    if init == "prior" and num_candidates is None:
      raise ValueError("a prior bias needs num_candidates (candidates per anchor)")
    return sigmoid_bias_init(init, num_candidates=num_candidates)
  try:
    return float(init)
  except ValueError:
    raise ValueError(f"bias init {init!r} is not a number, 'siglip' or 'prior'") from None
