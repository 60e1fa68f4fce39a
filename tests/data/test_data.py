"""tfcl_jax.data: registry, digits, TFDS (through `tfds.testing.mock_data`), grain loader."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from tfcl_jax import data

_MOCK_EXAMPLES = 40


@pytest.fixture
def mock_tfds(tmp_path):
  """Random TFDS examples generated from the feature specs, read through `tfds.data_source`."""
  with tfds.testing.mock_data(
      num_examples=_MOCK_EXAMPLES, policy=tfds.testing.MockPolicy.USE_CODE):
    yield str(tmp_path)


def _all_batches(loader):
  batches = list(loader)
  return (np.concatenate([b["image"] for b in batches]),
          np.concatenate([b["label"] for b in batches]), batches)


# Registry and argument errors.


def test_get_info_unknown_name_lists_known():
  with pytest.raises(ValueError, match=r"Unknown dataset 'mnist'.*cifar10.*digits"):
    data.get_info("mnist")


def test_registry_fields():
  assert set(data.DATASETS) >= {"digits", "cifar10", "imagenette", "stl10"}
  assert data.get_info("imagenette").tfds_name == "imagenette/160px-v2"
  assert data.get_info("imagenette").image_size == 160
  assert "unlabelled" in data.get_info("stl10").pretrain_split
  for name, info in data.DATASETS.items():
    assert info.name == name
    assert info.channels in (1, 3)


@pytest.mark.parametrize("call", [data.make_loader, data.steps_per_epoch])
def test_unknown_dataset_fails_before_loading(call, tmp_path):
  with pytest.raises(ValueError, match="Unknown dataset 'cifar100'"):
    call("cifar100", "train", batch_size=8, **({"seed": 0} if call is data.make_loader else {}),
         data_dir=str(tmp_path))


def test_unknown_split():
  with pytest.raises(ValueError, match=r"Unknown split 'validation'.*\['train', 'test'\]"):
    data.load_arrays("digits", "validation")


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 2.0}, "batch_size"),
    ({"seed": -1}, "seed"),
    ({"num_epochs": 0}, "num_epochs"),
    ({"start_step": -1}, "start_step"),
    ({"num_threads": 0}, "num_threads"),
    ({"shard_index": 2, "shard_count": 2}, "shard_index"),
    ({"shard_count": 0}, "shard_count"),
    ({"batch_size": 5000}, "batch_size = 5000 is larger"),
    ({"start_step": 100}, "start_step = 100 is past the end"),
])
def test_bad_loader_arguments(kwargs, message):
  arguments = {"batch_size": 16, "seed": 0, "shard_index": 0, "shard_count": 1} | kwargs
  # A float batch size is the wrong type (TypeError); the others are bad values (ValueError).
  with pytest.raises(TypeError if kwargs.get("batch_size") == 2.0 else ValueError, match=message):
    data.make_loader("digits", "train", **arguments)


# Digits.


def test_digits_counts_and_scaling():
  train_images, train_labels = data.load_arrays("digits", "train")
  test_images, test_labels = data.load_arrays("digits", "test")
  assert len(train_labels) + len(test_labels) == 1797
  assert (len(train_labels), len(test_labels)) == (1437, 360)
  assert train_images.shape[1:] == (8, 8, 1) and train_images.dtype == np.uint8
  assert train_labels.dtype == np.int32
  # Independent reference: scikit-learn's own arrays (0..16) and class counts.
  from sklearn import datasets

  reference = datasets.load_digits()
  all_counts = np.bincount(reference.target, minlength=10)
  test_counts = np.bincount(test_labels, minlength=10)
  np.testing.assert_array_equal(np.bincount(train_labels, minlength=10) + test_counts, all_counts)
  # Stratified: each class keeps ~20% in test (rounding moves at most one image).
  assert np.all(np.abs(test_counts - 0.2 * all_counts) <= 1)
  pooled = np.sort(np.concatenate([train_images, test_images]).reshape(1797, -1), axis=0)
  expected = np.sort(np.round(reference.images.reshape(1797, -1) * 255 / 16), axis=0)
  np.testing.assert_array_equal(pooled, expected)
  assert train_images.max() == 255 and train_images.min() == 0


def test_digits_split_is_deterministic_and_disjoint():
  images_a, _ = data.load_arrays("digits", "test")
  images_b, _ = data.load_arrays("digits", "test")
  np.testing.assert_array_equal(images_a, images_b)
  train_rows = {row.tobytes() for row in data.load_arrays("digits", "train")[0]}
  # Some digits images are exact duplicates of each other; nearly all test rows are new.
  assert sum(row.tobytes() in train_rows for row in images_a) < 10


def test_digits_loader_epochs_and_resume():
  kwargs = {"batch_size": 100, "seed": 3, "shard_index": 0, "shard_count": 1, "num_epochs": 2}
  loader = data.make_loader("digits", "train", **kwargs)
  images, labels, batches = _all_batches(loader)
  assert len(batches) == len(loader) == 2 * 14 == 2 * loader.steps_per_epoch
  assert data.steps_per_epoch("digits", "train", batch_size=100, shard_count=1) == 14
  # Within an epoch no example repeats; the two epochs are shuffled differently.
  first, second = images[:1400].reshape(1400, -1), images[1400:].reshape(1400, -1)
  assert not np.array_equal(first, second)
  all_images = data.load_arrays("digits", "train")[0].reshape(1437, -1)
  index = {row.tobytes(): i for i, row in enumerate(all_images)}
  assert len({index[row.tobytes()] for row in first}) >= 1390  # duplicates collapse a few
  resumed = list(data.make_loader("digits", "train", start_step=5, **kwargs))
  assert len(resumed) == 23
  for batch, expected in zip(resumed, batches[5:], strict=True):
    np.testing.assert_array_equal(batch["image"], expected["image"])
    np.testing.assert_array_equal(batch["label"], expected["label"])


def test_batches_do_not_depend_on_the_number_of_threads():
  kwargs = {"batch_size": 64, "seed": 1, "shard_index": 0, "shard_count": 1}
  one = list(data.make_loader("digits", "test", num_threads=1, **kwargs))
  many = list(data.make_loader("digits", "test", num_threads=5, **kwargs))
  for a, b in zip(one, many, strict=True):
    np.testing.assert_array_equal(a["image"], b["image"])


def test_digits_no_shuffle_keeps_order_and_remainder():
  loader = data.make_loader(
      "digits", "test", batch_size=100, seed=0, shuffle=False, drop_remainder=False,
      shard_index=0, shard_count=1)
  images, labels, batches = _all_batches(loader)
  assert [len(b["label"]) for b in batches] == [100, 100, 100, 60]
  expected_images, expected_labels = data.load_arrays("digits", "test")
  np.testing.assert_array_equal(images, expected_images)
  np.testing.assert_array_equal(labels, expected_labels)


# TFDS through mock_data.


def test_cifar10_batches_shapes_and_dtypes(mock_tfds):
  loader = data.make_loader(
      "cifar10", "train", batch_size=8, seed=0, data_dir=mock_tfds, shard_index=0, shard_count=1)
  images, labels, batches = _all_batches(loader)
  assert len(batches) == _MOCK_EXAMPLES // 8 == loader.steps_per_epoch
  for batch in batches:
    assert set(batch) == {"image", "label"}
    assert batch["image"].shape == (8, 32, 32, 3) and batch["image"].dtype == np.uint8
    assert batch["label"].shape == (8,) and batch["label"].dtype == np.int32
  assert labels.min() >= 0 and labels.max() < 10
  # One epoch is a permutation of the split.
  unshuffled, _ = data.load_arrays("cifar10", "train", data_dir=mock_tfds)
  assert sorted(i.tobytes() for i in images) == sorted(i.tobytes() for i in unshuffled)
  assert not np.array_equal(images, unshuffled)


def test_cifar10_deterministic_for_a_seed(mock_tfds):
  def images(seed):
    loader = data.make_loader("cifar10", "train", batch_size=8, seed=seed, data_dir=mock_tfds,
                              shard_index=0, shard_count=1)
    return _all_batches(loader)[0]

  np.testing.assert_array_equal(images(1), images(1))
  assert not np.array_equal(images(1), images(2))


def test_cifar10_shards_are_disjoint_and_cover(mock_tfds):
  shard_images = []
  for shard_index in range(3):
    loader = data.make_loader("cifar10", "test", batch_size=4, seed=0, data_dir=mock_tfds,
                              shard_index=shard_index, shard_count=3)
    assert loader.steps_per_epoch == (_MOCK_EXAMPLES // 3) // 4
    shard_images.append({i.tobytes() for i in _all_batches(loader)[0]})
  assert sum(len(s) for s in shard_images) == 3 * 12
  assert len(set.union(*shard_images)) == 3 * 12
  assert data.steps_per_epoch("cifar10", "test", batch_size=4, data_dir=mock_tfds,
                              shard_count=3) == 3


def test_imagenette_images_are_squared_on_the_host(mock_tfds):
  # The mock examples have random sizes (tens of pixels); the host makes them 160 x 160.
  images, labels = data.load_arrays("imagenette", "validation", data_dir=mock_tfds)
  assert images.shape == (_MOCK_EXAMPLES, 160, 160, 3) and images.dtype == np.uint8
  assert labels.dtype == np.int32


def test_stl10_pretrain_split_loads(mock_tfds):
  info = data.get_info("stl10")
  loader = data.make_loader("stl10", info.pretrain_split, batch_size=16, seed=0,
                            data_dir=mock_tfds, shard_index=0, shard_count=1)
  batch = next(iter(loader))
  assert batch["image"].shape == (16, 96, 96, 3)


@pytest.mark.parametrize("name", ["cifar10", "imagenette", "stl10"])
def test_not_prepared_says_how_to_prepare(name, tmp_path):
  info = data.get_info(name)
  with pytest.raises(data.DatasetNotPreparedError) as raised:
    data.make_loader(name, "train", batch_size=8, seed=0, data_dir=str(tmp_path))
  message = str(raised.value)
  assert f"{name} ({info.tfds_name}) is not prepared in {tmp_path}" in message
  assert f"tfds build {info.tfds_name} --data_dir {tmp_path} --file_format array_record" in message
  assert "tensorflow" in message
  assert isinstance(raised.value, ValueError)


def test_tfrecord_dataset_is_not_prepared_for_random_access(tmp_path):
  # A prepared-looking TFRecord variant: only its metadata, which is all TFDS looks at first.
  builder = tfds.builder("cifar10", data_dir=str(tmp_path), file_format="tfrecord")
  os.makedirs(builder.data_dir)
  builder.info.write_to_directory(builder.data_dir)
  with pytest.raises(data.DatasetNotPreparedError, match=r"found tfrecord files.*remove .*3\.0\.2"):
    data.load_arrays("cifar10", "test", data_dir=str(tmp_path))
