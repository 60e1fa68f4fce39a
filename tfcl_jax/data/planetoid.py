"""Planetoid citation graphs (CiteSeer, Cora) from their raw pickles, processed as PyG does.

The raw `ind.<name>.*` files are Python pickles; they are read through a restricted
unpickler that admits only the classes they contain, so a tampered file cannot run code.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os
import pickle
from typing import Any

import numpy as np

#: Node, directed-edge, feature and class counts after processing (PyG's Planetoid).
DATASETS = {
    "citeseer": (3327, 9104, 3703, 6),
    "cora": (2708, 10556, 1433, 7),
}
_PICKLED = ("x", "tx", "allx", "y", "ty", "ally", "graph")


@dataclasses.dataclass(frozen=True)
class PlanetoidGraph:
  """One processed Planetoid graph (host NumPy arrays).

  Attributes:
    name: dataset name, lower case.
    features: `[N, F] float32` node features, rows normalised to sum 1 (zero rows stay 0).
    labels: `[N] int32` class of each node.
    edge_index: `[2, E] int32` directed edges `(source, target)`: symmetric, sorted,
      no self-loops, no duplicates.
    train_mask, val_mask, test_mask: `[N] bool` Planetoid's public split (unused by GRACE,
      which draws its own random split).
  """

  name: str
  features: np.ndarray
  labels: np.ndarray
  edge_index: np.ndarray
  train_mask: np.ndarray
  val_mask: np.ndarray
  test_mask: np.ndarray

  @property
  def num_nodes(self) -> int:
    return self.features.shape[0]

  @property
  def num_classes(self) -> int:
    return int(self.labels.max()) + 1


class UnsafePickleError(pickle.UnpicklingError):
  """Raised when a pickle asks for a class the Planetoid files never contain."""


class _CSRMatrix:
  """Stand-in for `scipy.sparse.csr_matrix` during unpickling: keeps only its state.

  Unpickling builds it with `object.__new__` and fills `__dict__` (`data`, `indices`,
  `indptr`, `_shape`); no scipy code runs and scipy is not needed.
  """

  def to_dense(self, *, file: str) -> np.ndarray:
    state = self.__dict__
    try:
      data, indices, indptr = state["data"], state["indices"], state["indptr"]
      rows, cols = (int(n) for n in state["_shape"])
    except (KeyError, TypeError, ValueError) as error:
      raise ValueError(f"{file}: malformed CSR matrix state ({error!r}).") from None
    if indptr.shape != (rows + 1,) or data.shape != indices.shape:
      raise ValueError(f"{file}: inconsistent CSR matrix ({rows} rows, indptr {indptr.shape}).")
    dense = np.zeros((rows, cols), np.float32)
    row_of = np.repeat(np.arange(rows), np.diff(indptr))
    # Duplicate entries add up, as in scipy's todense().
    np.add.at(dense, (row_of, indices), data)
    return dense


def _reconstruct_array(*args):
  return np.ndarray.__new__(*args)


def _dtype(*args):
  dtype = np.dtype(*args)
  if dtype.hasobject:
    raise UnsafePickleError(f"refusing object dtype {dtype} in a Planetoid pickle")
  return dtype


# (module, name) -> object. Module names as Python 2 wrote them, and their Python 3 homes.
_ALLOWED = {
    ("scipy.sparse.csr", "csr_matrix"): _CSRMatrix,
    ("scipy.sparse._csr", "csr_matrix"): _CSRMatrix,
    ("scipy.sparse", "csr_matrix"): _CSRMatrix,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct_array,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct_array,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _dtype,
    ("collections", "defaultdict"): collections.defaultdict,
    ("__builtin__", "list"): list,
    ("builtins", "list"): list,
    ("__builtin__", "dict"): dict,
    ("builtins", "dict"): dict,
    ("__builtin__", "int"): int,
    ("builtins", "int"): int,
}


class _RestrictedUnpickler(pickle.Unpickler):

  def find_class(self, module: str, name: str):
    try:
      return _ALLOWED[(module, name)]
    except KeyError:
      raise UnsafePickleError(
          f"refusing to load {module}.{name}: Planetoid pickles contain only CSR matrices, "
          "NumPy arrays, defaultdict/dict/list/int.") from None


def restricted_load(data: bytes, *, file: str = "<bytes>"):
  """Unpickles Planetoid data, admitting only the classes those files contain.

  CSR matrices come back as dense `float32` NumPy arrays; everything else as itself.

  Examples:
    >>> import pickle, numpy as np
    >>> from tfcl_jax.data import planetoid
    >>> planetoid.restricted_load(pickle.dumps(np.arange(3))).tolist()
    [0, 1, 2]
    >>> planetoid.restricted_load(pickle.dumps(print))
    Traceback (most recent call last):
    ...
    tfcl_jax.data.planetoid.UnsafePickleError: <bytes>: refusing to load builtins.print: ...

  Args:
    data: the pickle bytes (protocol 2, as written by Python 2, read with latin1).
    file: name used in error messages.

  Returns:
    The unpickled object.

  Raises:
    UnsafePickleError: the pickle asks for any other global.
    ValueError: the pickle is truncated or malformed.
  """
  try:
    obj = _RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()
  except UnsafePickleError as error:
    raise UnsafePickleError(f"{file}: {error}") from None
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
          KeyError) as error:
    raise ValueError(f"{file}: truncated or malformed pickle ({error!r}).") from None
  if isinstance(obj, _CSRMatrix):
    return obj.to_dense(file=file)
  return obj


_WHERE_FROM = (
    "The raw files ind.{name}.{{x,tx,allx,y,ty,ally,graph,test.index}} come from "
    "https://github.com/kimiyoung/planetoid/tree/master/data; put them in one folder and pass "
    "it as root (experiments: --config.data_dir).")


def _read(root: str, name: str, suffix: str) -> Any:
  """Node ids (`test.index`), an adjacency dict (`graph`) or a float32 matrix, by `suffix`."""
  path = os.path.join(root, f"ind.{name}.{suffix}")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"Planetoid file {path} not found (dataset {name!r}, folder "
                            f"{root!r}). {_WHERE_FROM.format(name=name)}")
  if suffix == "test.index":
    try:
      return np.loadtxt(path, dtype=np.int64, ndmin=1)
    except ValueError as error:
      raise ValueError(f"{path}: not a list of integer node ids ({error}).") from None
  with open(path, "rb") as f:
    obj = restricted_load(f.read(), file=path)
  if suffix == "graph":
    if not isinstance(obj, dict):
      raise ValueError(f"{path}: expected an adjacency dict, got {type(obj).__name__}.")
    return obj
  if not isinstance(obj, np.ndarray) or obj.ndim != 2:
    raise ValueError(f"{path}: expected a 2-D matrix, got {type(obj).__name__}.")
  return obj.astype(np.float32)


def edge_index_from_adjacency(adjacency: dict, *, num_nodes: int) -> np.ndarray:
  """`[2, E]` sorted, symmetric edges without self-loops or duplicates from `{node: [nbrs]}`.

  Examples:
    >>> from tfcl_jax.data import planetoid
    >>> planetoid.edge_index_from_adjacency({0: [1, 1, 0], 2: [1]}, num_nodes=3).tolist()
    [[0, 1, 1, 2], [1, 0, 2, 1]]
  """
  sources = [int(node) for node, nbrs in adjacency.items() for _ in nbrs]
  targets = [int(nbr) for nbrs in adjacency.values() for nbr in nbrs]
  edges = np.array([sources + targets, targets + sources], np.int64).reshape(2, -1)
  if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
    raise ValueError(f"adjacency has node ids outside [0, {num_nodes}).")
  edges = edges[:, edges[0] != edges[1]]
  edges = np.unique(edges[0] * num_nodes + edges[1])
  return np.stack([edges // num_nodes, edges % num_nodes]).astype(np.int32)


def normalize_features(features: np.ndarray) -> np.ndarray:
  """Rows divided by their sum, clamped at 1 (PyG `NormalizeFeatures`): zero rows stay 0."""
  return features / np.maximum(features.sum(axis=1, keepdims=True), 1.0)


def load_planetoid(name: str, *, root: str | os.PathLike) -> PlanetoidGraph:
  """Loads CiteSeer or Cora from the raw Planetoid files in `root`, as PyG's `Planetoid` does.

  Stacks `allx`/`tx` and `ally`/`ty`, puts test nodes back at their ids
  (`test.index`), pads CiteSeer's isolated test nodes with zero features and label 0,
  makes edges symmetric without self-loops or duplicates, and row-normalises features.

  Examples:
    A folder without the files says which file is missing and where the files come from
    (with them, Cora has `features.shape == (2708, 1433)`, `edge_index.shape == (2, 10556)`):

    >>> import tempfile
    >>> from tfcl_jax.data import planetoid
    >>> try:
    ...   planetoid.load_planetoid("cora", root=tempfile.mkdtemp())
    ... except FileNotFoundError as error:
    ...   print("kimiyoung/planetoid" in str(error))
    True

  Args:
    name: `"citeseer"` or `"cora"` (case-insensitive).
    root: folder holding `ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}`.

  Returns:
    A `PlanetoidGraph`.

  Raises:
    ValueError: unknown `name`, or a truncated/malformed file (named).
    FileNotFoundError: a missing file (named).
    UnsafePickleError: a pickle asking for a class these files never contain.

  References:
    Yang, Cohen & Salakhutdinov, Revisiting Semi-Supervised Learning with Graph
    Embeddings, ICML 2016; PyTorch Geometric `read_planetoid_data`.
  """
  if not isinstance(name, str) or name.lower() not in DATASETS:
    raise ValueError(f"Unknown Planetoid dataset name {name!r}; known: {sorted(DATASETS)}.")
  name = name.lower()
  root = os.fspath(root)
  if not os.path.isdir(root):
    raise FileNotFoundError(f"Planetoid folder {root!r} not found. {_WHERE_FROM.format(name=name)}")
  x, tx, allx, y, ty, ally, adjacency = (_read(root, name, s) for s in _PICKLED)
  test_index = _read(root, name, "test.index")
  sorted_test = np.sort(test_index)

  if name == "citeseer":
    # Isolated test nodes have ids in test.index's range but no rows in tx/ty: pad with zeros.
    span = int(sorted_test[-1] - sorted_test[0]) + 1
    tx_full = np.zeros((span, tx.shape[1]), tx.dtype)
    tx_full[sorted_test - sorted_test[0]] = tx
    ty_full = np.zeros((span, ty.shape[1]), ty.dtype)
    ty_full[sorted_test - sorted_test[0]] = ty
    tx, ty = tx_full, ty_full

  features = np.concatenate([allx, tx])
  features[test_index] = features[sorted_test]
  labels = np.concatenate([ally, ty]).argmax(axis=1).astype(np.int32)
  labels[test_index] = labels[sorted_test]
  num_nodes = features.shape[0]

  def mask(index):
    out = np.zeros(num_nodes, bool)
    out[index] = True
    return out

  num_train = y.shape[0]
  return PlanetoidGraph(
      name=name,
      features=normalize_features(features).astype(np.float32),
      labels=labels,
      edge_index=edge_index_from_adjacency(adjacency, num_nodes=num_nodes),
      train_mask=mask(np.arange(num_train)),
      val_mask=mask(np.arange(num_train, num_train + 500)),
      test_mask=mask(test_index),
  )
