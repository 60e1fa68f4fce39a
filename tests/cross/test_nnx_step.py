"""`tfcl_jax.losses.info_nce` inside a Flax NNX training step (`nnx.Optimizer`, `nnx.jit`)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from tfcl_jax import losses, mappings


class Encoder(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(6, 16, rngs=rngs)
    self.out = nnx.Linear(16, 8, rngs=rngs)

  def __call__(self, x):
    return self.out(jax.nn.relu(self.hidden(x)))


def _views(key, n=32):
  base = jax.random.normal(key, (n, 6))
  noise = jax.random.normal(jax.random.fold_in(key, 1), (2, n, 6))
  return base + 0.1 * noise[0], base + 0.1 * noise[1]


@nnx.jit
def train_step(model, optimizer, x1, x2):
  def loss_fn(model):
    return losses.info_nce(model(x1), model(x2), mapping=mappings.temperature_free(),
                           negatives="all")

  loss, grads = nnx.value_and_grad(loss_fn)(model)
  optimizer.update(model, grads)
  return loss


def test_nnx_step_equals_functional_sgd_step():
  model = Encoder(nnx.Rngs(0))
  graphdef, params_before = nnx.split(model, nnx.Param)
  x1, x2 = _views(jax.random.key(1))

  def functional_loss(params):  # the same model, called through split/merge
    return losses.info_nce(nnx.merge(graphdef, params)(x1), nnx.merge(graphdef, params)(x2),
                           mapping=mappings.temperature_free(), negatives="all")

  expected = jax.tree.map(lambda p, g: p - 0.1 * g, params_before,
                          jax.jit(jax.grad(functional_loss))(params_before))
  optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
  train_step(model, optimizer, x1, x2)
  chex.assert_trees_all_close(nnx.state(model, nnx.Param), expected, rtol=1e-5, atol=1e-6)


def test_nnx_training_lowers_the_loss():
  model = Encoder(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
  x1, x2 = _views(jax.random.key(2))
  first = float(train_step(model, optimizer, x1, x2))
  for _ in range(30):
    last = float(train_step(model, optimizer, x1, x2))
  assert last < first - 0.3, (first, last)
  assert jnp.isfinite(last)


class CLIPStyle(nnx.Module):
  """An encoder and CLIP's learnable logit scale: `t` is one more `nnx.Param`."""

  def __init__(self, rngs: nnx.Rngs, *, spec: str = "learnable=0.07:100"):
    self.encoder = Encoder(rngs)
    self.spec = spec  # a str is static; the Mapping is rebuilt from it at each call
    self.t = nnx.Param(mappings.from_spec(spec).params["t"])

  def mapping(self) -> mappings.Mapping:
    return mappings.from_spec(self.spec).bind(params={"t": self.t[...]})

  def __call__(self, x1, x2):
    return losses.info_nce(self.encoder(x1), self.encoder(x2), mapping=self.mapping(),
                           symmetric=True)


@nnx.jit
def clip_step(model, optimizer, x1, x2):
  loss, grads = nnx.value_and_grad(lambda model: model(x1, x2))(model)
  optimizer.update(model, grads)
  return loss


def _clip_reference_loss(z1, z2, t, max_scale):
  """CLIP's symmetric loss in plain jnp: `min(exp(t), max_scale) * cos`, both directions."""
  z1 = z1 / jnp.linalg.norm(z1, axis=1, keepdims=True)
  z2 = z2 / jnp.linalg.norm(z2, axis=1, keepdims=True)
  logits = jnp.minimum(jnp.exp(t), max_scale) * z1 @ z2.T
  labels = jnp.arange(z1.shape[0])
  rows = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  columns = optax.softmax_cross_entropy_with_integer_labels(logits.T, labels)
  return 0.5 * (rows.mean() + columns.mean())


def test_nnx_learnable_temperature_step_equals_functional_step():
  model = CLIPStyle(nnx.Rngs(0))
  graphdef, params_before = nnx.split(model, nnx.Param)
  x1, x2 = _views(jax.random.key(3))

  def reference(params):
    module = nnx.merge(graphdef, params)
    return _clip_reference_loss(module.encoder(x1), module.encoder(x2), module.t[...], 100.0)

  expected_loss, grads = jax.value_and_grad(reference)(params_before)
  assert abs(float(grads["t"][...])) > 1e-4  # the scale is trained
  expected = jax.tree.map(lambda p, g: p - 0.1 * g, params_before, grads)
  optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
  loss = clip_step(model, optimizer, x1, x2)
  chex.assert_trees_all_close(loss, expected_loss, rtol=1e-5)
  chex.assert_trees_all_close(nnx.state(model, nnx.Param), expected, rtol=1e-5, atol=1e-6)
  # The effective scale after the step, as CLIP logs it.
  chex.assert_trees_all_close(mappings.logit_scale(model.mapping()),
                              jnp.minimum(jnp.exp(expected["t"][...]), 100.0), rtol=1e-6)


def test_nnx_learnable_temperature_past_the_cap_gets_no_gradient():
  model = CLIPStyle(nnx.Rngs(0), spec="learnable=0.001:100")  # exp(t) = 1000 > 100
  optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
  t_before = float(model.t[...])
  clip_step(model, optimizer, *_views(jax.random.key(4)))
  assert float(model.t[...]) == t_before
  assert float(mappings.logit_scale(model.mapping())) == 100.0
