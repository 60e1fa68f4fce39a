"""No learnable mapping trains nothing in silence, traced or not.

A learnable mapping reaches a loss bound to the caller's params (`m.bind(params=...)`), or as the
leaves JAX rebuilt it from (an argument of `jax.grad`); built inside the loss function from its
spec (the README's NNX and Linen models with `.bind` dropped) it is refused with a `ValueError`
that names the fix, eagerly, under `jax.jit` and under `nnx.jit`. Every documented use still
trains: each test checks that `t` moves, or that its gradient is the central difference of the
loss in `t`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tfcl_jax import losses, mappings

UNBOUND = r"has trainable params \['t'\] but was passed unbound"


def _views(n=16, d=8):
  z1 = jax.random.normal(jax.random.key(0), (n, d))
  return z1, z1 + 0.3 * jax.random.normal(jax.random.key(1), (n, d))


class NNXTwoTower(nnx.Module):
  """The README's NNX model; `bind=False` drops the `.bind`."""

  def __init__(self, rngs, spec="learnable=0.07:100", bind=True):
    self.users, self.items = nnx.Linear(16, 32, rngs=rngs), nnx.Linear(24, 32, rngs=rngs)
    self.spec, self.bind = spec, bind
    self.t = nnx.Param(mappings.from_spec(spec).params["t"])

  def mapping(self):
    mapping = mappings.from_spec(self.spec)
    return mapping.bind(params={"t": self.t[...]}) if self.bind else mapping

  def __call__(self, users, items):
    return losses.info_nce(self.users(users), self.items(items), mapping=self.mapping(),
                           symmetric=True)


class LinenTwoTower(nn.Module):
  """The README's Linen model; `bind=False` drops the `.bind`."""

  spec: str = "learnable=0.07:100"
  bind: bool = True

  @nn.compact
  def __call__(self, users, items):
    mapping = mappings.from_spec(self.spec)
    t = self.param("t", lambda key: mapping.params["t"])
    return losses.info_nce(nn.Dense(32, name="users")(users), nn.Dense(32, name="items")(items),
                           mapping=mapping.bind(params={"t": t}) if self.bind else mapping,
                           symmetric=True)


USERS = jax.random.normal(jax.random.key(0), (32, 16))
ITEMS = jax.random.normal(jax.random.key(1), (32, 24))


def _nnx_step(model, optimizer, users, items):
  loss, grads = nnx.value_and_grad(lambda m: m(users, items))(model)
  optimizer.update(model, grads)
  return loss


@pytest.mark.parametrize("jit", [True, False], ids=["nnx.jit", "eager"])
@pytest.mark.parametrize("spec", ["learnable=0.07:100", "learnable_free=100"])
def test_the_readme_nnx_model_trains_t_bound_and_is_refused_unbound(spec, jit):
  step = nnx.jit(_nnx_step) if jit else _nnx_step
  model = NNXTwoTower(nnx.Rngs(0), spec=spec)
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
  before = float(model.t[...])
  step(model, optimizer, USERS, ITEMS)
  assert abs(float(model.t[...]) - before) > 1e-3   # Adam's first step moves t by ~lr

  model = NNXTwoTower(nnx.Rngs(0), spec=spec, bind=False)
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
  with pytest.raises(ValueError, match=UNBOUND) as error:
    step(model, optimizer, USERS, ITEMS)
  assert "m.bind(params=params['loss'])" in str(error.value)


@pytest.mark.parametrize("jit", [True, False], ids=["jax.jit", "eager"])
def test_the_readme_linen_model_trains_t_bound_and_is_refused_unbound(jit):
  model = LinenTwoTower()
  init = jax.jit(model.init) if jit else model.init
  params = init(jax.random.key(2), USERS, ITEMS)["params"]
  loss = lambda p: model.apply({"params": p}, USERS, ITEMS)  # noqa: E731
  grad = (jax.jit(jax.grad(loss)) if jit else jax.grad(loss))(params)["t"]
  eps = 1e-3
  central = (loss({**params, "t": params["t"] + eps})
             - loss({**params, "t": params["t"] - eps})) / (2 * eps)
  np.testing.assert_allclose(grad, central, rtol=2e-2)
  assert abs(float(grad)) > 1e-3

  unbound = LinenTwoTower(bind=False)
  unbound_init = jax.jit(unbound.init) if jit else unbound.init
  with pytest.raises(ValueError, match=UNBOUND):
    unbound_init(jax.random.key(2), USERS, ITEMS)


@pytest.mark.parametrize("spec", ["learnable_free=100", "learnable=0.07"])
def test_a_mapping_built_from_its_spec_inside_jit_of_grad_is_refused(spec):
  z1, z2 = _views()

  def loss(z):
    return losses.info_nce(z, z2, mapping=mappings.from_spec(spec))

  with pytest.raises(ValueError, match=UNBOUND):
    jax.jit(jax.grad(loss))(z1)
  with pytest.raises(ValueError, match=UNBOUND):
    jax.grad(loss)(z1)


def test_a_mapping_held_as_model_data_and_left_out_of_the_gradient_is_refused():
  # nnx.data keeps the mapping in the model, but nnx.grad (wrt=nnx.Param) leaves its t out.
  class Holder(nnx.Module):
    def __init__(self, rngs):
      self.tower = nnx.Linear(16, 8, rngs=rngs)
      self.mapping = nnx.data(mappings.from_spec("learnable_free=100"))

    def __call__(self, x):
      return losses.info_nce(self.tower(x), self.tower(x + 0.1), mapping=self.mapping)

  model = Holder(nnx.Rngs(0))
  for wrap in (nnx.jit, lambda f: f):
    with pytest.raises(ValueError, match="that the loss's gradient leaves out"):
      wrap(lambda m: nnx.grad(lambda m: m(USERS))(m))(model)


def test_a_mapping_passed_to_jit_but_left_out_of_the_gradient_is_refused():
  z1, z2 = _views()

  @jax.jit
  def embeddings_gradient(z, mapping):
    return jax.grad(lambda z: losses.info_nce(z, z2, mapping=mapping))(z)

  with pytest.raises(ValueError, match="that the loss's gradient leaves out"):
    embeddings_gradient(z1, mappings.from_spec("learnable_free=100"))
  # Evaluated, not differentiated, it is taken as given.
  m = mappings.from_spec("learnable_free=100")
  np.testing.assert_allclose(
      jax.jit(lambda mapping: losses.info_nce(z1, z2, mapping=mapping))(m),
      losses.info_nce(z1, z2, mapping=m.bind(params=m.params)), rtol=1e-5)


def test_a_mapping_differentiated_as_an_argument_trains_under_jit():
  # Rebuilt by JAX from the leaves it was given, its params are the argument: the gradient on
  # them is the bound mapping's.
  z1, z2 = _views()
  m = mappings.from_spec("learnable_free=100")
  grad = jax.jit(jax.grad(lambda m: losses.info_nce(z1, z2, mapping=m)))(m)
  bound = jax.grad(lambda p: losses.info_nce(z1, z2, mapping=m.bind(params=p)))(m.params)
  np.testing.assert_allclose(grad.params["t"], bound["t"], rtol=1e-6)
  assert abs(float(bound["t"])) > 1e-3
  # optax updates the mapping as a pytree; the updated mapping keeps its tree structure.
  updates, _ = optax.sgd(0.1).update(grad, optax.sgd(0.1).init(m))
  trained = optax.apply_updates(m, updates)
  assert jax.tree.structure(trained) == jax.tree.structure(m)
  np.testing.assert_allclose(trained.params["t"], -0.1 * bound["t"], rtol=1e-6)
  assert np.isfinite(losses.info_nce(z1, z2, mapping=trained))


def test_a_loss_spec_trains_its_params_under_jit():
  z1, z2 = _views()
  loss = losses.from_spec("clip:learnable=0.07:100")
  grad = jax.jit(jax.grad(lambda p: loss(z1, z2, params=p)))(loss.params)["t"]
  assert abs(float(grad)) > 1e-3


def test_a_traced_t_given_to_the_constructor_counts_as_bound():
  # learnable_temperature(t=...) documents a traced t, so that gradients reach it (the analysis
  # differentiates Eq. 10 this way): d/dt of the loss at N = 2 is its central difference.
  z1, z2 = _views(n=2)

  def loss(t):
    return losses.info_nce(z1, z2, mapping=mappings.learnable_temperature(t=t))

  def held(t):   # a concrete t gives an unbound mapping: bound to evaluate at it
    m = mappings.learnable_temperature(t=t)
    return losses.info_nce(z1, z2, mapping=m.bind(params=m.params))

  eps = 1e-3
  central = (held(1.0 + eps) - held(1.0 - eps)) / (2 * eps)
  np.testing.assert_allclose(jax.grad(loss)(1.0), central, rtol=1e-2)
  with pytest.raises(ValueError, match=UNBOUND):
    loss(1.0)


def test_what_a_mapping_holds_is_the_callers_only_once_given():
  m = mappings.from_spec("learnable_free=100")
  assert not m.params_given
  assert m.bind(params=m.params).params_given
  assert m.bind(params=m.params).bind(step=3).params_given
  assert jax.tree.map(lambda x: x, m).params_given
  assert not mappings.from_spec("learnable=0.07").bind(step=3).params_given


@pytest.mark.parametrize("spec", ["learnable=0.07", "learnable_free=100"])
def test_a_vector_t_made_by_a_tree_map_is_refused_naming_its_shape(spec):
  z1, z2 = _views()
  m = jax.tree.map(lambda x: jnp.full((3,), x), mappings.from_spec(spec))
  with pytest.raises(ValueError, match=r"params\['t'\] .* must have shape \(\) .* got shape "
                                       r"\(3,\)") as error:
    losses.info_nce(z1, z2, mapping=m)
  assert "vmap the loss" in str(error.value)
  # Under vmap each example's t is a scalar, and the loss takes it.
  per_t = jax.vmap(lambda mapping: losses.info_nce(z1, z2, mapping=mapping))(m)
  assert per_t.shape == (3,)
