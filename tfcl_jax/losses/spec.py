r"""Loss specs: a loss family with its mapping and its own parameters, named by one string.

Configs and command lines name a training objective by a loss spec (`free`, `clip:tau=0.1`,
`sigmoid/learnable=0.1/learn_b=siglip`, `dot+logq`, ...). Each family registers its forms in
`SPECS` beside its `Loss` subclass; `SPECS.parse` reads a spec once into its canonical string and
what builds its `Loss` (a `tfcl_jax.specs.ParsedSpec`), `from_spec` builds the `Loss`, whose
`params` go into the train state (`params["loss"]`) and whose call evaluates the loss with the
state's values; `canonical_spec` gives the canonical string without building it. The grammar,
with a table of every form, is docs/specs.md.
"""

from __future__ import annotations

from tfcl_jax import mappings, specs
from tfcl_jax.losses._engine import _layout
from tfcl_jax.losses._info_nce import InfoNCELoss
from tfcl_jax.losses._loss import SPEC_FORMS, SPECS, LogQ, Loss

__all__ = ["SPECS", "SPEC_FORMS", "LogQ", "Loss", "as_loss", "canonical_spec", "from_spec",
           "num_candidates", "parse"]


def parse(text: str) -> specs.ParsedSpec:
  """Reads a loss spec once: its canonical string (`.spec`) and `.build(num_candidates)`, which
  makes its `Loss` (`SPECS.parse`). What a sweep's run carries from its plan to its training.

  Examples:
    >>> from tfcl_jax import losses
    >>> parsed = losses.spec.parse(" sigmoid/free_n/learn_b=prior ")
    >>> parsed.spec, parsed.needs_candidates
    ('sigmoid/free_n/learn_b=prior', True)
    >>> loss = parsed.build(511)    # the candidates per anchor fill in N and the prior bias
    >>> loss.mapping.spec, round(loss.bias, 3)
    ('free_n=511', -6.234)

  Raises:
    TypeError: `text` is not a str.
    ValueError: a malformed spec, listing the accepted forms.
  """
  return SPECS.parse(text)


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
  return parse(text).spec


def from_spec(text: str, *, num_candidates: int | None = None) -> Loss:
  """Parses a loss spec (docs/specs.md) into its `Loss`.

  Examples:
    >>> from tfcl_jax import losses
    >>> s = losses.from_spec("sigmoid/learnable=0.1/learn_b=siglip")
    >>> type(s).__name__, s.mapping.spec, s.bias, sorted(s.params)
    ('SigmoidLoss', 'learnable=0.1', -10.0, ['bias', 't'])
    >>> clip = losses.from_spec("clip:learnable=0.07:100")
    >>> type(clip).__name__, clip.symmetric, clip.mapping.spec
    ('InfoNCELoss', True, 'learnable=0.07:100')
    >>> dot = losses.from_spec("dot+logq")
    >>> type(dot).__name__, dot.mapping, dot.logq, dot.scores_cosines
    ('DotProductLoss', None, True, False)
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
  return parse(text).build(num_candidates)


def as_loss(loss: Loss | mappings.Mapping) -> Loss:
  """`loss` as a `Loss`: a `Loss` as it is, a `Mapping` as InfoNCE under it.

  Examples:
    >>> from tfcl_jax import losses, mappings
    >>> loss = losses.as_loss(mappings.temperature(0.5))
    >>> loss.spec, type(loss).__name__, losses.as_loss(loss) is loss
    ('tau=0.5', 'InfoNCELoss', True)

  Raises:
    TypeError: `loss` is neither.
  """
  if isinstance(loss, mappings.Mapping):
    return InfoNCELoss(loss.spec, loss)
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
