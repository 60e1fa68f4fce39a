r"""The sigmoid contrastive loss (SigLIP) under any similarity-to-logit mapping."""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import _checks, mappings, specs
from tfcl_jax.losses._engine import _arguments, _calibration, _layout
from tfcl_jax.losses._engine._devices import Devices
from tfcl_jax.losses._engine._sums import SigmoidSum
from tfcl_jax.losses._family import Evaluation, family
from tfcl_jax.losses._loss import SPECS, FamilyLoss

BIAS_INITS = ("siglip", "prior")


def sigmoid_bias_init(kind: str = "siglip", *, num_candidates: int | None = None) -> float:
  """The bias a sigmoid loss starts from.

  * `"siglip"`: -10, SigLIP's init (with `t = log 10`).
  * `"prior"`: `log(p / (1 - p))` with `p = 1 / num_candidates`, the log-odds of one positive
    among `num_candidates` (open_clip's note on the init): the loss starts at its minimum for
    uninformative embeddings.

  Examples:
    >>> from tfcl_jax import losses
    >>> losses.sigmoid_bias_init(), round(losses.sigmoid_bias_init("prior", num_candidates=1024), 4)
    (-10.0, -6.9305)
  """
  _checks.one_of(kind, BIAS_INITS, name="kind")
  if kind == "siglip":
    return -10.0
  num_candidates = _checks.positive_int(num_candidates, name="num_candidates", minimum=2)
  p = 1.0 / num_candidates
  return math.log(p / (1.0 - p))


def _check_bias(bias, name: str = "bias"):
  if isinstance(bias, (bool, np.bool_)):
    raise TypeError(f"{name} must be a float or a float scalar array, got a bool ({bias!r}).")
  if isinstance(bias, numbers.Real):
    return float(bias)
  dtype = getattr(bias, "dtype", None)
  if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"{name} must be a float or a float scalar array, got "
                    f"{type(bias).__name__}{'' if dtype is None else f' of dtype {dtype}'}.")
  if jnp.shape(bias) != ():
    raise ValueError(f"{name} must be a scalar (shape ()), got shape {jnp.shape(bias)}.")
  return bias


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: the inner mapping may hold a tracer
class _Biased(mappings.MappingFunction):
  """`f(c) + b`, or `f(c) - f(r)` (`relative`): the params are `f`'s and `"bias"` (`b`), or
  `"relative_bias"` (`r`), beside them."""

  inner: mappings.MappingFunction
  relative: bool

  @property
  def key(self) -> str:
    """The bias's entry in the params."""
    return "relative_bias" if self.relative else "bias"

  def split(self, params) -> tuple[dict, jax.Array]:
    """`(f's params, the bias)`."""
    return {name: value for name, value in params.items() if name != self.key}, params[self.key]

  def __call__(self, cos, params, step):
    inner, bias = self.split(params)
    bias = jnp.asarray(bias, cos.dtype)
    logits = self.inner(cos, inner, step)
    if self.relative:
      return logits - self.inner(bias, inner, step)
    return logits + bias

  def parameter_checks(self, params, step) -> tuple[mappings.ParameterCheck, ...]:
    # The inner mapping's own checks, then the bias's: a NaN or infinite bias gives a non-finite
    # loss; a relative bias is a cosine, in [-1, 1] (beyond, free's clamp would move it).
    inner, bias = self.split(params)
    if self.relative:
      bias = jnp.asarray(bias)
      check = mappings.ParameterCheck(self.key, bias, jnp.abs(bias) <= 1.0, "in [-1, 1]")
    else:
      check = mappings.finite_check(self.key, bias)
    return (*self.inner.parameter_checks(inner, step), check)


def _biased(mapping: mappings.Mapping, bias, relative_bias) -> mappings.Mapping:
  """`mapping` with the bias folded in: `f(c) + b`, or `f(c) - f(r)` for a relative bias `r`."""
  if relative_bias is None and isinstance(bias, float) and bias == 0.0:
    return mapping  # keeps the mapping's closed forms (Eq. 11: sigmoid(f) = (1 + c) / 2)
  fn = _Biased(mapping.fn, relative_bias is not None)
  if fn.key in mapping.params:
    raise ValueError(f"mapping {mapping.spec!r} has a parameter named {fn.key!r}, the name of "
                     "the sigmoid loss's bias.")
  value = bias if relative_bias is None else relative_bias
  return mappings.Mapping(mapping.spec, fn, {**mapping.params, fn.key: value},
                          mapping.scheduled, mapping.step, bound=True)  # checked by the loss


def _with_bias(mapping: mappings.Mapping, layout: _layout.Layout, bias, relative_bias, *,
               block_size, devices: Devices
               ) -> tuple[mappings.Mapping, _layout.Layout, jax.Array | None]:
  """The tiles' mapping and layout: a batch-scaled mapping's scale solved on the loss's batch
  (`_calibration.for_loss`, the scale returned), then the bias folded in."""
  mapping, layout, scale = _calibration.for_loss(mapping, layout, block_size=block_size,
                                                 devices=devices)
  if relative_bias is not None and layout.rows.scale is not None:
    raise ValueError("relative_bias r gives the logits f(c) - f(r) of one mapping f, but "
                     "perplexity_free scales every anchor by its own s_i; pass bias= (kept "
                     "outside the scale: s_i 2 artanh(c) + b), or a mapping with one scale.")
  return _biased(mapping, bias, relative_bias), layout, scale


def _setup(z1, z2, mapping, bias, relative_bias, negatives, reduction, *, devices: Devices,
           size: int):
  """Checks the inputs (`z1, z2` a device's share of the batch of `size` devices). Returns the
  inputs, the mapping (the bias not yet folded in: `_with_bias`) and the bias."""
  z1, z2 = _arguments.check_pair(z1, z2, local=devices.local)
  _arguments.check_mode(negatives, False, reduction)
  batch = z1.shape[0] * size
  mapping = _arguments.loss_mapping(
      mapping, num_candidates=_layout.candidates_per_anchor(batch, negatives),
      inputs=(z1, z2))
  bias = _check_bias(bias)
  if relative_bias is not None:
    relative_bias = _check_bias(relative_bias, "relative_bias")
    if _checks.is_concrete(relative_bias) and not -1.0 <= float(np.asarray(relative_bias)) <= 1.0:
      raise ValueError(
          f"relative_bias r is the cosine at which a pair's logit f(c) - f(r) is 0: it must lie "
          f"in [-1, 1], got {float(np.asarray(relative_bias))!r} (a mapping of cosines is not "
          "defined beyond them: the free mapping would clamp it to 1 - 8 ulps). For logits "
          "shifted by a free amount, pass bias= instead.")
    if not (isinstance(bias, float) and bias == 0.0):
      raise ValueError("give bias or relative_bias, not both (relative_bias replaces the bias "
                       f"by -f(relative_bias)); got bias={bias!r}.")
  return z1, z2, mapping, bias, relative_bias


@family(strategy="ring", one_device=("check_finite",), example="bias=-1.0",
        note="The ring is SigLIP's chunked form (open_clip's neighbour exchange): every device "
             "scores its rows against each block of candidates as it passes.")
def sigmoid_loss(
    z1: jax.typing.ArrayLike,
    z2: jax.typing.ArrayLike,
    *,
    devices: Devices,
    mapping: mappings.MappingLike | None = None,
    bias: float | jax.typing.ArrayLike = 0.0,
    relative_bias: float | jax.typing.ArrayLike | None = None,
    negatives: str = "cross",
    reduction: str = "mean",
    where: jax.typing.ArrayLike | None = None,
    block_size: int | None = None,
    check_finite: bool | str = False,
) -> Evaluation:
  r"""The sigmoid contrastive loss (SigLIP) with a pluggable similarity-to-logit mapping.

  Every scored pair is an independent binary term:

  .. math:: L_i = -\sum_{j} \log \sigma\big(\ell_{ij} (f(c_{ij}) + b)\big),
            \quad \ell_{ij} = +1 \text{ on the positive}, -1 \text{ elsewhere}

  and the loss is the mean of `L_i` over anchors (SigLIP's `sum / N`). With
  `f = exp(t) cos` and a learnable `b` this is SigLIP (Zhai et al. 2023; init `t = log 10`,
  `b = -10`); with the temperature-free mapping (Eq. 11) and `b = 0` the positive term is exact,
  `sigmoid(2 artanh c) = (1 + c)/2`, and the loss is
  `-sum_j log((1 + l_ij c_ij) / 2)`: the tiles use that closed form.

  * `negatives="cross"`: anchor `z1[i]`, pairs with every row of `z2` (`N^2` terms).
  * `negatives="all"`: the `2N` rows of `concat([z1, z2])` each against the other `2N - 1`;
    `S = U U^T` is symmetric and each off-diagonal tile serves its rows and columns.
  * `relative_bias=r` (Bangachev et al. 2025): logits `f(c) - f(r)`, i.e. `T (c - r)` for
    `f = T c`: the bias moves with the scale.

  Computed tile by tile with a custom VJP like `info_nce` (memory O(N * block + N * D)).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses, mappings
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 16))
    >>> z2 = z1 + 0.1 * jax.random.normal(jax.random.key(1), (8, 16))
    >>> free = losses.sigmoid_loss(z1, z2)  # temperature-free, no bias
    >>> scale = mappings.learnable_temperature(tau=0.1)   # t = log 10, bound to its value
    >>> siglip = losses.sigmoid_loss(z1, z2, bias=jnp.array(-10.0),
    ...     mapping=scale.bind(params=scale.params))
    >>> free.shape, bool(siglip > 0)
    ((), True)
    >>> losses.sigmoid_loss(z1, z2.at[0, 0].set(jnp.inf), check_finite=True)
    Traceback (most recent call last):
    ...
    ValueError: z2 must be finite (check_finite), got 1 NaN/inf value(s), the first in row 0.

  Args:
    z1: `[N, D]` float embeddings of the first view (images).
    z2: `[N, D]` float embeddings of the second view (texts); row `i` pairs with `z1[i]`.
    mapping: a `tfcl_jax.mappings.Mapping`, a mapping spec (`mappings.from_spec`; `"free_n"`
      takes `N` candidates per anchor for `"cross"`, `2N - 1` for `"all"`) or a callable
      `cos -> logits`; default `mappings.temperature_free()`. A mapping with trainable params
      is passed built and bound (`m.bind(params=...)`); its spec string is refused. A
      batch-scaled mapping (`mappings.calibrated_free()` ...) takes the scale solved from the
      softmax over each anchor's candidates, as `info_nce` would on the same batch (the sigmoid
      loss has no softmax of its own; `losses.batch_scale` with the same `negatives`); the bias
      stays outside it, `s 2 artanh(c) + b` (per anchor `s_i`; `relative_bias` is refused
      with a per-anchor scale).
    bias: `b`, a float (fixed) or a float scalar array (differentiable: pass the train
      state's leaf; `sigmoid_bias_init` gives SigLIP's -10 or the prior log-odds).
    relative_bias: `r` of the relative form instead of `bias`: the cosine at which a pair's
      logit is 0, a float or scalar array in `[-1, 1]` (a concrete `r` outside is refused; a
      traced one is checked under `check_finite`).
    negatives: `"cross"` or `"all"`.
    reduction: `"mean"` (over valid anchors), `"sum"`, or `"none"` (per-row sums).
    where: optional `[N]` bool mask of valid pairs (padded batches).
    block_size: the largest tile side, or None (automatic).
    check_finite: `False`, `True` or `"checkify"`: check that every input embedding is finite, and
      that the mapping's parameters meet its conditions (`Mapping.parameter_checks`: a traced `tau >
      0`, a learnable `t` finite), and `bias` finite (`relative_bias` in `[-1, 1]`): `ValueError`
      naming the argument or parameter on concrete arrays. `True` checks concrete values only and
      refuses traced ones (inside `jit`, `grad`, `vmap`) with a `ValueError` that says what to do;
      `"checkify"` checks traced values too, as `jax.experimental.checkify` checks that the caller
      reports: `err, loss = checkify.checkify(jax.jit(f))(...)`, then `err.throw()`. Off by default:
      it costs a reduction over the inputs. Without it a NaN input gives a NaN loss, and a traced
      `tau` is not checked: `tau = 0` gives a non-finite loss (inf, or NaN), `tau < 0` a finite but
      meaningless one (a concrete `tau <= 0` is refused by `mappings.temperature` itself).

  Returns:
    A float32 (float64 under x64 inputs) scalar, or `[N]` (`cross`) / `[2N]` (`all`)
    per-row losses.

  References:
    Zhai et al., Sigmoid Loss for Language Image Pre-Training, ICCV 2023; Bangachev et al.,
    arXiv 2509.18552; Kim & Kim, arXiv 2501.17683, Eq. 11.
  """
  _arguments.refuse_forward_mode(z1, z2, mapping, bias, relative_bias,
                                 loss=devices.name("sigmoid_loss"))
  size = devices.size("sigmoid_loss")
  z1, z2, mapping, bias, relative_bias = _setup(z1, z2, mapping, bias, relative_bias, negatives,
                                                reduction, devices=devices, size=size)
  if _arguments.check_finite_mode(check_finite):
    _arguments.check_finite(z1, name="z1", mode=check_finite)
    _arguments.check_finite(z2, name="z2", mode=check_finite)
    _arguments.check_parameters(_biased(mapping, bias, relative_bias), mode=check_finite)
  devices.check()
  valid = _arguments.check_where(where, z1.shape[0])
  block_size = _arguments.check_block_size(block_size)
  rows = devices.layout(z1, z2, negatives=negatives, symmetric=False, valid=valid, size=size)
  mapping, rows, scale = _with_bias(mapping, rows, bias, relative_bias, block_size=block_size,
                                    devices=devices)
  per_row, _ = devices.reduce_fn(rows.rows, rows.columns, mapping=mapping, kind=rows.kind,
                                 block_size=block_size, tile_reduction=SigmoidSum())
  return Evaluation(devices.reduce(per_row, rows.rows.valid, reduction=reduction,
                                   masked=where is not None), scale)


sharded_sigmoid_loss = sigmoid_loss.family.sharded
sigmoid_loss_on_mesh = sigmoid_loss.family.on_mesh


@dataclasses.dataclass(frozen=True)
class _BiasInit(specs.Deferred):
  """A bias init as a spec writes it: a number, or one of `BIAS_INITS` (`prior` needs the
  candidates)."""

  text: str

  @property
  def needs_candidates(self) -> bool:
    return self.text == "prior"

  def needing(self) -> str:
    return f"a {self.text} bias"

  def build(self, num_candidates):
    if self.text in BIAS_INITS:
      return sigmoid_bias_init(self.text, num_candidates=num_candidates)
    return float(self.text)


@dataclasses.dataclass(frozen=True)
class _BiasArg(specs.Arg):
  name: str = "bias"

  @property
  def regex(self) -> str:
    return "|".join([*BIAS_INITS, specs.NUMBER])

  def read(self, text):
    return _BiasInit(text)

  def write(self, value):
    return value.text

  def note(self):
    return "INIT is a number, siglip or prior"


@SPECS.register("sigmoid/<mapping>/learn_b=INIT", fixed={"learn_bias": True}, INIT=_BiasArg(),
                help="the same with a learnable bias starting at INIT")
@SPECS.register("sigmoid/<mapping>[/b=INIT]", INIT=_BiasArg(),
                help="sigmoid loss, scoring both directions, with the fixed bias INIT (default 0): "
                     "a number, siglip (-10) or prior")
@dataclasses.dataclass(frozen=True)
class SigmoidLoss(FamilyLoss):
  """SigLIP's sigmoid loss under a mapping, with its bias: `sigmoid_loss` as a `Loss`.

  Attributes:
    spec, mapping: as `Loss`'s.
    bias: the fixed bias, or the learnable bias's initial value.
    learn_bias: whether `bias` is a trainable parameter (the `"bias"` entry of `params`).
  """

  spec: str
  mapping: mappings.Mapping
  bias: float = 0.0
  learn_bias: bool = False
  softmax = False
  family = sigmoid_loss.family

  @property
  def params(self) -> dict:
    return {**super().params, **({"bias": jnp.asarray(self.bias, jnp.float32)}
                                 if self.learn_bias else {})}

  def options(self, params, log_q) -> dict:
    del log_q  # a sigmoid loss takes none (`Loss.evaluate`)
    return {"bias": params.get("bias", self.bias)}
