"""SupCon's loss form and the sampling-bias (logQ) correction against NumPy transcriptions:
pytorch-metric-learning's `SupConLoss` and TFRS / Yi et al.'s corrected in-batch softmax, with
dense autodiff for the gradients and the engine's tiles at several block sizes."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from tfcl_jax import losses, mappings
from tfcl_jax.losses._engine import _tiled, _tiles

# NumPy mappings, written independently of tfcl_jax.mappings.
NUMPY_MAPPINGS = {
    "tau=0.1": lambda c: c / 0.1,
    "tau=0.02": lambda c: c / 0.02,
    "free": lambda c: np.log1p(c) - np.log1p(-c),
    "learnable=0.2": lambda c: c / 0.2,
    "dynamic=0.1:0.3": lambda c: c / (0.1 + 0.1 * (1 + np.cos(np.pi * (1 + c)))),
}


def _unit(z):
  z = np.asarray(z, np.float64)
  return z / np.linalg.norm(z, axis=1, keepdims=True)


def _logsumexp(x, keep):
  """Row-wise logsumexp over `keep`."""
  x = np.where(keep, x, -np.inf)
  top = np.max(x, axis=1, keepdims=True)
  with np.errstate(invalid="ignore"):  # an all-masked row: NaN, zeroed by the caller
    return np.log(np.sum(np.exp(x - top), axis=1)) + top[:, 0]


def numpy_supcon(z, labels, logits_of):
  """pytorch-metric-learning's `SupConLoss` (v2) with `CosineSimilarity` and its
  `AvgNonZeroReducer`, transcribed: `mat = f(cos)`, the max subtracted, the denominator over
  positives and negatives (every other sample), log-probabilities averaged over positives."""
  mat = logits_of(np.clip(_unit(z) @ _unit(z).T, -1 + 1e-12, 1 - 1e-12))
  labels = np.asarray(labels)
  same = labels[:, None] == labels[None, :]
  pos_mask = same & ~np.eye(len(labels), dtype=bool)
  neg_mask = ~same
  mat = mat - np.max(mat, axis=1, keepdims=True)
  denominator = _logsumexp(mat, pos_mask | neg_mask)
  log_prob = mat - denominator[:, None]
  mean_log_prob_pos = np.sum(np.where(pos_mask, log_prob, 0.0), axis=1) / (
      pos_mask.sum(axis=1) + 1e-45)
  per_anchor = -mean_log_prob_pos
  return per_anchor[per_anchor > 0].mean()


def dense_supcon(z, labels, mapping):
  """A jnp transcription for gradients (no engine): `lse_{a != i} - mean_{p in P(i)} f`."""
  u = z / jnp.linalg.norm(z, axis=1, keepdims=True)
  logits = mapping(u @ u.T)
  eye = jnp.eye(z.shape[0], dtype=bool)
  same = labels[:, None] == labels[None, :]
  lse = jax.nn.logsumexp(jnp.where(eye, -jnp.inf, logits), axis=1)
  positives = same & ~eye
  count = positives.sum(1)
  mean_pos = jnp.sum(jnp.where(positives, logits, 0.0), 1) / jnp.maximum(count, 1)
  has = count > 0
  return jnp.sum(jnp.where(has, lse - mean_pos, 0.0)) / jnp.sum(has)


def numpy_logq(z1, z2, logits_of, bias, where=None):
  """TFRS's `Retrieval` task with `candidate_sampling_probability` (Yi et al. 2019): logits
  `f(c_ij) - log q_j` (here `+ b_j`) for every candidate, the positive on the diagonal."""
  logits = logits_of(_unit(z1) @ _unit(z2).T) + np.asarray(bias, np.float64)[None, :]
  keep = np.ones(len(z1), bool) if where is None else np.asarray(where)
  grid = keep[:, None] & keep[None, :]
  per_row = _logsumexp(logits, grid) - np.diag(logits)
  return np.where(keep, per_row, 0.0)


def _held(spec):
  """The mapping of `spec` held at its initial params (a learnable one bound to them)."""
  mapping = mappings.from_spec(spec)
  return mapping.bind(params=mapping.params)


def _data(n, d=8, seed=0):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(n, d)).astype(np.float32)


class SupConTest(parameterized.TestCase):

  @parameterized.product(spec=tuple(NUMPY_MAPPINGS), block_size=(None, 5, 7))
  def test_equals_pytorch_metric_learning_transcription(self, spec, block_size):
    z = _data(24)
    labels = np.arange(24) % 4
    got = losses.supervised_info_nce(z, labels, mapping=_held(spec), form="supcon",
                                     block_size=block_size)
    np.testing.assert_allclose(got, numpy_supcon(z, labels, NUMPY_MAPPINGS[spec]), rtol=2e-5)

  def test_differs_from_the_ntxent_form(self):
    # Other positives in the denominator make SupCon's loss the larger one.
    z, labels = _data(24), np.arange(24) % 4
    tau = mappings.temperature(0.1)
    ntxent = losses.supervised_info_nce(z, labels, mapping=tau)
    supcon = losses.supervised_info_nce(z, labels, mapping=tau, form="supcon")
    self.assertGreater(float(supcon), float(ntxent) + 0.1)

  def test_anchors_without_positive_are_left_out(self):
    z = _data(7)
    labels = np.array([0, 0, 0, 1, 1, 2, 3])  # classes 2 and 3 have no positive
    free = mappings.temperature_free()
    got = losses.supervised_info_nce(z, labels, mapping=free, form="supcon", block_size=3)
    np.testing.assert_allclose(got, numpy_supcon(z, labels, NUMPY_MAPPINGS["free"]), rtol=2e-5)

  @parameterized.parameters("tau=0.1", "free", "learnable=0.2", "dynamic=0.1:0.3")
  def test_gradients_equal_dense_autodiff(self, spec):
    z = jnp.asarray(_data(18))
    labels = jnp.arange(18) % 3
    mapping = mappings.from_spec(spec)

    def tiled(z, params):
      return losses.supervised_info_nce(z, labels, mapping=mapping.bind(params=params),
                                        form="supcon", block_size=4)

    def dense(z, params):
      return dense_supcon(z, labels, mapping.bind(params=params))

    got = jax.jit(jax.grad(tiled, argnums=(0, 1)))(z, mapping.params)
    want = jax.jit(jax.grad(dense, argnums=(0, 1)))(z, mapping.params)
    chex.assert_trees_all_close(got, want, rtol=1e-4, atol=1e-6)

  def test_jit_and_traced_labels(self):
    z, labels = _data(12), np.arange(12) % 3
    fn = jax.jit(lambda z, y: losses.supervised_info_nce(z, y, form="supcon", block_size=5))
    np.testing.assert_allclose(fn(z, labels), numpy_supcon(z, labels, NUMPY_MAPPINGS["free"]),
                               rtol=2e-5)

  @parameterized.parameters("khosla", "supcon_ntxent")
  def test_bad_form(self, form):
    with self.assertRaisesRegex(
        ValueError, rf"^form must be one of \['ntxent', 'supcon'\], got '{form}'\.$"):
      losses.supervised_info_nce(_data(4), np.array([0, 0, 1, 1]), form=form)


class LogQTest(parameterized.TestCase):

  @parameterized.product(spec=tuple(NUMPY_MAPPINGS), block_size=(None, 5))
  def test_equals_numpy_corrected_softmax(self, spec, block_size):
    z1, z2 = _data(13, seed=1), _data(13, seed=2)
    log_q = np.log(np.random.default_rng(3).uniform(0.01, 0.5, 13)).astype(np.float32)
    got = losses.info_nce(z1, z2, mapping=_held(spec), candidate_bias=-log_q,
                          block_size=block_size, reduction="none")
    np.testing.assert_allclose(got, numpy_logq(z1, z2, NUMPY_MAPPINGS[spec], -log_q), rtol=1e-4,
                               atol=1e-5)

  def test_masked_pairs(self):
    z1, z2 = _data(9, seed=1), _data(9, seed=2)
    bias = np.linspace(-2, 3, 9).astype(np.float32)
    where = np.array([1, 1, 0, 1, 1, 1, 0, 1, 1], bool)
    got = losses.info_nce(z1, z2, candidate_bias=bias, where=where, block_size=4,
                          reduction="none")
    np.testing.assert_allclose(got, numpy_logq(z1, z2, NUMPY_MAPPINGS["free"], bias, where),
                               rtol=1e-4, atol=1e-5)

  def test_zero_bias_is_the_plain_loss_and_a_constant_bias_cancels(self):
    z1, z2 = _data(10, seed=1), _data(10, seed=2)
    plain = losses.info_nce(z1, z2, block_size=4)
    for bias in (np.zeros(10, np.float32), np.full(10, 2.5, np.float32)):
      np.testing.assert_allclose(losses.info_nce(z1, z2, candidate_bias=bias, block_size=4),
                                 plain, rtol=1e-5)

  @parameterized.parameters("tau=0.1", "free", "learnable=0.2")
  def test_gradients_equal_dense_autodiff_and_bias_takes_none(self, spec):
    z1, z2 = jnp.asarray(_data(11, seed=1)), jnp.asarray(_data(11, seed=2))
    bias = jnp.linspace(-1.0, 2.0, 11)
    mapping = mappings.from_spec(spec)

    def tiled(z1, z2, params, bias):
      return losses.info_nce(z1, z2, mapping=mapping.bind(params=params), candidate_bias=bias,
                             block_size=4)

    def dense(z1, z2, params, bias):
      unit = lambda z: z / jnp.linalg.norm(z, axis=1, keepdims=True)  # noqa: E731
      logits = mapping.bind(params=params)(unit(z1) @ unit(z2).T)
      logits = logits + jax.lax.stop_gradient(bias)[None, :]
      return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.diag(logits))

    got = jax.jit(jax.grad(tiled, argnums=(0, 1, 2, 3)))(z1, z2, mapping.params, bias)
    want = jax.jit(jax.grad(dense, argnums=(0, 1, 2, 3)))(z1, z2, mapping.params, bias)
    chex.assert_trees_all_close(got, want, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(got[3], 0.0)

  @parameterized.product(spec=("tau=0.1", "free"), block_size=(None, 4))
  def test_symmetric_loss_corrects_each_direction(self, spec, block_size):
    # CLIP's loss with the logQ correction: z1 -> z2 against z2's biases, z2 -> z1 against z1's;
    # the per-row losses are the two one-directional corrected softmaxes.
    z1, z2 = _data(9, seed=1), _data(9, seed=2)
    b2 = np.linspace(-2, 1, 9).astype(np.float32)
    b1 = np.linspace(1.5, -1, 9).astype(np.float32)
    where = np.array([1, 1, 0, 1, 1, 1, 1, 0, 1], bool)
    got = losses.info_nce(z1, z2, mapping=_held(spec), symmetric=True,
                          candidate_bias=(b2, b1), where=where, block_size=block_size,
                          reduction="none")
    logits_of = NUMPY_MAPPINGS[spec]
    want = np.concatenate([numpy_logq(z1, z2, logits_of, b2, where),
                           numpy_logq(z2, z1, logits_of, b1, where)])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with self.assertRaisesRegex(ValueError, "is a pair"):
      losses.info_nce(z1, z2, symmetric=True, candidate_bias=b2)
    with self.assertRaisesRegex(ValueError, "is for symmetric=True"):
      losses.info_nce(z1, z2, candidate_bias=(b2, b1))

  def test_engine_biases_both_directions(self):
    """The engine's `rows_and_columns` tiles: a column's statistics see the rows' bias."""
    u1, u2 = _unit(_data(9, seed=4)), _unit(_data(11, seed=5))
    b1, b2 = np.linspace(-1, 1, 9), np.linspace(2, -1, 11)
    ids1, ids2 = np.arange(9) + 100, np.arange(11) + 200
    side = lambda u, ids, b: _tiles.Side(  # noqa: E731
        jnp.asarray(u, jnp.float32), jnp.asarray(ids, jnp.int32), jnp.asarray(ids, jnp.int32),
        jnp.ones(len(ids), bool), jnp.asarray(b, jnp.float32))
    for spec in ("tau=0.1", "tau=0.02", "free"):
      rows, cols = _tiled.tile_reduce(side(u1, ids1, b1), side(u2, ids2, b2),
                                      mapping=mappings.from_spec(spec),
                                      kind="rows_and_columns", block_size=4)
      logits = NUMPY_MAPPINGS[spec](u1 @ u2.T)
      everything = np.ones(logits.shape, bool)
      np.testing.assert_allclose(rows, _logsumexp(logits + b2[None, :], everything), rtol=1e-5)
      np.testing.assert_allclose(cols, _logsumexp((logits + b1[:, None]).T, everything.T),
                                 rtol=1e-5)

  @parameterized.parameters(
      (dict(candidate_bias=np.zeros(3, np.float32)), ValueError, r"shape \(4,\)"),
      (dict(candidate_bias=np.zeros(4, np.int32)), TypeError, "float"),
      (dict(candidate_bias=np.zeros(4, np.float32), symmetric=True), ValueError, "symmetric"),
      (dict(candidate_bias=np.zeros(4, np.float32), negatives="all"), ValueError, "cross"),
      (dict(candidate_bias=np.zeros(4, np.float32), implementation="pallas"), ValueError,
       "xla"),
      (dict(candidate_bias=np.zeros(4, np.float32), extra_negatives=np.ones((2, 8), np.float32)),
       ValueError, "extra_negatives"),
  )
  def test_bad_input(self, kwargs, error, message):
    with pytest.raises(error, match=message):
      losses.info_nce(_data(4), _data(4, seed=1), **kwargs)
