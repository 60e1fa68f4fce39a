"""The engine's declared contract for a loss family, `_tiles.TileReduction`.

A reduction written against the base class alone (no engine internals) runs through the tiled
engine and its custom VJP, forward and backward, in every kind, and equals a dense NumPy / JAX
transcription of the same sum.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfcl_jax import mappings
from tfcl_jax.losses._engine import _sums, _tiled, _tiles


@dataclasses.dataclass(frozen=True)
class _ScoredLogitSum(_tiles.TileReduction):
  """`sum_{j scored for i} f(c_ij)` per row (and column): only the base class's methods."""

  def fast_form(self, mapping, dtype):
    return None

  def init(self, num, dtype, tile_mapping):
    return (jnp.zeros((num,), dtype),)

  def finish(self, stats):
    return stats[0]

  def forward(self, tile_mapping, args, a, b, row_stats, col_stats, use_cols):
    cos = a.vectors @ b.vectors.T
    terms = jnp.where(_sums.pair_mask(a, b), tile_mapping.fn(cos, args.params, args.step,
                                                         *args.consts), 0.0)
    row_stats = (row_stats[0] + terms.sum(axis=1),)
    if use_cols is not None:
      col_stats = (col_stats[0] + jnp.where(use_cols, terms.sum(axis=0), 0.0),)
    return row_stats, col_stats

  def backward(self, tile_mapping, args, a, b, row_out, row_g, col_out, col_g):
    cos = a.vectors @ b.vectors.T
    _, vjp = jax.vjp(lambda c, p, *k: tile_mapping.fn(c, p, args.step, *k), cos, args.params,
                     *args.consts)
    dlogits = jnp.where(_sums.pair_mask(a, b), row_g[:, None] + col_g[None, :], 0.0)
    dcos, dparams, *dconsts = vjp(dlogits.astype(cos.dtype))
    return dcos, dparams, tuple(dconsts)


def _side(vectors, ids):
  """Rows with no positive among the candidates (`positive_ids` -1)."""
  n = vectors.shape[0]
  return _tiles.Side(vectors, jnp.asarray(ids, jnp.int32), jnp.full((n,), -1, jnp.int32),
                     jnp.ones(n, bool))


def _unit(x):
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("kind", ["rows", "rows_and_columns", "symmetric"])
def test_a_reduction_from_the_base_class_alone_runs_through_the_engine(kind):
  u = _unit(jax.random.normal(jax.random.key(0), (11, 6)))
  v = _unit(jax.random.normal(jax.random.key(1), (9, 6)))
  tau = 0.3
  rows = _side(u, np.arange(11))
  columns = None if kind == "symmetric" else _side(v, np.arange(9) + 100)
  other = u if kind == "symmetric" else v

  def tiled(u, other, t):
    m = mappings.temperature(t)
    r = rows._replace(vectors=u)
    c = None if columns is None else columns._replace(vectors=other)
    row_out, col_out = _tiled.tile_reduce(r, c, mapping=m, kind=kind, block_size=4,
                                          tile_reduction=_ScoredLogitSum())
    return row_out, col_out

  # Dense transcription: every pair scored except a row with itself (`symmetric`).
  c = np.asarray(u @ other.T, np.float64)
  scored = np.ones(c.shape, bool)
  if kind == "symmetric":
    np.fill_diagonal(scored, False)
  row_out, col_out = jax.jit(tiled)(u, other, tau)
  np.testing.assert_allclose(row_out, np.where(scored, c / tau, 0).sum(1), rtol=1e-5, atol=1e-5)
  if kind == "rows_and_columns":
    np.testing.assert_allclose(col_out, np.where(scored, c / tau, 0).sum(0), rtol=1e-5,
                               atol=1e-5)
  else:
    assert col_out is None

  # Gradients through the custom VJP, a traced temperature included (a closed-over const).
  weights = jnp.linspace(0.5, 1.5, 11)

  def objective(u, other, t):
    row_out, col_out = tiled(u, other, t)
    return jnp.sum(weights * row_out) + (0.0 if col_out is None else 0.3 * jnp.sum(col_out))

  def dense(u, other, t):
    cos = u @ other.T if kind != "symmetric" else u @ u.T
    terms = jnp.where(jnp.asarray(scored), cos / t, 0.0)
    return (jnp.sum(weights * terms.sum(1))
            + (0.3 * jnp.sum(terms.sum(0)) if kind == "rows_and_columns" else 0.0))

  argnums = (0, 2) if kind == "symmetric" else (0, 1, 2)
  got = jax.jit(jax.grad(objective, argnums=argnums))(u, other, tau)
  want = jax.grad(dense, argnums=argnums)(u, other, tau)
  chex.assert_trees_all_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_contract_is_declared_abstract():
  class Partial(_tiles.TileReduction):
    def fast_form(self, mapping, dtype):
      return None

  with pytest.raises(TypeError, match="backward"):
    Partial()  # type: ignore[abstract]
  for reduction in (_tiles.LogSumExp(), _sums.SigmoidSum(), _sums.PositiveSum()):
    assert isinstance(reduction, _tiles.TileReduction)
    assert reduction == type(reduction)() and hash(reduction) == hash(type(reduction)())
