"""The abstract inputs of an experiment's train step, to lower or compile it for another platform
without its data or device (`Experiment.abstract_step`; `tests/cross/test_lowering.py` lowers each
for `cuda` and `tpu`, `benchmarks/tpu_compile.py` compiles them for a TPU from a CPU host).

An experiment's `abstract_step(config, mesh, *, spec="free")` builds the step exactly as its
runs do (config, model, objective, optimiser, shardings and donation) on `mesh` and returns
`(jitted_step, (state, batch, key))` with shapes only:
`jitted_step.trace(*inputs).lower(lowering_platforms=(platform,))`.
"""

from __future__ import annotations

import jax


def shapes(tree):
  """`tree`'s arrays as `jax.ShapeDtypeStruct`s."""
  return jax.eval_shape(lambda: tree)


def key() -> jax.ShapeDtypeStruct:
  """A typed PRNG key's shape."""
  return jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
