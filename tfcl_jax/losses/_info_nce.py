"""InfoNCE / NT-Xent and CLIP's two-tower loss (Section 2, Eq. 1; Eq. 11-12 when free)."""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, cast

import jax
import jax.numpy as jnp

from tfcl_jax import _checks, mappings
from tfcl_jax.losses._engine import _arguments, _calibration, _layout
from tfcl_jax.losses._engine._tiled import tile_reduce
from tfcl_jax.losses._engine._tiles import Side
from tfcl_jax.losses._kernels import _pallas
from tfcl_jax.losses._loss import SPECS, Loss, check_mapping
from tfcl_jax.losses._supervised import supervised_info_nce
from tfcl_jax.mappings._batch_scaled import BatchScaled

IMPLEMENTATIONS = ("xla", "pallas")


def log_add(a: jax.Array, b: jax.Array) -> jax.Array:
  """`log(exp(a) + exp(b))` with value `-inf` and zero (not NaN) gradients where both are `-inf`
  (no negatives on either side); a NaN on either side gives NaN (NaN in, NaN out)."""
  empty = (a == -jnp.inf) & (b == -jnp.inf)
  out = jnp.logaddexp(jnp.where(empty, 0.0, a), jnp.where(empty, 0.0, b))
  return jnp.where(empty, -jnp.inf, out)


def negatives_lse(layout: _layout.Layout, *, mapping, block_size, bank=None,
                  lse_fn=tile_reduce, bank_fn=tile_reduce) -> jax.Array:
  """Per anchor, the logsumexp of its negatives' logits (in-batch, then the extra bank).

  `lse_fn` computes the in-batch part (the single-device engine, a cross-device one, or the
  fused kernels), `bank_fn` the bank's (the engine or the kernels, on each device's anchors).
  """
  row_lse, col_lse = lse_fn(layout.rows, layout.columns, mapping=mapping, kind=layout.kind,
                            block_size=block_size)
  if bank is not None:
    def bank_lse(anchors):
      return bank_fn(anchors, bank, mapping=mapping, kind="rows", block_size=block_size,
                     column_grad=False)[0]

    row_lse = log_add(row_lse, bank_lse(layout.rows))
    if col_lse is not None:
      col_lse = log_add(col_lse, bank_lse(layout.columns))
  return row_lse if col_lse is None else jnp.concatenate([row_lse, col_lse])


def row_losses(layout: _layout.Layout, lse: jax.Array, mapping, positive_bias=None
               ) -> jax.Array:
  """`L_i = softplus(lse_i - s_i f(c_{i,i+}) - b_{i+})`, Eq. 1 / 12 per anchor (`b` the positive
  candidate's bias, 0 without one; `s_i` the anchor's scale, `Side.scale`, 1 without one).

  Equal to `logsumexp_{j in K_i} f(c_ij) - f(c_{i,i+})` but computed from the negatives'
  logsumexp: `lse_all - positive` cancels to 0 in float32 once the loss drops below ~1e-7,
  exactly where Eq. 12 says L -> 0 matters.
  """
  positive = mapping(layout.positive_cos)
  scale = _calibration.anchor_scale(layout)
  if scale is not None:  # a per-anchor scale (`Side.scale`), as the tiles apply it
    positive = scale * positive
  if positive_bias is not None:
    positive = positive + positive_bias
  return jax.nn.softplus(lse - positive)


def check_candidate_bias(candidate_bias, n: int, *, negatives: str, symmetric: bool,
                         extra_negatives, implementation: str
                         ) -> tuple[jax.Array, jax.Array | None] | None:
  """Checks `candidate_bias`: None; `[N]` floats, the bias of `z2`'s rows as candidates of the
  one-directional `cross` loss; or, for CLIP's symmetric loss, a pair `(z2's, z1's)`, each
  direction's candidates. Returns `(bias of z2's rows, bias of z1's rows or None)`, constants.
  """
  if candidate_bias is None:
    return None
  if negatives != "cross":
    raise ValueError("candidate_bias corrects the candidates of a two-tower loss: it needs "
                     "negatives='cross'.")
  if extra_negatives is not None:
    raise ValueError("candidate_bias is not defined for extra_negatives (they carry no bias).")
  if implementation != "xla":
    raise ValueError("candidate_bias needs implementation='xla'.")
  if symmetric:
    if not isinstance(candidate_bias, (tuple, list)) or len(candidate_bias) != 2:
      raise ValueError("with symmetric=True, candidate_bias is a pair (bias of z2's rows as the "
                       "candidates of z1 -> z2, bias of z1's rows as the candidates of z2 -> z1), "
                       f"e.g. (-log q_items, -log q_users); got {type(candidate_bias).__name__}.")
    columns = _arguments.check_bias_row(candidate_bias[0], n, rows="z2")
    rows = _arguments.check_bias_row(candidate_bias[1], n, rows="z1")
    return jax.lax.stop_gradient(columns), jax.lax.stop_gradient(rows)
  if isinstance(candidate_bias, (tuple, list)):
    raise ValueError("a pair of candidate biases is for symmetric=True (CLIP's loss); the "
                     "one-directional loss takes the [N] bias of z2's rows.")
  return jax.lax.stop_gradient(_arguments.check_bias_row(candidate_bias, n, rows="z2")), None


def info_nce(
    z1: jax.typing.ArrayLike,
    z2: jax.typing.ArrayLike,
    *,
    mapping: mappings.MappingLike | None = None,
    negatives: str = "cross",
    symmetric: bool = False,
    reduction: str = "mean",
    where: jax.typing.ArrayLike | None = None,
    block_size: int | None = None,
    extra_negatives: jax.typing.ArrayLike | None = None,
    extra_where: jax.typing.ArrayLike | None = None,
    implementation: str = "xla",
    candidate_bias: jax.typing.ArrayLike | None = None,
    check_finite: bool | str = False,
) -> jax.Array:
  r"""InfoNCE of two views with a pluggable similarity-to-logit mapping (Eq. 1, 11).

  For anchor `i` with positive `i+` and candidate set `K_i`,

  .. math:: L_i = -\log \frac{\exp(f(\cos\theta_{i,i+}))}{\sum_{j \in K_i} \exp(f(\cos\theta_{ij}))}

  with `f = cos / tau` (Eq. 1) or `f = 2 artanh(cos)` (Eq. 11, the default).

  * `negatives="cross"` (Eq. 1): anchor `z1[i]`, candidates every row of `z2`, positive
    `z2[i]`: `N` per-row losses. One direction, `z1 -> z2`.
  * `negatives="cross", symmetric=True` (CLIP's two-tower loss, open_clip `ClipLoss`): also
    anchor `z2[j]` against every row of `z1`; the loss is the mean of the two directions'
    means, `2N` per-row losses (`z1 -> z2` rows, then `z2 -> z1`), from one pass over the
    `[N, N]` similarities.
  * `negatives="all"` (SimCLR's NT-Xent, also GRACE's loss): the `2N` rows of
    `concat([z1, z2])` are anchors; each is scored against the other `2N - 1` rows (itself
    excluded), positive the other view of the same pair. Per-row losses are ordered `z1` rows
    then `z2` rows.
  * `extra_negatives` (a memory bank or queue, e.g. `losses.queue`): `K` more candidates for
    every anchor, under `stop_gradient`, masked by `extra_where`.
  * `candidate_bias` (`cross`): `b_j` added to the logit of candidate `z2[j]` for every
    anchor, its own positive included: `f(c_ij) + b_j`. With `b_j = -log q_j`, `q_j` the
    probability that item `j` is in a batch, this is the sampling-bias (logQ) correction of
    in-batch negatives (Yi et al. 2019; TFRS's `candidate_sampling_probability`). With
    `symmetric=True` it is a pair, one bias per direction's candidates: `(b, b')`, `b` of
    `z2`'s rows in `z1 -> z2`, `b'` of `z1`'s rows in `z2 -> z1` (e.g. `-log q` of the items
    and of the users). It acts in logit space after the mapping: under
    `cos / tau` it is the usual `cos/tau - log q`; under the free map the corrected logit is
    `2 artanh(c) - log q`, the cosine's log-odds shifted by the same amount. Under `cos/tau`
    the correction weighs less against the similarity as `tau` shrinks; the free mapping has no
    `tau`, so that balance is fixed.

  Embeddings are L2-normalised inside (a zero vector gives cosine 0 and finite gradients).
  With bfloat16 and float16 inputs the tile products take their dtype, accumulated in float32;
  the mapping, the statistics and the result are float32, the gradients in the inputs' dtype.

  Cost: the logits are computed tile by tile and never held (`block_size`); the backward
  pass recomputes each tile (a custom VJP), so memory is O(N * block + N * D) for every
  mapping. For `"all"`, `S = U U^T` is symmetric and each off-diagonal tile serves its rows
  and its columns: about two `[2N, 2N, D]` products for loss and gradient, where the dense
  computation needs three. Mappings that declare a closed form of `exp(f(c))` (Eq. 11:
  `(1 + c)/(1 - c)`; `tau` not below 1/30 in float32) use it, with no running maximum.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses, mappings
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 16))
    >>> z2 = z1 + 0.1 * jax.random.normal(jax.random.key(1), (8, 16))
    >>> loss = losses.info_nce(z1, z2)  # temperature-free
    >>> bool(loss < jnp.log(8))
    True
    >>> nt_xent = losses.info_nce(z1, z2, mapping=mappings.temperature(0.5), negatives="all")
    >>> clip_scale = mappings.learnable_temperature(tau=0.07)  # t = log(1 / 0.07), bound:
    >>> clip = losses.info_nce(z1, z2, mapping=clip_scale.bind(params=clip_scale.params),
    ...                        symmetric=True)
    >>> nt_xent.shape, clip.shape
    ((), ())
    >>> from jax.experimental import checkify
    >>> bad = z1.at[3, 0].set(jnp.nan)
    >>> losses.info_nce(bad, z2, check_finite=True)
    Traceback (most recent call last):
    ...
    ValueError: z1 must be finite (check_finite), got 1 NaN/inf value(s), the first in row 3.
    >>> jitted = jax.jit(lambda a, b: losses.info_nce(a, b, check_finite="checkify"))
    >>> error, loss = checkify.checkify(jitted)(bad, z2)
    >>> error.get().startswith("z1 must be finite")
    True

  Args:
    z1: `[N, D]` float embeddings of the first view.
    z2: `[N, D]` float embeddings of the second view; row `i` is the positive of `z1[i]`.
    mapping: a `tfcl_jax.mappings.Mapping`, a mapping spec (`"free"`, `"tau=0.1"`:
      `mappings.from_spec`; `"free_n"` takes this loss's candidates per anchor, `N` for
      `"cross"` and `2N - 1` for `"all"`, plus the `K` extra negatives) or any callable
      `cos -> logits`, applied elementwise; default `mappings.temperature_free()`. A mapping
      with trainable params is passed built and bound (`m.bind(params=...)`): its spec
      string is refused, since a string cannot hold the params. A batch-scaled mapping
      (`mappings.calibrated_free()`, `perplexity_free()`, `accuracy_free()`) gets its scale
      solved from this batch by one more forward pass over the similarities, without a
      gradient (`losses.batch_scale` returns it; `m.bind(scale=s)` skips the solve).
    negatives: `"cross"` or `"all"` (see above).
    symmetric: with `"cross"`, average both directions (CLIP); refused with `"all"`.
    reduction: `"mean"` (over valid anchors), `"sum"`, or `"none"` (per-row losses).
    where: optional `[N]` bool mask of valid pairs (padded batches). Masked pairs are neither
      anchors nor candidates, so the loss equals the loss on the valid subset; their per-row
      losses are 0. With no valid pair the mean is 0.
    block_size: the largest tile side, an int > 0 (a value >= the rows gives one dense
      tile), or None: chosen from the sizes and the backend (`losses.auto_block_size`).
    extra_negatives: optional `[K, D]` float candidates added for every anchor (no gradient);
      `K = 0` is the loss without a bank. A NaN or inf in a valid row gives a NaN loss.
    extra_where: optional `[K]` bool mask of valid extra negatives; a masked row counts for
      nothing, whatever it holds.
    candidate_bias: optional `[N]` float logit offsets of the rows of `z2` as candidates, or
      with `symmetric=True` the pair `(z2's, z1's)` (see above; no gradient);
      `negatives="cross"`, `implementation="xla"`.
    implementation: `"xla"` (the tiled engine) or `"pallas"` (one fused kernel per row block
      for the in-batch logsumexp, for any `Mapping` with scalar params; Triton on a GPU, the
      Pallas interpreter elsewhere, which is slow and meant for tests). A per-anchor scale
      (`mappings.perplexity_free`) is refused there; the batch scale's pass runs on the XLA
      engine.
    check_finite: `False`, `True` or `"checkify"`: check that every array argument is finite
      (`z1`, `z2`, the valid rows of `extra_negatives`, `candidate_bias`), and that the mapping's
      parameters meet its conditions (`Mapping.parameter_checks`: a traced `tau > 0`, a learnable
      `t` finite): `ValueError` naming the argument and its first bad row, or the parameter, on
      concrete arrays. `True` checks concrete values only and refuses traced ones (inside `jit`,
      `grad`, `vmap`) with a `ValueError` that says what to do; `"checkify"` checks traced values
      too, as `jax.experimental.checkify` checks that the caller reports: `err, loss =
      checkify.checkify(jax.jit(f))(...)`, then `err.throw()`. Off by default: it costs a
      reduction over the inputs. Without it a NaN input gives a NaN loss, and a traced `tau` is
      not checked: `tau = 0` gives a NaN loss, `tau < 0` a finite but meaningless one (a concrete
      `tau <= 0` is refused by `mappings.temperature` itself).

  Returns:
    A float32 (float64 under x64 inputs) scalar, or the per-row losses: `[N]` (`cross`) or
    `[2N]` (`all`, and `cross` with `symmetric=True`).

  References:
    van den Oord et al. 2018 (InfoNCE); Chen et al. 2020 (SimCLR, NT-Xent); Radford et al.
    2021 (CLIP); Yi et al. 2019 (sampling-bias-corrected two-tower retrieval); Kim & Kim,
    arXiv 2501.17683, Eq. 1, 11 and 12.
  """
  _arguments.refuse_forward_mode(z1, z2, mapping, extra_negatives, candidate_bias,
                                 loss="info_nce")
  batch = setup(z1, z2, mapping=mapping, negatives=negatives, symmetric=symmetric,
                reduction=reduction, where=where, block_size=block_size,
                extra_negatives=extra_negatives, extra_where=extra_where,
                implementation=implementation, candidate_bias=candidate_bias,
                check_finite=check_finite)
  mapping, rows = _calibration.for_loss(batch.mapping, batch.layout, bank=batch.bank,
                                        positive_bias=batch.bias, block_size=batch.block_size)
  lse_fn = tile_reduce
  if implementation == "pallas":
    if not _pallas.supports(mapping):
      raise ValueError("implementation='pallas' needs a tfcl_jax.mappings.Mapping whose params "
                       f"are scalars, got {mapping!r}; use implementation='xla'.")
    lse_fn = _pallas.pallas_reduce
  lse = negatives_lse(rows, mapping=mapping, block_size=batch.block_size, bank=batch.bank,
                      lse_fn=lse_fn, bank_fn=lse_fn)
  per_row = row_losses(rows, lse, mapping, positive_bias=batch.bias)
  return _layout.reduce(per_row, _layout.anchor_valid(rows), reduction, masked=where is not None)


class Batch(NamedTuple):
  """A checked InfoNCE batch: the inputs, the loss's mapping, the layout of its similarity
  matrix, the bank's side (or None), each anchor's positive candidate's bias (or None) and the tile
  side."""

  z1: jax.Array
  z2: jax.Array
  mapping: mappings.Mapping
  layout: _layout.Layout
  bank: Side | None
  bias: jax.Array | None
  block_size: int | None


def setup(z1, z2, *, mapping, negatives: str, symmetric: bool, reduction: str, where,
          block_size, extra_negatives, extra_where, implementation: str, candidate_bias,
          check_finite) -> Batch:
  """`info_nce`'s arguments checked (each error names its argument) and laid out: `Batch`."""
  z1, z2 = _arguments.check_pair(z1, z2)
  if _arguments.check_finite_mode(check_finite):
    _arguments.check_finite(z1, name="z1", mode=check_finite)
    _arguments.check_finite(z2, name="z2", mode=check_finite)
  _arguments.check_mode(negatives, symmetric, reduction)
  valid = _arguments.check_where(where, z1.shape[0])
  block_size = _arguments.check_block_size(block_size)
  bank, bank_where = _arguments.check_extra(extra_negatives, extra_where, z1.shape[1])
  if check_finite and bank is not None:
    _arguments.check_finite(bank, name="extra_negatives", mode=check_finite, where=bank_where)
  mapping = _arguments.loss_mapping(
      mapping, num_candidates=_layout.candidates_per_anchor(z1.shape[0], negatives, bank),
      inputs=(z1, z2))
  if check_finite:
    _arguments.check_parameters(mapping, mode=check_finite)

  _checks.one_of(implementation, IMPLEMENTATIONS, name="implementation")
  bias = check_candidate_bias(candidate_bias, z1.shape[0], negatives=negatives,
                              symmetric=symmetric, extra_negatives=bank,
                              implementation=implementation)
  if check_finite and bias is not None:
    names = ("candidate_bias[0]", "candidate_bias[1]") if symmetric else ("candidate_bias",)
    for name, side_bias in zip(names, bias, strict=False):
      _arguments.check_finite(side_bias, name=name, mode=check_finite)
  rows = _layout.layout(z1, z2, negatives=negatives, symmetric=symmetric, valid=valid)
  dtype = _checks.compute_dtype(z1.dtype, z2.dtype)
  positive_bias = None
  if bias is not None:
    assert rows.columns is not None  # negatives="cross": z2's rows are the candidates
    column_bias, row_bias = (None if b is None else b.astype(dtype) for b in bias)
    rows = rows._replace(columns=rows.columns._replace(bias=column_bias))
    positive_bias = column_bias  # anchor z1[i]'s positive is the candidate z2[i]
    if row_bias is not None:  # and z2[j]'s is z1[j], a candidate of the direction z2 -> z1
      rows = rows._replace(rows=rows.rows._replace(bias=row_bias))
      assert column_bias is not None  # check_candidate_bias: a pair has z2's bias first
      positive_bias = jnp.concatenate([column_bias, row_bias])
  bank = None if bank is None else _layout.bank_side(bank, bank_where, rows.rows.vectors.dtype)
  return Batch(z1, z2, mapping, rows, bank, positive_bias, block_size)


@dataclasses.dataclass(frozen=True)
class InfoNCELoss(Loss):
  """InfoNCE under a mapping (Eq. 1; Eq. 11-12 under `free`): `info_nce` as a `Loss`.

  CLIP's symmetric loss is this family with `symmetric=True` (`clip:<mapping>`), not a family of
  its own: the same function (`info_nce(..., symmetric=True)`), parameters and checks, scoring
  both directions; with `+logq` it corrects each direction's candidates (`log_q` a pair, the
  log sampling probabilities of `z2`'s rows and of `z1`'s).
  Its supervised form is SupCon (`supervised`: `supervised_info_nce` under its mapping).

  Examples:
    >>> from tfcl_jax import losses
    >>> clip = losses.from_spec("clip:learnable=0.07:100")
    >>> type(clip).__name__, clip.symmetric, clip.mapping.spec
    ('InfoNCELoss', True, 'learnable=0.07:100')

  Attributes:
    spec, mapping, logq: as `Loss`'s.
    symmetric: both directions, `z1 -> z2` and `z2 -> z1` (CLIP's loss, `clip:`).
  """

  spec: str
  mapping: mappings.Mapping
  symmetric: bool = False
  logq: bool = False
  softmax = True

  def __post_init__(self):
    check_mapping(self.mapping, "InfoNCELoss")

  @property
  def supervised_form(self) -> bool:
    return not (self.symmetric or self.logq)

  @property
  def log_q_sides(self) -> int:
    return int(self.logq) * (2 if self.symmetric else 1)

  def _candidate_bias(self, log_q) -> dict:
    """`info_nce`'s `candidate_bias` from the call's `log_q` (`-log q`; a pair for CLIP's)."""
    if log_q is None:
      return {}
    if self.symmetric:
      if not isinstance(log_q, (tuple, list)) or len(log_q) != 2:
        raise ValueError(f"loss {self.spec!r} corrects both directions: log_q must be a pair, "
                         "the log sampling probabilities of z2's rows and of z1's rows "
                         f"(e.g. items' and users'), got {type(log_q).__name__}.")
      return {"candidate_bias": tuple(-jnp.asarray(q) for q in log_q)}
    return {"candidate_bias": -jnp.asarray(log_q)}

  def compute(self, z1, z2, *, params, step, log_q, **kwargs) -> jax.Array:
    return info_nce(z1, z2, mapping=self.bound_mapping(params, step), symmetric=self.symmetric,
                    **kwargs, **self._candidate_bias(log_q))

  def solve_scale(self, z1, z2, *, log_q=None, **kwargs) -> jax.Array:
    """`losses.batch_scale` with the call's arguments (`info_nce`'s that set the scale)."""
    if not self.batch_scaled:
      return super().solve_scale(z1, z2, log_q=log_q, **kwargs)
    options = {"negatives": "cross", "where": None, "block_size": None, "extra_negatives": None,
               "extra_where": None, "candidate_bias": None}
    options |= {k: v for k, v in kwargs.items() if k in options}
    options |= self._candidate_bias(log_q)
    batch = setup(z1, z2, mapping=self.mapping, symmetric=self.symmetric, reduction="mean",
                  implementation="xla", check_finite=False, **options)
    return _calibration.solve_batch(cast(BatchScaled, batch.mapping.fn), batch)

  def supervised_scale(self, z, labels) -> jax.Array:
    if not (self.batch_scaled and self.supervised_form):
      return super().supervised_scale(z, labels)
    assert self.mapping is not None  # batch_scaled
    return _calibration.supervised_scale(cast(BatchScaled, self.mapping.fn), z, labels)

  def supervised(self, z, labels, *, form, params, step=None) -> jax.Array:
    """`supervised_info_nce(z, labels, form=form)` under the loss's mapping at `params`."""
    if not self.supervised_form:
      return super().supervised(z, labels, form=form, params=params, step=step)
    return supervised_info_nce(z, labels, form=form, mapping=self.bound_mapping(params, step))


SPECS.register("<mapping>[+logq]", InfoNCELoss,
               help="InfoNCE under the mapping (free, tau=0.5, learnable=0.07); +logq: each "
                    "candidate's logit minus log q, its log sampling probability (logQ)")
SPECS.register("clip:<mapping>[+logq]", functools.partial(InfoNCELoss, symmetric=True),
               help="CLIP's symmetric InfoNCE, scoring both directions, e.g. "
                    "clip:learnable=0.07:100; +logq: each direction's candidates corrected")
