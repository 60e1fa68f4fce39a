"""Mesh helpers: one `data` axis; batches sharded over it (or replicated), parameters replicated.

Multi-host: call `jax.distributed.initialize()` first; `make_mesh()` then spans every process's
devices and `shard_batch` assembles the global batch from each host's local batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

#: The mesh axis the batch is split along.
DATA_AXIS = "data"


# jax.Device is the public device class, exported as an alias that pyright takes for a variable.
def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:  # pyright: ignore[reportInvalidTypeForm]
  """A 1-D mesh with axis `data` over `devices` (default: all devices of all hosts).

  Examples:
    >>> import jax
    >>> from tfcl_jax.training import sharding
    >>> mesh = sharding.make_mesh(jax.devices()[:1])
    >>> mesh.axis_names, mesh.size
    (('data',), 1)
  """
  devices = jax.devices() if devices is None else list(devices)
  if not devices:
    raise ValueError("devices must name at least one device.")
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  """Every device holds the whole array (parameters, optimiser state, a whole graph)."""
  return NamedSharding(mesh, PartitionSpec())


def data_sharded(mesh: Mesh) -> NamedSharding:
  """The leading (batch) axis is split over the mesh's `data` axis."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Places every leaf of `tree` on every device of `mesh`, across processes too.

  `jax.device_put` onto a sharding that spans several processes takes process-local arrays
  (each process passes the same value), but neither typed PRNG keys (they travel as their key
  data) nor arrays committed to other devices (a restored checkpoint, a replicated global
  array on another mesh): those are re-placed from this process's copy through the host, as
  CPU backends have no cross-host transfers.

  Examples:
    >>> import jax
    >>> from tfcl_jax.training import sharding
    >>> mesh = sharding.make_mesh(jax.devices()[:1])
    >>> key = sharding.replicate(jax.random.key(0), mesh)
    >>> key.sharding.is_fully_replicated, jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    (True, True)
  """
  target = replicated(mesh)

  def put(leaf):
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      data = put(jax.random.key_data(leaf))
      return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
    if isinstance(leaf, jax.Array) and not target.is_fully_addressable:
      if leaf.sharding.is_equivalent_to(target, leaf.ndim):
        return leaf
      if not leaf.is_fully_addressable:
        if not leaf.sharding.is_fully_replicated:
          raise ValueError(f"cannot replicate an array sharded as {leaf.sharding} across "
                           "processes; gather it first.")
        leaf = leaf.addressable_data(0)  # this process's copy of a replicated global array
      leaf = np.asarray(leaf)  # through the host: committed arrays would need device transfers
    return jax.device_put(leaf, target)

  return jax.tree.map(put, tree)


def check_batch_size(batch_size: int, mesh: Mesh, *, name: str = "batch_size") -> int:
  """Raises `ValueError` unless `batch_size` is a positive multiple of the device count.

  Examples:
    >>> import jax
    >>> from tfcl_jax.training import sharding
    >>> sharding.check_batch_size(8, sharding.make_mesh(jax.devices()[:1]))
    8
  """
  if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
    raise TypeError(f"{name} must be an int, got {type(batch_size).__name__}.")
  if batch_size <= 0 or batch_size % mesh.size:
    raise ValueError(
        f"{name} = {batch_size} must be a positive multiple of the number of devices in the "
        f"mesh ({mesh.size}); use e.g. {name} = {max(1, batch_size // mesh.size) * mesh.size}.")
  return int(batch_size)


def shard_batch(batch: Any, mesh: Mesh, *, sharded: bool = True) -> Any:
  """Places a host batch (pytree of NumPy arrays) on the mesh.

  With `sharded=True` each leaf's leading axis is this host's slice of the global batch and is
  split over `data`; with `sharded=False` every leaf is replicated (e.g. a whole graph).

  Examples:
    >>> import jax, numpy as np
    >>> from tfcl_jax.training import sharding
    >>> mesh = sharding.make_mesh(jax.devices()[:1])
    >>> sharding.shard_batch({"x": np.zeros((4, 2))}, mesh)["x"].shape
    (4, 2)
  """
  if not sharded:
    return replicate(batch, mesh)
  target = data_sharded(mesh)
  local_devices = mesh.local_mesh.size

  def put(leaf):
    leaf = np.asarray(leaf)
    if leaf.ndim == 0 or leaf.shape[0] % local_devices:
      raise ValueError(
          f"batch leaves must have a leading axis divisible by the {local_devices} local "
          f"devices of the mesh, got shape {leaf.shape}.")
    return jax.make_array_from_process_local_data(target, leaf)

  return jax.tree.map(put, batch)
