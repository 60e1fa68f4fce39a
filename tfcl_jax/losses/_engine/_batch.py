"""A loss's batch of pairs checked and laid out on its devices: the inputs, the mapping, the layout
of the similarity matrix, the bank and the candidates' bias (`Batch`), as InfoNCE and the batch
scale (`losses.batch_scale`) read them, on one device or on each device's share."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tfcl_jax import _checks, mappings
from tfcl_jax.losses._engine import _arguments, _layout
from tfcl_jax.losses._engine._devices import Devices
from tfcl_jax.losses._engine._tiles import Side

#: How InfoNCE's in-batch logsumexp is computed: the tiled engine, or the fused kernels.
IMPLEMENTATIONS = ("xla", "pallas")


class Batch(NamedTuple):
  """A checked batch: the inputs, the loss's mapping, the layout of its similarity matrix, the
  bank's side (or None), each anchor's positive candidate's bias (or None) and the tile side."""

  z1: jax.Array
  z2: jax.Array
  mapping: mappings.Mapping
  layout: _layout.Layout
  bank: Side | None
  bias: jax.Array | None
  block_size: int | None


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


def setup(z1, z2, *, devices: Devices, family: str, mapping, negatives: str, symmetric: bool,
          reduction: str, where, block_size, extra_negatives=None, extra_where=None,
          implementation: str = "xla", candidate_bias=None, check_finite: bool | str = False
          ) -> Batch:
  """The arguments of `family`'s loss on `devices` checked (each error names its argument) and
  laid out: `Batch`. A sharded loss's `z1, z2` are its device's share of the batch."""
  size = devices.size(family)
  z1, z2 = _arguments.check_pair(z1, z2, local=devices.local)
  if _arguments.check_finite_mode(check_finite):
    _arguments.check_finite(z1, name="z1", mode=check_finite)
    _arguments.check_finite(z2, name="z2", mode=check_finite)
  _arguments.check_mode(negatives, symmetric, reduction)
  devices.check()
  valid = _arguments.check_where(where, z1.shape[0])
  block_size = _arguments.check_block_size(block_size)
  bank, bank_where = _arguments.check_extra(extra_negatives, extra_where, z1.shape[1])
  if check_finite and bank is not None:
    _arguments.check_finite(bank, name="extra_negatives", mode=check_finite, where=bank_where)
  mapping = _arguments.loss_mapping(
      mapping, num_candidates=_layout.candidates_per_anchor(z1.shape[0] * size, negatives, bank),
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
      if side_bias is not None:
        _arguments.check_finite(side_bias, name=name, mode=check_finite)
  rows = devices.layout(z1, z2, negatives=negatives, symmetric=symmetric, valid=valid, size=size)
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
