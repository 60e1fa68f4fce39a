"""Planetoid loader and its restricted unpickler, on the real CiteSeer and Cora files."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest

from tfcl_jax.data import planetoid

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "planetoid")
# Plain pickle of the raw files (the reference reader) names the old `scipy.sparse.csr` module.
pytestmark = pytest.mark.filterwarnings("ignore:.*scipy.sparse.csr.*:DeprecationWarning")
needs_data = pytest.mark.skipif(
    not os.path.isdir(ROOT), reason=f"Planetoid files not found at {ROOT}")


@pytest.fixture(scope="module", params=["citeseer", "cora"])
def graph(request):
  if not os.path.isdir(ROOT):
    pytest.skip(f"Planetoid files not found at {ROOT}")
  return planetoid.load_planetoid(request.param, root=ROOT)


# Counts from the issue (PyG's Planetoid).
EXPECTED = {"citeseer": (3327, 9104, 3703, 6), "cora": (2708, 10556, 1433, 7)}


def test_counts(graph):
  nodes, edges, features, classes = EXPECTED[graph.name]
  assert graph.features.shape == (nodes, features)
  assert graph.features.dtype == np.float32
  assert graph.edge_index.shape == (2, edges)
  assert graph.labels.shape == (nodes,)
  assert graph.num_classes == classes
  assert set(np.unique(graph.labels)) == set(range(classes))
  assert (graph.train_mask.sum(), graph.val_mask.sum(), graph.test_mask.sum()) == (
      classes * 20, 500, 1000)


def test_edges_symmetric_simple(graph):
  source, target = graph.edge_index.astype(np.int64)
  assert np.all(source != target), "self-loops"
  pairs = set(zip(source.tolist(), target.tolist(), strict=True))
  assert len(pairs) == source.size, "duplicate edges"
  assert all((t, s) in pairs for s, t in pairs), "not symmetric"
  assert np.all(np.diff(source * graph.num_nodes + target) > 0), "not sorted"


def test_features_row_normalised(graph):
  sums = graph.features.sum(axis=1)
  nonzero = sums > 0
  np.testing.assert_allclose(sums[nonzero], 1.0, rtol=1e-5)
  # CiteSeer's 15 isolated test nodes have no features in the files; Cora has none missing.
  assert (~nonzero).sum() == {"citeseer": 15, "cora": 0}[graph.name]


def test_test_nodes_carry_their_tx_rows(graph):
  """Line i of test.index names the node whose features are row i of tx (the file format)."""
  scipy_sparse = pytest.importorskip("scipy.sparse")
  del scipy_sparse
  with open(os.path.join(ROOT, f"ind.{graph.name}.tx"), "rb") as f:
    tx = np.asarray(pickle.load(f, encoding="latin1").todense())  # trusted file, reference reader
  with open(os.path.join(ROOT, f"ind.{graph.name}.ty"), "rb") as f:
    ty = pickle.load(f, encoding="latin1")
  test_index = np.loadtxt(os.path.join(ROOT, f"ind.{graph.name}.test.index"), dtype=np.int64)
  expected = tx / np.maximum(tx.sum(axis=1, keepdims=True), 1.0)
  np.testing.assert_allclose(graph.features[test_index], expected, rtol=1e-6)
  np.testing.assert_array_equal(graph.labels[test_index], ty.argmax(axis=1))


@needs_data
@pytest.mark.parametrize("suffix", ["allx", "y", "graph"])
def test_restricted_load_matches_pickle(suffix):
  pytest.importorskip("scipy.sparse")
  with open(os.path.join(ROOT, f"ind.cora.{suffix}"), "rb") as f:
    data = f.read()
  ours = planetoid.restricted_load(data)
  reference = pickle.loads(data, encoding="latin1")
  if suffix == "graph":
    assert dict(ours) == dict(reference)
  else:
    reference = np.asarray(reference.todense() if hasattr(reference, "todense") else reference)
    np.testing.assert_array_equal(ours, reference)


class _Payload:
  """Unpickling this calls os.system: what a malicious Planetoid file would do."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_refused(tmp_path):
  marker = tmp_path / "pwned"
  data = pickle.dumps(_Payload(str(marker)), protocol=2)
  with pytest.raises(planetoid.UnsafePickleError, match="refusing to load (posix|os).system"):
    planetoid.restricted_load(data, file="evil")
  assert not marker.exists()


def test_object_dtype_refused():
  data = pickle.dumps(np.array([1, "a"], dtype=object), protocol=2)
  with pytest.raises(planetoid.UnsafePickleError):
    planetoid.restricted_load(data)


@needs_data
def test_malicious_file_in_folder_refused(tmp_path):
  for name in os.listdir(ROOT):
    if name.startswith("ind.cora."):
      shutil.copy(os.path.join(ROOT, name), tmp_path / name)
  (tmp_path / "ind.cora.graph").write_bytes(pickle.dumps(_Payload(str(tmp_path / "x")), protocol=2))
  with pytest.raises(planetoid.UnsafePickleError, match="ind.cora.graph"):
    planetoid.load_planetoid("cora", root=tmp_path)
  assert not (tmp_path / "x").exists()


@needs_data
def test_truncated_file_named(tmp_path):
  for name in os.listdir(ROOT):
    if name.startswith("ind.cora."):
      shutil.copy(os.path.join(ROOT, name), tmp_path / name)
  full = (tmp_path / "ind.cora.allx").read_bytes()
  (tmp_path / "ind.cora.allx").write_bytes(full[: len(full) // 2])
  with pytest.raises(ValueError, match=r"ind\.cora\.allx.*truncated"):
    planetoid.load_planetoid("cora", root=tmp_path)


@needs_data
def test_missing_file_named(tmp_path):
  for name in os.listdir(ROOT):
    if name.startswith("ind.cora.") and not name.endswith(".ty"):
      shutil.copy(os.path.join(ROOT, name), tmp_path / name)
  with pytest.raises(FileNotFoundError, match=r"ind\.cora\.ty"):
    planetoid.load_planetoid("cora", root=tmp_path)


def test_missing_folder_and_unknown_name(tmp_path):
  with pytest.raises(FileNotFoundError, match="nowhere"):
    planetoid.load_planetoid("cora", root=tmp_path / "nowhere")
  with pytest.raises(ValueError, match="'pubmedx'"):
    planetoid.load_planetoid("pubmedx", root=tmp_path)
