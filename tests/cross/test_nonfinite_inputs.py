"""NaN in, NaN out, for every array a loss takes: a non-finite candidate (in the batch, in a bank of
extra negatives, in a candidate bias) gives a NaN loss, never the loss without it; a row masked
out of the bank by `extra_where` counts for nothing; `check_finite` names every array argument
and its first bad row; an empty bank is the loss without a bank.

References are float64 NumPy transcriptions of InfoNCE with a bank, written here.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from tfcl_jax import losses

N, D, K = 6, 5, 4


def _views(seed=0):
  z1 = jax.random.normal(jax.random.key(seed), (N, D))
  z2 = z1 + 0.3 * jax.random.normal(jax.random.key(seed + 1), (N, D))
  bank = jax.random.normal(jax.random.key(seed + 2), (K, D))
  return z1, z2, bank


def _unit(z):
  z = np.asarray(z, np.float64)
  return z / np.linalg.norm(z, axis=1, keepdims=True)


def _free(cos):
  cos = np.clip(cos, -1 + 1e-12, 1 - 1e-12)
  return np.log1p(cos) - np.log1p(-cos)


def _logsumexp(x):
  top = x.max(axis=1, keepdims=True)
  return np.log(np.exp(x - top).sum(axis=1)) + top[:, 0]


def _numpy_info_nce(z1, z2, bank=None, *, negatives="cross"):
  """InfoNCE under the free mapping (Eq. 11), in float64: each anchor's candidates are the
  other view's rows (`cross`) or every other row (`all`), then the bank's rows."""
  u1, u2 = _unit(z1), _unit(z2)
  if negatives == "cross":
    anchors, candidates, positive = u1, u2, np.arange(len(u1))
  else:
    anchors = candidates = np.concatenate([u1, u2])
    positive = (np.arange(2 * len(u1)) + len(u1)) % (2 * len(u1))
  logits = _free(anchors @ candidates.T)
  if negatives == "all":
    np.fill_diagonal(logits, -np.inf)
  if bank is not None and len(bank):
    logits = np.concatenate([logits, _free(anchors @ _unit(bank).T)], axis=1)
  rows = _logsumexp(logits) - logits[np.arange(len(anchors)), positive]
  return float(rows.mean())


def _mesh():
  return jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])


# Every loss that takes a bank, as `f(z1, z2, bank, where)`.
BANK_LOSSES = {
    "cross": lambda a, b, k, w: losses.info_nce(a, b, extra_negatives=k, extra_where=w),
    "all": lambda a, b, k, w: losses.info_nce(a, b, extra_negatives=k, extra_where=w,
                                              negatives="all"),
    "clip": lambda a, b, k, w: losses.info_nce(a, b, extra_negatives=k, extra_where=w,
                                               symmetric=True),
    "pallas": lambda a, b, k, w: losses.info_nce(a, b, extra_negatives=k, extra_where=w,
                                                 implementation="pallas"),
    "on_mesh": lambda a, b, k, w: losses.info_nce_on_mesh(a, b, mesh=_mesh(),
                                                          extra_negatives=k, extra_where=w),
    "on_mesh ring all": lambda a, b, k, w: losses.info_nce_on_mesh(
        a, b, mesh=_mesh(), extra_negatives=k, extra_where=w, strategy="ring", negatives="all"),
}
# Compiled once per loss and input structure (eager, the sharded forms dispatch op by op).
BANK_LOSSES = {name: jax.jit(loss) for name, loss in BANK_LOSSES.items()}


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("loss", list(BANK_LOSSES))
def test_a_non_finite_bank_row_gives_a_nan_loss(loss, value):
  # The bank once vanished: the loss came out as the loss without a bank, exactly.
  z1, z2, bank = _views()
  bad = bank.at[1, 2].set(value)
  assert np.isnan(BANK_LOSSES[loss](z1, z2, bad, None))
  assert np.isfinite(BANK_LOSSES[loss](z1, z2, bank, None))


@pytest.mark.parametrize("loss", ["cross", "all", "pallas", "on_mesh"])
def test_a_masked_bank_row_counts_for_nothing_whatever_it_holds(loss):
  z1, z2, bank = _views()
  where = jnp.array([True, False, True, True])
  bad = bank.at[1].set(jnp.nan)
  negatives = "all" if loss == "all" else "cross"
  expected = _numpy_info_nce(z1, z2, np.asarray(bank)[np.asarray(where)], negatives=negatives)
  np.testing.assert_allclose(BANK_LOSSES[loss](z1, z2, bad, where), expected, rtol=1e-5)
  # Nor does it reach the gradient through the tile products (0 * NaN).
  grad = jax.grad(BANK_LOSSES[loss], argnums=(0, 1))(z1, z2, bad, where)
  assert all(np.all(np.isfinite(g)) for g in grad)


@pytest.mark.parametrize("negatives", ["cross", "all"])
def test_a_nan_candidate_in_the_batch_gives_nan_on_every_row_that_scores_it(negatives):
  # NaN in, NaN out, row by row: a row whose candidates include a NaN row does not lose its
  # negatives (it once gave a per-row loss of 0).
  z1, z2, _ = _views()
  rows = losses.info_nce(z1, z2.at[2, 0].set(jnp.nan), negatives=negatives, reduction="none")
  assert np.all(np.isnan(rows))


def test_a_nan_candidate_bias_gives_a_nan_loss():
  z1, z2, _ = _views()
  bias = jnp.zeros((N,)).at[3].set(jnp.nan)
  assert np.all(np.isnan(losses.info_nce(z1, z2, candidate_bias=bias, reduction="none")))


@pytest.mark.parametrize("loss", ["cross", "all", "on_mesh"])
def test_an_empty_bank_is_the_loss_without_a_bank(loss):
  # K = 0 extra candidates add nothing: by definition the loss without a bank (it once raised
  # ZeroDivisionError).
  z1, z2, _ = _views()
  empty = jnp.zeros((0, D))
  negatives = "all" if loss == "all" else "cross"
  expected = _numpy_info_nce(z1, z2, negatives=negatives)
  np.testing.assert_allclose(BANK_LOSSES[loss](z1, z2, empty, None), expected, rtol=1e-5)
  np.testing.assert_allclose(BANK_LOSSES[loss](z1, z2, empty, jnp.zeros((0,), bool)), expected,
                             rtol=1e-5)


def test_an_empty_bank_with_the_free_n_mapping_counts_no_extra_candidate():
  z1, z2, _ = _views()
  np.testing.assert_allclose(
      losses.info_nce(z1, z2, extra_negatives=jnp.zeros((0, D)), mapping="free_n"),
      losses.info_nce(z1, z2, mapping=f"free_n={N}"), rtol=1e-6)


# -- check_finite names every array argument and its first bad row ----------------------------


def _bad_arguments():
  z1, z2, bank = _views()
  bias = jnp.zeros((N,))
  return {
      "extra_negatives": (lambda **kw: losses.info_nce(
          z1, z2, extra_negatives=bank.at[2, 1].set(jnp.inf), **kw), 2),
      "candidate_bias": (lambda **kw: losses.info_nce(
          z1, z2, candidate_bias=bias.at[4].set(jnp.nan), **kw), 4),
      "candidate_bias[1]": (lambda **kw: losses.info_nce(
          z1, z2, symmetric=True, candidate_bias=(bias, bias.at[5].set(jnp.nan)), **kw), 5),
      "z1": (lambda **kw: losses.info_nce(z1.at[1, 0].set(jnp.nan), z2, **kw), 1),
      "z2": (lambda **kw: losses.sigmoid_loss(z1, z2.at[3, 0].set(jnp.nan), **kw), 3),
      "z": (lambda **kw: losses.supervised_info_nce(
          z1.at[0, 0].set(jnp.nan), jnp.array([0, 0, 1, 1, 2, 2]), form="supcon", **kw), 0),
  }


@pytest.mark.parametrize("name", list(_bad_arguments()))
def test_check_finite_names_the_argument_and_its_first_bad_row(name):
  fn, row = _bad_arguments()[name]
  with pytest.raises(ValueError, match=rf"^{re.escape(name)} must be finite \(check_finite\), "
                                       rf"got 1 NaN/inf value\(s\), the first in row {row}\.$"):
    fn(check_finite=True)
  assert np.isnan(fn()) or np.isinf(fn())  # unchecked: NaN in, NaN out


@pytest.mark.parametrize("name", list(_bad_arguments()))
def test_checkify_names_the_argument_and_its_first_bad_row_under_jit(name):
  fn, row = _bad_arguments()[name]
  error, _ = checkify.checkify(jax.jit(lambda: fn(check_finite="checkify")))()
  assert error.get().startswith(f"{name} must be finite (check_finite), got NaN/inf value(s), "
                                f"the first in row {row}.")


def test_check_finite_leaves_out_the_bank_rows_extra_where_masks():
  z1, z2, bank = _views()
  bad = bank.at[1].set(jnp.nan)
  where = jnp.array([True, False, True, True])
  loss = losses.info_nce(z1, z2, extra_negatives=bad, extra_where=where, check_finite=True)
  assert np.isfinite(loss)
  error, _ = checkify.checkify(jax.jit(lambda k, w: losses.info_nce(
      z1, z2, extra_negatives=k, extra_where=w, check_finite="checkify")))(bad, where)
  assert error.get() is None
  with pytest.raises(ValueError, match="extra_negatives must be finite .* the first in row 1"):
    losses.info_nce(z1, z2, extra_negatives=bad, extra_where=~where, check_finite=True)


def test_check_finite_names_a_non_finite_sigmoid_bias_by_its_value():
  z1, z2, _ = _views()
  with pytest.raises(ValueError, match=r"^bias must be finite \(check_finite\), got nan"):
    losses.sigmoid_loss(z1, z2, bias=jnp.asarray(jnp.nan), check_finite=True)
