"""InfoNCE / NT-Xent and CLIP's two-tower loss (Section 2, Eq. 1; Eq. 11-12 when free)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tfcl_jax import mappings
from tfcl_jax.losses._engine import _arguments, _batch, _calibration, _layout
from tfcl_jax.losses._engine._devices import Devices
from tfcl_jax.losses._engine._tiled import tile_reduce
from tfcl_jax.losses._family import Evaluation, family
from tfcl_jax.losses._kernels import _pallas
from tfcl_jax.losses._loss import SPECS, FamilyLoss
from tfcl_jax.losses._supervised import supervised_info_nce


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


@family(strategy="all_gather", one_device=("implementation", "candidate_bias", "check_finite"),
        example="symmetric=True",
        note="With `symmetric=True` each device's tiles also give every column its partial "
             "logsumexp: combined over devices by a `psum` (gathered), or sent round with its "
             "block (the ring).")
def info_nce(
    z1: jax.typing.ArrayLike,
    z2: jax.typing.ArrayLike,
    *,
    devices: Devices,
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
) -> Evaluation:
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
                                 loss=devices.name("info_nce"))
  batch = _batch.setup(z1, z2, devices=devices, family="info_nce", mapping=mapping,
                       negatives=negatives, symmetric=symmetric, reduction=reduction, where=where,
                       block_size=block_size, extra_negatives=extra_negatives,
                       extra_where=extra_where, implementation=implementation,
                       candidate_bias=candidate_bias, check_finite=check_finite)
  mapping, rows, scale = _calibration.for_loss(
      batch.mapping, batch.layout, bank=batch.bank, positive_bias=batch.bias,
      block_size=batch.block_size, devices=devices)
  lse_fn, bank_fn = devices.reduce_fn, tile_reduce
  if implementation == "pallas":
    if not _pallas.supports(mapping):
      raise ValueError("implementation='pallas' needs a tfcl_jax.mappings.Mapping whose params "
                       f"are scalars, got {mapping!r}; use implementation='xla'.")
    lse_fn = bank_fn = _pallas.pallas_reduce
  lse = negatives_lse(rows, mapping=mapping, block_size=batch.block_size, bank=batch.bank,
                      lse_fn=lse_fn, bank_fn=bank_fn)
  per_row = row_losses(rows, lse, mapping, positive_bias=batch.bias)
  return Evaluation(devices.reduce(per_row, _layout.anchor_valid(rows), reduction=reduction,
                                   masked=where is not None), scale)


sharded_info_nce = info_nce.family.sharded
info_nce_on_mesh = info_nce.family.on_mesh


@SPECS.register("clip:<mapping>[+logq]", fixed={"symmetric": True},
                help="CLIP's symmetric InfoNCE, scoring both directions, e.g. "
                     "clip:learnable=0.07:100; +logq: each direction's candidates corrected")
@SPECS.register("<mapping>[+logq]",
                help="InfoNCE under the mapping (free, tau=0.5, learnable=0.07); +logq: each "
                     "candidate's logit minus log q, its log sampling probability (logQ)")
@dataclasses.dataclass(frozen=True)
class InfoNCELoss(FamilyLoss):
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
  family = info_nce.family

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

  def options(self, params, log_q) -> dict:
    return {"symmetric": self.symmetric, **self._candidate_bias(log_q)}

  def supervised(self, z, labels, *, form, params, step=None) -> Evaluation:
    """`supervised_info_nce(z, labels, form=form)` under the loss's mapping at `params`, with
    the scale it solved."""
    if not self.supervised_form:
      return super().supervised(z, labels, form=form, params=params, step=step)
    return supervised_info_nce.evaluate(z, labels, form=form,
                                        mapping=self.bound_mapping(params, step))
