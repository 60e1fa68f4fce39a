"""Label-free scores against NumPy/SciPy references written here and against known cases:
isotropic, rank-k and collapsed embeddings (RankMe), spectra of known decay (α-ReQ), separated
and collapsed classes (LiDAR), identical views (alignment, retrieval)."""

import chex
import numpy as np
import pytest
import scipy.linalg

from tfcl_jax.evaluation import label_free


def _rankme_reference(z, epsilon=1e-7):
  s = np.linalg.svd(np.asarray(z, np.float64), compute_uv=False)
  p = s / s.sum() + epsilon
  return float(np.exp(-np.sum(p * np.log(p))))


def _alpha_reference(z, first_rank=6, last_rank=100):
  eigenvalues = np.sort(np.linalg.eigvalsh(np.cov(np.asarray(z, np.float64), rowvar=False)))[::-1]
  last = min(last_rank, z.shape[0] - 1, z.shape[1])
  ranks = np.arange(first_rank, last + 1)
  # np.polyfit weighs the residuals (not their squares): sqrt of the 1/i weights.
  slope, _ = np.polyfit(np.log(ranks), np.log(eigenvalues[ranks - 1]), 1, w=np.sqrt(1.0 / ranks))
  return -slope


def _lidar_reference(views, delta=1e-4, epsilon=1e-8):
  views = np.asarray(views, np.float64)
  n, q, d = views.shape
  means = views.mean(axis=1)
  grand = means.mean(axis=0)
  sigma_b = sum(np.outer(m - grand, m - grand) for m in means) / (n - 1)
  sigma_w = sum(np.outer(e - means[x], e - means[x]) for x in range(n) for e in views[x])
  sigma_w = sigma_w / (n * (q - 1)) + delta * np.eye(d)
  root = np.real(scipy.linalg.fractional_matrix_power(sigma_w, -0.5))
  values = np.clip(np.linalg.eigvals(root @ sigma_b @ root).real, 0, None)
  p = values / values.sum() + epsilon
  return float(np.exp(-np.sum(p * np.log(p))))


def _retrieval_reference(first, second):
  first = first / np.linalg.norm(first, axis=1, keepdims=True)
  second = second / np.linalg.norm(second, axis=1, keepdims=True)
  return float(np.mean([np.argmax(first @ s) == i for i, s in enumerate(second)]))


def _power_law_embeddings(alpha, *, n=400, d=120, seed=0):
  """`[n, d]` rows whose covariance has eigenvalues exactly `i^-alpha`: orthonormal columns
  orthogonal to the all-ones vector (so centring leaves them), scaled."""
  rng = np.random.default_rng(seed)
  basis = rng.normal(size=(n, d))
  basis -= basis.mean(axis=0)
  u, _ = np.linalg.qr(basis)
  v, _ = np.linalg.qr(rng.normal(size=(d, d)))
  eigenvalues = np.arange(1, d + 1, dtype=np.float64) ** -alpha
  return (u * np.sqrt((n - 1) * eigenvalues)) @ v.T


class ReferenceTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_rankme_matches_numpy(self):
    z = np.random.default_rng(0).normal(size=(50, 12)) * np.linspace(0.1, 3, 12)
    got = self.variant(label_free.rankme)(z.astype(np.float32))
    np.testing.assert_allclose(got, _rankme_reference(z), rtol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  def test_alpha_req_matches_numpy(self):
    rng = np.random.default_rng(1)
    z = rng.normal(size=(300, 40)) * np.arange(1, 41) ** -0.7 + 0.3
    got = self.variant(label_free.alpha_req)(z.astype(np.float32))
    np.testing.assert_allclose(got, _alpha_reference(z), rtol=1e-3)
    got = self.variant(lambda x: label_free.alpha_req(x, first_rank=1, last_rank=20))(
        z.astype(np.float32))
    np.testing.assert_allclose(got, _alpha_reference(z, 1, 20), rtol=1e-3)

  @chex.variants(with_jit=True, without_jit=True)
  def test_lidar_matches_numpy(self):
    rng = np.random.default_rng(2)
    views = rng.normal(size=(30, 1, 6)) * 2 + rng.normal(size=(30, 5, 6)) * np.linspace(0.2, 1, 6)
    got = self.variant(label_free.lidar)(views.astype(np.float32))
    np.testing.assert_allclose(got, _lidar_reference(views), rtol=1e-3)

  @chex.variants(with_jit=True, without_jit=True)
  def test_view_retrieval_matches_numpy(self):
    rng = np.random.default_rng(3)
    first = rng.normal(size=(64, 5))
    second = first + rng.normal(size=(64, 5)) * 0.8  # some queries find another first view
    got = self.variant(label_free.view_retrieval_top1)(first.astype(np.float32),
                                                       second.astype(np.float32))
    expected = _retrieval_reference(first, second)
    assert 0.2 < expected < 1.0
    np.testing.assert_allclose(got, expected, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_scores_bundle_every_score(self):
    rng = np.random.default_rng(4)
    z = rng.normal(size=(40, 8)).astype(np.float32)
    views = rng.normal(size=(10, 3, 8)).astype(np.float32)
    got = self.variant(lambda *a: label_free.scores(*a, views=views))(z, z, z + 0.1)
    assert set(got) == {"rankme", "alpha_req", "uniformity", "alignment", "view_top1", "lidar"}
    np.testing.assert_allclose(got["rankme"], _rankme_reference(z), rtol=1e-4)
    np.testing.assert_allclose(got["lidar"], _lidar_reference(views), rtol=1e-3)
    np.testing.assert_allclose(got["view_top1"], _retrieval_reference(z, z + 0.1))


def test_rankme_of_isotropic_gaussian_is_near_d():
  z = np.random.default_rng(0).normal(size=(20_000, 16)).astype(np.float32)
  assert 15.5 < float(label_free.rankme(z)) <= 16.0


@pytest.mark.parametrize("k", [1, 3, 7])
def test_rankme_of_rank_k_embeddings_is_near_k(k):
  rng = np.random.default_rng(k)
  basis, _ = np.linalg.qr(rng.normal(size=(32, k)))
  z = (rng.normal(size=(20_000, k)) @ basis.T).astype(np.float32)
  assert k - 0.3 < float(label_free.rankme(z)) < k + 0.05


def test_rankme_of_collapsed_embeddings_is_one():
  z = np.tile(np.random.default_rng(0).normal(size=(1, 16)), (100, 1)).astype(np.float32)
  np.testing.assert_allclose(label_free.rankme(z), 1.0, atol=1e-3)


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_alpha_req_recovers_a_power_law(alpha):
  z = _power_law_embeddings(alpha)
  np.testing.assert_allclose(label_free.alpha_req(z.astype(np.float32)), alpha, rtol=2e-3)
  np.testing.assert_allclose(label_free.alpha_req(z.astype(np.float32), first_rank=1,
                                                  last_rank=30), alpha, rtol=2e-3)


def test_alpha_req_of_rank_deficient_embeddings_is_large_and_finite():
  rng = np.random.default_rng(0)
  z = rng.normal(size=(200, 3)) @ rng.normal(size=(3, 20))
  value = float(label_free.alpha_req(z.astype(np.float32), first_rank=1))
  assert np.isfinite(value) and value > 5


def test_lidar_of_separated_samples_is_near_d_and_of_collapsed_ones_near_one():
  rng = np.random.default_rng(0)
  centres = 20.0 * rng.normal(size=(200, 1, 8))
  separated = centres + rng.normal(size=(200, 10, 8))
  assert 7.5 < float(label_free.lidar(separated.astype(np.float32))) <= 8.0
  # Samples told apart along one direction only: the other seven hold views' noise alone.
  one_direction = rng.normal(size=(200, 10, 8))
  one_direction[..., 0] += 20.0 * rng.normal(size=(200, 1))
  assert float(label_free.lidar(one_direction.astype(np.float32))) < 2.5
  collapsed = np.ones((200, 10, 8), np.float32)
  np.testing.assert_allclose(label_free.lidar(collapsed), 1.0, atol=1e-3)


def test_lidar_is_invariant_to_an_invertible_linear_map():
  rng = np.random.default_rng(1)
  views = rng.normal(size=(100, 1, 6)) * 3 + rng.normal(size=(100, 6, 6))
  mixed = views @ (rng.normal(size=(6, 6)) + 3 * np.eye(6))
  np.testing.assert_allclose(label_free.lidar(mixed.astype(np.float32)),
                             label_free.lidar(views.astype(np.float32)), rtol=1e-3)


def test_identical_views_align_perfectly_and_retrieve_every_sample():
  z = np.random.default_rng(0).normal(size=(300, 16)).astype(np.float32)
  np.testing.assert_allclose(label_free.alignment(z, z), 0.0, atol=1e-6)
  assert float(label_free.view_retrieval_top1(z, z)) == 1.0
  collapsed = np.ones((10, 4), np.float32)
  np.testing.assert_allclose(label_free.view_retrieval_top1(collapsed, collapsed), 0.1)


def test_bad_inputs_name_the_argument():
  z = np.zeros((10, 8), np.float32)
  with pytest.raises(TypeError, match="z must have a floating dtype"):
    label_free.rankme(np.zeros((4, 3), np.int32))
  with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
    label_free.rankme(z, epsilon=0.0)
  with pytest.raises(ValueError, match="at least 2 eigenvalue ranks"):
    label_free.alpha_req(np.zeros((10, 6), np.float32))
  with pytest.raises(TypeError, match="first_rank must be an int"):
    label_free.alpha_req(z, first_rank=1.5)
  with pytest.raises(ValueError, match=r"views must have shape \[n, q, D\]"):
    label_free.lidar(np.zeros((10, 1, 4), np.float32))
  with pytest.raises(TypeError, match="views must have a floating dtype"):
    label_free.lidar(np.zeros((10, 2, 4), np.int32))
  with pytest.raises(ValueError, match="delta must be a finite number > 0"):
    label_free.lidar(np.zeros((10, 2, 4), np.float32), delta=-1.0)
  with pytest.raises(ValueError, match="first and second must have the same shape"):
    label_free.view_retrieval_top1(z, z[:5])
