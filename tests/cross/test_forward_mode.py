"""Second derivatives and forward mode of the losses, from the user's side.

The losses' gradients are custom VJPs (the tiles are recomputed backward). Forward-over-reverse
works: `jax.hessian` and `jax.jvp(jax.grad(f))` (Hessian-vector products) match the same loss
written densely here, differentiated by JAX. Forward mode itself (`jax.jvp`, `jax.jacfwd`) is
refused at the loss by a `TypeError` that names what works, eagerly and inside `jit`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfcl_jax import losses

N, D = 4, 3
LABELS = jnp.array([0, 0, 1, 1])


def _views():
  z1 = jax.random.normal(jax.random.key(0), (N, D))
  z2 = z1 + 0.5 * jax.random.normal(jax.random.key(1), (N, D))
  return z1, z2


def _unit(z):
  return z / jnp.linalg.norm(z, axis=1, keepdims=True)


def _free(cos):
  return jnp.log1p(cos) - jnp.log1p(-cos)


def _dense(kind, z1, z2):
  """The losses written densely, no tiles and no custom derivative."""
  u1, u2 = _unit(z1), _unit(z2)
  if kind == "cross":
    logits = _free(u1 @ u2.T)
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.diag(logits))
  if kind == "clip tau=0.5":
    logits = u1 @ u2.T / 0.5
    return 0.5 * (jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.diag(logits))
                  + jnp.mean(jax.nn.logsumexp(logits, axis=0) - jnp.diag(logits)))
  if kind == "all":
    u = jnp.concatenate([u1, u2])
    self_pairs = jnp.eye(2 * N, dtype=bool)   # cos = 1, left out (before the map: no inf there)
    logits = jnp.where(self_pairs, -jnp.inf, _free(jnp.where(self_pairs, 0.0, u @ u.T)))
    positive = logits[jnp.arange(2 * N), (jnp.arange(2 * N) + N) % (2 * N)]
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - positive)
  if kind == "bank":
    bank = _unit(jnp.asarray(BANK))
    logits = _free(jnp.concatenate([u1 @ u2.T, u1 @ bank.T], axis=1))
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.diag(logits[:, :N]))
  if kind == "sigmoid":
    logits = _free(u1 @ u2.T)
    signs = 2.0 * jnp.eye(N) - 1.0
    return jnp.mean(jnp.sum(jax.nn.softplus(-signs * logits), axis=1))
  if kind == "supcon":
    other = ~jnp.eye(N, dtype=bool)
    logits = _free(jnp.where(other, u1 @ u1.T, 0.0))
    same = (LABELS[:, None] == LABELS[None, :]) & other
    lse = jax.nn.logsumexp(jnp.where(other, logits, -jnp.inf), axis=1)
    return jnp.mean(lse - jnp.sum(jnp.where(same, logits, 0.0), axis=1) / jnp.sum(same, axis=1))
  raise ValueError(kind)


BANK = np.asarray(jax.random.normal(jax.random.key(2), (3, D)))
LOSSES = {
    "cross": lambda a, b: losses.info_nce(a, b),
    "clip tau=0.5": lambda a, b: losses.info_nce(a, b, symmetric=True, mapping="tau=0.5"),
    "all": lambda a, b: losses.info_nce(a, b, negatives="all", block_size=3),  # ragged tiles
    "bank": lambda a, b: losses.info_nce(a, b, extra_negatives=BANK),
    "sigmoid": lambda a, b: losses.sigmoid_loss(a, b),
    "supcon": lambda a, b: losses.supervised_info_nce(a, LABELS, form="supcon"),
}


@pytest.mark.parametrize("kind", list(LOSSES))
def test_the_hessian_is_the_dense_losss(kind):
  z1, z2 = _views()
  fn = LOSSES[kind]
  hessian = jax.jit(jax.hessian(fn))(z1, z2)
  expected = jax.jit(jax.hessian(lambda a: _dense(kind, a, z2)))(z1)
  np.testing.assert_allclose(hessian, expected, rtol=1e-4, atol=1e-5)
  # Reverse over reverse gives the same.
  np.testing.assert_allclose(jax.jit(jax.jacrev(jax.jacrev(fn)))(z1, z2), expected, rtol=1e-4,
                             atol=1e-5)


@pytest.mark.parametrize("kind", ["cross", "all", "sigmoid", "supcon"])
def test_forward_over_reverse_hessian_vector_products_under_jit(kind):
  z1, z2 = _views()
  v = jax.random.normal(jax.random.key(3), z1.shape)
  hvp = jax.jit(lambda a, v: jax.jvp(jax.grad(LOSSES[kind]), (a, z2), (v, jnp.zeros_like(z2)))[1])
  expected = jax.jvp(jax.grad(lambda a: _dense(kind, a, z2)), (z1,), (v,))[1]
  np.testing.assert_allclose(hvp(z1, v), expected, rtol=1e-4, atol=1e-5)


def test_the_sharded_loss_takes_a_hessian_vector_product():
  z1, z2 = _views()
  v = jax.random.normal(jax.random.key(3), z1.shape)
  mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
  fn = lambda a: losses.info_nce_on_mesh(a, z2, mesh=mesh, strategy="ring")  # noqa: E731
  expected = jax.jvp(jax.grad(lambda a: _dense("cross", a, z2)), (z1,), (v,))[1]
  hvp = jax.jit(lambda a, v: jax.jvp(jax.grad(fn), (a,), (v,))[1])
  np.testing.assert_allclose(hvp(z1, v), expected, rtol=1e-4, atol=1e-5)


FORWARD = {
    "jax.jvp": lambda f, x: jax.jvp(f, (x,), (jnp.ones_like(x),)),
    "jax.jacfwd": lambda f, x: jax.jacfwd(f)(x),
    "jit of jax.jvp": lambda f, x: jax.jit(lambda x: jax.jvp(f, (x,), (x,)))(x),
    "reverse over forward": lambda f, x: jax.grad(lambda x: jax.jvp(f, (x,), (x,))[1])(x),
}
NAMED = {
    "info_nce": lambda a, b: losses.info_nce(a, b, negatives="all"),
    "sigmoid_loss": lambda a, b: losses.sigmoid_loss(a, b),
    "supervised_info_nce(form='supcon')": lambda a, b: losses.supervised_info_nce(
        a, LABELS, form="supcon"),
    "info_nce_on_mesh": lambda a, b: losses.info_nce_on_mesh(
        a, b, mesh=jax.make_mesh((1,), ("data",))),
    "sigmoid_loss_on_mesh": lambda a, b: losses.sigmoid_loss_on_mesh(
        a, b, mesh=jax.make_mesh((1,), ("data",))),
}


@pytest.mark.parametrize("transform", list(FORWARD))
@pytest.mark.parametrize("loss", list(NAMED))
def test_forward_mode_is_refused_at_the_loss_naming_what_works(loss, transform):
  z1, z2 = _views()
  with pytest.raises(TypeError, match=r"cannot be differentiated in forward mode") as error:
    FORWARD[transform](lambda a: NAMED[loss](a, z2), z1)
  message = str(error.value)
  assert message.startswith(loss)
  assert "jax.hessian" in message and "jax.jvp(jax.grad(f), (x,), (v,))" in message


def test_the_dense_losses_take_forward_mode():
  # NT-Xent's supervised form and the softmax over dot products have no custom VJP.
  z1, z2 = _views()
  v = jnp.ones_like(z1)
  got = jax.jvp(lambda a: losses.supervised_info_nce(a, LABELS), (z1,), (v,))[1]
  assert np.isfinite(got)
  expected = jax.jvp(lambda a: jnp.mean(
      jax.nn.logsumexp(a @ z2.T, axis=1) - jnp.sum(a * z2, axis=1)), (z1,), (v,))[1]
  np.testing.assert_allclose(jax.jvp(lambda a: losses.dot_product_softmax(a, z2), (z1,), (v,))[1],
                             expected, rtol=1e-5)


def test_the_fused_kernels_refuse_second_derivatives_naming_the_xla_engine():
  z1, z2 = _views()
  fn = lambda a: losses.info_nce(a, z2, implementation="pallas")  # noqa: E731
  assert np.all(np.isfinite(jax.grad(fn)(z1)))   # first derivatives run
  for second in (jax.hessian, lambda f: jax.jacrev(jax.jacrev(f))):
    with pytest.raises(TypeError, match="first derivatives only") as error:
      second(fn)(z1)
    assert "implementation='xla'" in str(error.value)
