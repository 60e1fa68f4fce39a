"""MNIST-1D: the generated set against the generator itself, its cache, the signal views and the
1-D encoder."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import ndimage

from tfcl_jax import augment, data, models
from tfcl_jax.augment import signal
from tfcl_jax.data import mnist1d

mnist1d_data = pytest.importorskip("mnist1d.data")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("mnist1d"))


def test_splits_are_the_generators_own_arrays(cache):
  args = mnist1d_data.get_dataset_args()
  args.num_samples = 200
  reference = mnist1d_data.make_dataset(args)
  train, train_labels = mnist1d.load_mnist1d("train", num_samples=200, data_dir=cache)
  test, test_labels = mnist1d.load_mnist1d("test", num_samples=200, data_dir=cache)
  assert train.shape == (160, 40, 1) and test.shape == (40, 40, 1)
  assert train.dtype == np.float32 and train_labels.dtype == np.int32
  np.testing.assert_allclose(train[..., 0], reference["x"], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(test[..., 0], reference["x_test"], rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(train_labels, reference["y"])
  np.testing.assert_array_equal(test_labels, reference["y_test"])


def test_generated_once_then_read_from_the_cache_and_numpy_state_untouched(cache, monkeypatch):
  np.random.seed(123)
  before = np.random.get_state()[1].copy()
  first = mnist1d.load_mnist1d("train", num_samples=100, seed=7, data_dir=cache)
  np.testing.assert_array_equal(np.random.get_state()[1], before)
  mnist1d._all.cache_clear()  # a new process: only the file remains
  monkeypatch.setattr(mnist1d, "_generate", lambda *a: pytest.fail("regenerated"))
  again = mnist1d.load_mnist1d("train", num_samples=100, seed=7, data_dir=cache)
  np.testing.assert_array_equal(first[0], again[0])
  np.testing.assert_array_equal(first[1], again[1])


@pytest.mark.parametrize("kwargs, message", [
    ({"split": "validation"}, "split must be 'train' or 'test'"),
    ({"split": "train", "num_samples": 5}, "num_samples must be an int >= 10"),
])
def test_bad_arguments_name_themselves(kwargs, message, cache):
  with pytest.raises(ValueError, match=message):
    mnist1d.load_mnist1d(data_dir=cache, **kwargs)


def test_registry_and_load_arrays(cache):
  info = data.get_info("mnist1d")
  assert info.example_shape() == (40, 1) and info.spatial_dims == 1
  signals, labels = data.load_arrays("mnist1d", "test", data_dir=cache)
  assert signals.shape == (1000, 40, 1) and sorted(set(labels.tolist())) == list(range(10))


def test_view_without_randomness_is_the_signal_and_shift_is_circular():
  x = jnp.sin(jnp.linspace(0, 6, 40))[:, None]
  length = 40
  # u = 1/2 for scale, shear: no change; normals at u = 1/2 are 0: no noise.
  still = jnp.full((signal.mnist1d_uniforms(length, 1),), 0.5)
  np.testing.assert_allclose(signal.mnist1d_view(still, x, length), x, atol=1e-6)
  shifted = still.at[1].set(0.99)  # the largest shift, +MAX_SHIFT
  np.testing.assert_allclose(signal.mnist1d_view(shifted, x, length),
                             np.roll(np.asarray(x), signal.MAX_SHIFT, axis=0), atol=1e-6)


def test_correlated_noise_is_scipys_gaussian_filter_inside_the_signal():
  rng = np.random.default_rng(0)
  normals = rng.normal(size=40).astype(np.float32)
  uniforms = np.full(signal.mnist1d_uniforms(40, 1), 0.5, np.float32)
  uniforms[3:43] = jax.scipy.stats.norm.cdf(normals)
  view = np.asarray(signal.mnist1d_view(jnp.asarray(uniforms), jnp.zeros((40, 1)), 40))[:, 0]
  reference = signal.CORR_NOISE * ndimage.gaussian_filter(normals.astype(np.float64), 2.0,
                                                          mode="constant")
  # Zero padding at the ends in both; compare where the float32 inverse CDF is accurate.
  np.testing.assert_allclose(view, reference, atol=2e-4)


def test_two_views_and_center_view_of_signals():
  signals = np.random.default_rng(0).normal(size=(6, 40, 1)).astype(np.float32)
  v1, v2 = augment.two_views(jax.random.key(0), signals, recipe="mnist1d")
  assert v1.shape == v2.shape == (6, 40, 1) and v1.dtype == jnp.float32
  assert float(jnp.abs(v1 - v2).mean()) > 0.05
  np.testing.assert_allclose(augment.center_view(signals, recipe="mnist1d"), signals)
  assert augment.center_view(signals, recipe="mnist1d", out_size=20).shape == (6, 20, 1)
  with pytest.raises(ValueError, match=r"rank 3 \(\[B, L, C\]\)"):
    augment.two_views(jax.random.key(0), signals[..., None], recipe="mnist1d")


def test_small_cnn_encodes_signals_with_1d_convolutions():
  model = models.make_backbone("small_cnn", width=4)
  x = jnp.zeros((2, 40, 1))
  variables = model.init(jax.random.key(0), x, train=False)
  assert variables["params"]["Conv_0"]["kernel"].shape == (3, 1, 4)
  assert model.apply(variables, x, train=False).shape == (2, 16)
  with pytest.raises(ValueError, match=r"\[B, L, C\] \(signals\)"):
    model.apply(variables, jnp.zeros((2, 40)), train=False)
