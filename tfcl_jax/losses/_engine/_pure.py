"""What the custom VJPs take of a mapping and of `shard_map`: a `Mapping` made pure for the tiles
(its closed form, or `fn` with the traced values it closes over hoisted as arguments), and
arguments cast to vary over the mesh axes the data varies over.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfcl_jax.losses._engine._tiles import LogSumExp, MappingArgs, TileMapping, TileReduction


def pure_mapping(mapping, dtype, tile_shape, *, like=None,
                 tile_reduction: TileReduction = LogSumExp(), closed_form: bool = True
                 ) -> tuple[TileMapping, MappingArgs]:
  """The static `TileMapping` and array `MappingArgs` of a `Mapping` for tiles of `dtype`.

  A mapping with a closed form the `tile_reduction` asks for (`tile_reduction.fast_form`) is used
  through it unless `closed_form` is False (sides with a per-anchor scale: `w^s` has no closed
  form); any other is made pure with `jax.closure_convert` (traced values it closes over become
  `consts`). Inside `shard_map`, the arguments are cast to vary like `like`.
  """
  fast = tile_reduction.fast_form(mapping, jnp.dtype(dtype)) if closed_form else None
  step = mapping.bound_step()
  if fast is not None:
    return TileMapping(mapping.fn, fast), MappingArgs({}, step, ())
  params = jax.tree.map(jnp.asarray, mapping.params)
  example = jnp.zeros(tile_shape, dtype)
  if like is not None:
    example, params = match_varying((example, params), like)
  fn, consts = jax.closure_convert(mapping.fn, example, params, step)
  consts = tuple(consts)
  if like is not None:
    consts = match_varying(consts, like)
  return TileMapping(fn, None), MappingArgs(params, step, consts)


def _varying_axes(x) -> frozenset:
  aval = jax.typeof(x)
  if hasattr(aval, "vma"):
    return frozenset(aval.vma)
  return frozenset(aval.manual_axis_type.varying)


def match_varying(tree, like: jax.Array):
  """Casts the leaves of `tree` to vary over the `shard_map` axes `like` varies over.

  Inside `shard_map`, a replicated mapping parameter used with per-device data must enter
  a custom VJP as per-device too: its cotangent is per-device, and the cast's transpose
  sums it over the devices.
  """
  axes = tuple(_varying_axes(like))

  def cast(x):
    missing = tuple(axis for axis in axes if axis not in _varying_axes(x))
    return jax.lax.pcast(x, missing, to="varying") if missing else x

  return jax.tree.map(cast, tree) if axes else tree
