"""InfoNCE losses against a NumPy reference, optax, invariants, edge cases and bad input."""

import math

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

from tfcl_jax import losses, mappings

DTYPES = (jnp.float64, jnp.float32, jnp.bfloat16, jnp.float16)

# NumPy versions of the maps, written independently of tfcl_jax.mappings.
NUMPY_MAPS = {
    "tau=0.1": lambda c: c / 0.1,
    "tau=0.5": lambda c: c / 0.5,
    "free": lambda c: np.log1p(c) - np.log1p(-c),
    "learnable=0.2": lambda c: c / 0.2,
    "dynamic=0.1:0.3": lambda c: c / (0.1 + 0.1 * (1 + np.cos(np.pi * (1 + c)))),
}


def numpy_info_nce(z1, z2, logit_map, negatives, where=None):
  """Per-row InfoNCE losses, a plain loop over anchors."""
  z1 = np.asarray(z1, np.float64)
  z2 = np.asarray(z2, np.float64)
  n = len(z1)
  keep = np.ones(n, bool) if where is None else np.asarray(where)
  u1 = z1 / np.linalg.norm(z1, axis=1, keepdims=True)
  u2 = z2 / np.linalg.norm(z2, axis=1, keepdims=True)
  if negatives == "cross":
    anchors, candidates, positive, valid = u1, u2, np.arange(n), keep
    candidate_ok = lambda i, j: keep[j]
  else:
    anchors = candidates = np.concatenate([u1, u2])
    positive = (np.arange(2 * n) + n) % (2 * n)
    valid = np.concatenate([keep, keep])
    candidate_ok = lambda i, j: i != j and valid[j]
  out = np.zeros(len(anchors))
  for i, anchor in enumerate(anchors):
    if not valid[i]:
      continue
    logits = [logit_map(anchor @ c) for j, c in enumerate(candidates) if candidate_ok(i, j)]
    out[i] = np.log(np.sum(np.exp(logits))) - logit_map(anchor @ candidates[positive[i]])
  return out


def random_pair(n, d, seed=0, noise=0.5):
  rng = np.random.default_rng(seed)
  z1 = rng.normal(size=(n, d))
  return z1, z1 + noise * rng.normal(size=(n, d))


class InfoNCEReferenceTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(spec=sorted(NUMPY_MAPS), negatives=("cross", "all"))
  def test_equals_numpy_reference(self, spec, negatives):
    with jax.enable_x64(True):
      z1, z2 = random_pair(7, 5)
      mapping = mappings.from_spec(spec)
      got = self.variant(lambda a, b: losses.info_nce(
          a, b, mapping=mapping, negatives=negatives, reduction="none"))(z1, z2)
      expected = numpy_info_nce(z1, z2, NUMPY_MAPS[spec], negatives)
      np.testing.assert_allclose(got, expected, rtol=1e-10)
      mean = losses.info_nce(z1, z2, mapping=mapping, negatives=negatives)
      np.testing.assert_allclose(mean, expected.mean(), rtol=1e-10)

  def test_default_mapping_is_temperature_free(self):
    z1, z2 = random_pair(6, 4)
    np.testing.assert_allclose(
        losses.info_nce(z1.astype(np.float32), z2.astype(np.float32)),
        numpy_info_nce(z1, z2, NUMPY_MAPS["free"], "cross").mean(), rtol=1e-5)

  @parameterized.parameters(0.07, 0.5, 1.0)
  def test_all_equals_optax_ntxent(self, tau):
    z1, z2 = random_pair(16, 8, seed=3)
    z1, z2 = z1.astype(np.float32), z2.astype(np.float32)
    labels = jnp.concatenate([jnp.arange(16), jnp.arange(16)])
    expected = optax.losses.ntxent(jnp.concatenate([z1, z2]), labels, temperature=tau)
    got = losses.info_nce(z1, z2, mapping=mappings.temperature(tau), negatives="all")
    np.testing.assert_allclose(got, expected, rtol=2e-5)

  @parameterized.parameters(0.1, 0.5)
  def test_supervised_equals_optax_ntxent(self, tau):
    rng = np.random.default_rng(1)
    z = rng.normal(size=(24, 6)).astype(np.float32)
    labels = rng.integers(0, 5, size=24)
    expected = optax.losses.ntxent(jnp.asarray(z), jnp.asarray(labels), temperature=tau)
    got = losses.supervised_info_nce(z, labels, mapping=mappings.temperature(tau))
    np.testing.assert_allclose(got, expected, rtol=2e-5)

  def test_supervised_with_two_views_equals_info_nce_all(self):
    z1, z2 = random_pair(9, 4, seed=2)
    labels = np.concatenate([np.arange(9), np.arange(9)])
    for spec in ("free", "tau=0.2", "dynamic=0.1:0.2"):
      mapping = mappings.from_spec(spec)
      np.testing.assert_allclose(
          losses.supervised_info_nce(np.concatenate([z1, z2]).astype(np.float32), labels,
                                     mapping=mapping),
          losses.info_nce(z1.astype(np.float32), z2.astype(np.float32), mapping=mapping,
                          negatives="all"), rtol=1e-5)


class InvariantTest(chex.TestCase):

  @parameterized.product(spec=("tau=0.1", "free", "learnable", "dynamic=0.1:0.2",
                               "anneal=cosine:1:0.1:10"), negatives=("cross", "all"))
  def test_all_equal_embeddings_give_log_candidates(self, spec, negatives):
    n = 10
    z = np.tile(np.array([[0.3, -1.2, 2.0, 0.7]], np.float32), (n, 1))
    got = losses.info_nce(z, z, mapping=mappings.from_spec(spec), negatives=negatives)
    expected = math.log(n) if negatives == "cross" else math.log(2 * n - 1)
    np.testing.assert_allclose(got, expected, rtol=1e-6)

  @parameterized.parameters("cross", "all")
  def test_where_equals_valid_subset(self, negatives):
    z1, z2 = random_pair(11, 5, seed=4)
    z1, z2 = z1.astype(np.float32), z2.astype(np.float32)
    where = np.array([1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1], bool)
    for spec in ("free", "tau=0.25"):
      mapping = mappings.from_spec(spec)
      masked = losses.info_nce(z1, z2, mapping=mapping, negatives=negatives, where=where)
      subset = losses.info_nce(z1[where], z2[where], mapping=mapping, negatives=negatives)
      np.testing.assert_allclose(masked, subset, rtol=1e-6)
      grads = jax.grad(lambda a, m=mapping: losses.info_nce(
          a, z2, mapping=m, negatives=negatives, where=where))(z1)
      np.testing.assert_array_equal(grads[~where], 0.0)

  def test_where_with_no_valid_pair_is_zero_with_finite_gradient(self):
    z1, z2 = random_pair(4, 3)
    where = np.zeros(4, bool)
    value, grad = jax.value_and_grad(lambda a: losses.info_nce(a, z2.astype(np.float32),
                                                               where=where))(z1.astype(np.float32))
    assert float(value) == 0.0
    chex.assert_tree_all_finite(grad)

  def test_all_is_symmetric_in_views_and_cross_is_transpose(self):
    z1, z2 = random_pair(8, 6, seed=5)
    z1, z2 = z1.astype(np.float32), z2.astype(np.float32)
    np.testing.assert_allclose(losses.info_nce(z1, z2, negatives="all"),
                               losses.info_nce(z2, z1, negatives="all"), rtol=1e-6)
    # Cross is the row-softmax of S = U1 U2^T; swapping the views takes it over the columns.
    swapped = losses.info_nce(z2, z1, reduction="none")
    expected = numpy_info_nce(z2, z1, NUMPY_MAPS["free"], "cross")
    np.testing.assert_allclose(swapped, expected, rtol=1e-4)

  def test_scale_invariance(self):
    z1, z2 = random_pair(6, 4, seed=6)
    z1, z2 = z1.astype(np.float32), z2.astype(np.float32)
    np.testing.assert_allclose(losses.info_nce(3.0 * z1, 0.1 * z2), losses.info_nce(z1, z2),
                               rtol=1e-5)

  def test_reductions(self):
    z1, z2 = random_pair(5, 3)
    per_row = losses.info_nce(z1.astype(np.float32), z2.astype(np.float32), reduction="none")
    assert per_row.shape == (5,)
    np.testing.assert_allclose(
        losses.info_nce(z1.astype(np.float32), z2.astype(np.float32), reduction="sum"),
        per_row.sum(), rtol=1e-6)
    assert losses.info_nce(z1.astype(np.float32), z2.astype(np.float32), negatives="all",
                           reduction="none").shape == (10,)


class EdgeCaseTest(chex.TestCase):

  @parameterized.product(dtype=DTYPES, negatives=("cross", "all"))
  def test_finite_loss_and_gradients(self, dtype, negatives):
    with jax.enable_x64(True):
      base = jnp.asarray([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], dtype)
      # Cases stacked for one vmap: identical views, antipodal views, zero vectors.
      z1 = jnp.stack([base, base, base.at[0].set(0.0)])
      z2 = jnp.stack([base, -base, jnp.zeros_like(base)])
      for spec in ("free", "tau=0.1", "learnable", "dynamic=0.1:0.2"):
        mapping = mappings.from_spec(spec)

        def loss(a, b, mapping=mapping):
          return losses.info_nce(a, b, mapping=mapping, negatives=negatives)

        value, grads = jax.vmap(jax.value_and_grad(loss, argnums=(0, 1)))(z1, z2)
        assert value.dtype == (jnp.float64 if dtype == jnp.float64 else jnp.float32)
        chex.assert_tree_all_finite((value, grads))

  def test_positive_at_cos_one_beats_tau_bound(self):
    # Example 3.1: at [1, -1] the positive's probability is sigmoid(2 / tau) for division by
    # tau; the free map gets much closer to one.
    z1 = np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32)
    loss_tau = losses.info_nce(z1, z1, mapping=mappings.temperature(0.1))
    loss_free = losses.info_nce(z1, z1)
    np.testing.assert_allclose(loss_tau, -np.log(1 / (1 + np.exp(-20.0))), rtol=1e-4)
    assert float(loss_free) < float(loss_tau) * 1e-3

  def test_learnable_gradient_reaches_t(self):
    z1, z2 = random_pair(6, 4)

    def loss(t):
      return losses.info_nce(z1.astype(np.float32), z2.astype(np.float32),
                             mapping=mappings.learnable_temperature(t))

    grad = jax.jit(jax.grad(loss))(1.0)
    eps = 1e-2
    numeric = (loss(1.0 + eps) - loss(1.0 - eps)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-2)
    assert abs(float(grad)) > 0


@hypothesis.settings(deadline=None, max_examples=8, derandomize=True)
@hypothesis.given(n=st.integers(2, 6), d=st.integers(1, 4), scale=st.floats(1e-3, 1e3),
                  seed=st.integers(0, 2**16), negatives=st.sampled_from(["cross", "all"]),
                  spec=st.sampled_from(sorted(NUMPY_MAPS)))
def test_property_matches_reference_and_is_finite(n, d, scale, seed, negatives, spec):
  z1, z2 = random_pair(n, d, seed=seed, noise=1.0)
  z1, z2 = z1 * scale, z2 * scale
  mapping = mappings.from_spec(spec)
  value, grad = jax.value_and_grad(lambda a: losses.info_nce(
      a, z2.astype(np.float32), mapping=mapping, negatives=negatives))(z1.astype(np.float32))
  chex.assert_tree_all_finite((value, grad))
  expected = numpy_info_nce(z1, z2, NUMPY_MAPS[spec], negatives).mean()
  np.testing.assert_allclose(value, expected, rtol=2e-3, atol=2e-3)


class TransformTest(chex.TestCase):

  def test_vmap_over_batches_of_pairs(self):
    rng = np.random.default_rng(0)
    z1 = rng.normal(size=(3, 5, 4)).astype(np.float32)
    z2 = rng.normal(size=(3, 5, 4)).astype(np.float32)
    batched = jax.vmap(lambda a, b: losses.info_nce(a, b, negatives="all"))(z1, z2)
    looped = [losses.info_nce(a, b, negatives="all") for a, b in zip(z1, z2, strict=True)]
    np.testing.assert_allclose(batched, looped, rtol=1e-6)

  def test_jit_grad_with_traced_mapping_parameters(self):
    z1, z2 = random_pair(5, 3)

    @jax.jit
    def step(t, step_count):
      mapping = mappings.from_spec("learnable")
      loss = losses.info_nce(z1.astype(np.float32), z2.astype(np.float32),
                             mapping=lambda c: mapping(c, params={"t": t}, step=step_count))
      return loss

    chex.assert_tree_all_finite(jax.grad(step)(2.0, 3))


class BadInputTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.z = np.ones((4, 3), np.float32)

  def test_rank(self):
    with pytest.raises(ValueError, match="z1 must have rank 2"):
      losses.info_nce(np.ones(4, np.float32), np.ones(4, np.float32))
    with pytest.raises(ValueError, match="z must have rank 2"):
      losses.supervised_info_nce(np.ones((2, 3, 4), np.float32), np.zeros(2, int))

  def test_mismatched_shapes(self):
    with pytest.raises(ValueError, match="same shape"):
      losses.info_nce(self.z, np.ones((4, 2), np.float32))

  def test_integer_dtype(self):
    with pytest.raises(TypeError, match="z2 must have a floating dtype"):
      losses.info_nce(self.z, np.ones((4, 3), np.int32))

  def test_too_few_pairs(self):
    with pytest.raises(ValueError, match="N >= 2"):
      losses.info_nce(self.z[:1], self.z[:1])

  def test_bad_modes(self):
    with pytest.raises(ValueError, match="negatives"):
      losses.info_nce(self.z, self.z, negatives="some")
    with pytest.raises(ValueError, match="reduction"):
      losses.info_nce(self.z, self.z, reduction="max")

  def test_bad_where(self):
    with pytest.raises(TypeError, match="where"):
      losses.info_nce(self.z, self.z, where=np.ones(4, np.float32))
    with pytest.raises(ValueError, match="where"):
      losses.info_nce(self.z, self.z, where=np.ones(3, bool))

  def test_bad_mapping(self):
    with pytest.raises(TypeError, match="mapping"):
      losses.info_nce(self.z, self.z, mapping=0.1)

  def test_bad_labels(self):
    with pytest.raises(TypeError, match="labels"):
      losses.supervised_info_nce(self.z, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="labels"):
      losses.supervised_info_nce(self.z, np.zeros(3, int))
    with pytest.raises(ValueError, match="positive pair"):
      losses.supervised_info_nce(self.z, np.arange(4))
