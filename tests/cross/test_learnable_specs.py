"""A mapping with trainable params named by a spec string: every loss refuses it with the fix, and
the two ways that hold the params (a bound `Mapping`, a loss spec with `params=`) train them.

A string is rebuilt at its initial values on every call, so `mapping="learnable_free=100"`
would equal `mapping="free"` forever; the refusal is checked against that fact, and training
against a finite difference of the loss in `t` (independent of the losses' custom VJP).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.helpers.marks import widest
from tfcl_jax import losses, mappings

LEARNABLE = ("learnable", "learnable=0.07", "learnable=0.07:100", "learnable_free",
             "learnable_free=100")
FIXED = ("free", "tau=0.1", "dynamic=0.1:0.2", "free_n", "free_n=15")


def _views(n=8, d=6):
  z1 = jax.random.normal(jax.random.key(0), (n, d))
  return z1, z1 + 0.3 * jax.random.normal(jax.random.key(1), (n, d))


def _mesh():
  return jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])


LOSSES = {
    "info_nce all": lambda z1, z2, m: losses.info_nce(z1, z2, mapping=m, negatives="all"),
    "info_nce cross": lambda z1, z2, m: losses.info_nce(z1, z2, mapping=m, negatives="cross"),
    "clip": lambda z1, z2, m: losses.info_nce(z1, z2, mapping=m, symmetric=True),
    "info_nce pallas": lambda z1, z2, m: losses.info_nce(z1, z2, mapping=m,
                                                         implementation="pallas"),
    "sigmoid": lambda z1, z2, m: losses.sigmoid_loss(z1, z2, mapping=m),
    "supervised": lambda z1, z2, m: losses.supervised_info_nce(
        z1, jnp.arange(8) % 3, mapping=m),
    "info_nce_on_mesh": lambda z1, z2, m: losses.info_nce_on_mesh(z1, z2, mesh=_mesh(),
                                                                  mapping=m),
    "sigmoid_loss_on_mesh": lambda z1, z2, m: losses.sigmoid_loss_on_mesh(z1, z2, mesh=_mesh(),
                                                                          mapping=m),
}


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("spec", LEARNABLE)
def test_a_learnable_spec_string_is_refused_with_the_fix(loss, spec):
  z1, z2 = _views()
  with pytest.raises(ValueError, match=r"trainable params \['t'\]") as error:
    LOSSES[loss](z1, z2, spec)
  message = str(error.value)
  canonical = mappings.from_spec(spec).spec
  assert f"mappings.from_spec({canonical!r})" in message and "m.bind(params=" in message
  assert f"losses.from_spec({canonical!r})" in message
  # The fix the message names runs: the mapping built once, bound to its params (once per loss
  # and family of mapping: the loss's compiled program does not depend on the spec's numbers;
  # the sharded losses run bound learnable mappings in tests/losses/test_family.py).
  if spec in ("learnable", "learnable_free") and not loss.endswith("_on_mesh"):
    built = mappings.from_spec(spec)
    assert np.isfinite(LOSSES[loss](z1, z2, built.bind(params=built.params)))


@pytest.mark.parametrize("loss", ["info_nce all", "sigmoid", "supervised"])
@pytest.mark.parametrize("spec", FIXED)
def test_a_spec_string_without_params_still_works(loss, spec):
  z1, z2 = _views()
  assert np.isfinite(LOSSES[loss](z1, z2, spec))


def test_the_refused_string_would_never_have_trained():
  # What the refusal prevents: at t = 0 the learnable free mapping is the free mapping itself, and a
  # string is built at t = 0 on every call.
  z1, z2 = _views()
  at_start = mappings.from_spec("learnable_free=100")
  at_start = at_start.bind(params=at_start.params)
  # Equal to the last bits free's closed form and the learnable mapping's own path allow.
  np.testing.assert_allclose(losses.info_nce(z1, z2, mapping=at_start),
                             losses.info_nce(z1, z2, mapping="free"), rtol=1e-6)


@pytest.mark.parametrize("spec", widest(
    *LEARNABLE, "sigmoid/learnable_free=100/learn_b=0", "clip:learnable=0.07:100",
    quick=("learnable=0.07", "sigmoid/learnable_free=100/learn_b=0")))
def test_a_loss_spec_needs_its_params_and_trains_them(spec):
  z1, z2 = _views()
  loss = losses.from_spec(spec)
  with pytest.raises(ValueError, match=r"has trainable params .*pass params="):
    loss(z1, z2)

  def value(params):
    return loss(z1, z2, params=params)

  params = loss.params
  grads = jax.grad(value)(params)
  # d loss / d t against a central difference of the loss itself.
  eps = 1e-3
  shifted = [value({**params, "t": params["t"] + s}) for s in (eps, -eps)]
  np.testing.assert_allclose(grads["t"], (shifted[0] - shifted[1]) / (2 * eps), rtol=2e-2,
                             atol=1e-4)
  assert abs(float(grads["t"])) > 1e-4
  # A few optimiser steps on the params alone move t and lower the loss.
  tx = optax.sgd(0.5)
  state = tx.init(params)
  start = value(params)
  for _ in range(5):
    updates, state = tx.update(jax.grad(value)(params), state)
    params = optax.apply_updates(params, updates)
  assert float(params["t"]) != float(loss.params["t"]) and value(params) < start


@pytest.mark.parametrize("spec", LEARNABLE)
def test_a_map_built_inside_a_trace_keeps_its_spec(spec):
  # A mapping built under jit (as the sharded losses build it, inside shard_map) names the same
  # mapping: CLIP's cap included.
  traced = []
  jax.jit(lambda: traced.append(mappings.from_spec(spec).spec))()
  assert traced == [mappings.from_spec(spec).spec]
