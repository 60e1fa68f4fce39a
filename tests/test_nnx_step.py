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
                          jax.grad(functional_loss)(params_before))
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
