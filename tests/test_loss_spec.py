"""`losses.from_spec`: parsing, the bias inits, and the call against the losses it names."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfcl_jax import losses, mappings


@pytest.mark.parametrize("text, loss, mapping, bias, learn", [
    ("free", "info_nce", "free", 0.0, False),
    (" tau = 0.5 ", "info_nce", "tau=0.5", 0.0, False),
    ("sigmoid/free", "sigmoid", "free", 0.0, False),
    ("sigmoid/tau=1/b=-2.5", "sigmoid", "tau=1", -2.5, False),
    ("sigmoid/free/learn_b=0", "sigmoid", "free", 0.0, True),
    ("sigmoid/learnable=0.1/learn_b=siglip", "sigmoid", "learnable=0.1", -10.0, True),
    ("sigmoid/tau=0.1/learn_b=prior", "sigmoid", "tau=0.1", math.log(1 / 99), True),
])
def test_parse(text, loss, mapping, bias, learn):
  spec = losses.from_spec(text, num_candidates=100)
  assert (spec.loss, spec.mapping.spec, spec.learn_bias) == (loss, mapping, learn)
  np.testing.assert_allclose(spec.bias, bias, rtol=1e-12)
  again = losses.from_spec(spec.spec, num_candidates=100)  # the canonical spec round-trips
  assert (again.spec, again.mapping.spec, again.bias, again.learn_bias) == (
      spec.spec, spec.mapping.spec, spec.bias, spec.learn_bias)
  assert ("bias" in spec.params) == learn


def test_call_is_the_named_loss():
  z1 = jax.random.normal(jax.random.key(0), (12, 6))
  z2 = z1 + 0.3 * jax.random.normal(jax.random.key(1), (12, 6))
  nce = losses.from_spec("tau=0.5")(z1, z2, negatives="all")
  np.testing.assert_allclose(
      nce, losses.info_nce(z1, z2, mapping=mappings.temperature(0.5), negatives="all"),
      rtol=1e-6)
  spec = losses.from_spec("sigmoid/learnable=0.1/learn_b=siglip")
  params = {"t": jnp.float32(0.7), "bias": jnp.float32(-1.25)}
  # SigLIP with negatives "cross" in NumPy: -sum_j log sigmoid(l_ij (exp(t) c_ij + b)) / N.
  u1 = np.asarray(z1, np.float64) / np.linalg.norm(z1, axis=1, keepdims=True)
  u2 = np.asarray(z2, np.float64) / np.linalg.norm(z2, axis=1, keepdims=True)
  labels = 2 * np.eye(12) - 1
  reference = np.logaddexp(0, -labels * (np.exp(0.7) * u1 @ u2.T - 1.25)).sum() / 12
  np.testing.assert_allclose(spec(z1, z2, params=params), reference, rtol=1e-5)
  grads = jax.grad(lambda p: spec(z1, z2, params=p))(params)
  eps = 1e-5
  shifted = [np.logaddexp(0, -labels * (np.exp(0.7) * u1 @ u2.T - 1.25 + s)).sum() / 12
             for s in (eps, -eps)]
  np.testing.assert_allclose(grads["bias"], (shifted[0] - shifted[1]) / (2 * eps), rtol=1e-4)


@pytest.mark.parametrize("text, message", [
    ("tau=0.1/b=1", "only a sigmoid loss"),
    ("sigmoid", "expected sigmoid/<mapping>"),
    ("sigmoid/free/c=1", "not b=<init> or learn_b=<init>"),
    ("sigmoid/free/b=x", "not a number"),
    ("sigmoid/tau=0.1/learn_b=prior", "needs num_candidates"),
    ("sigmoid/tau=-1", "tau"),
    ("sigmoid/free/b=1/c", "expected sigmoid/<mapping>"),
])
def test_bad_specs_name_the_problem(text, message):
  with pytest.raises(ValueError, match=message):
    losses.from_spec(text)


def test_not_a_string():
  with pytest.raises(TypeError, match="loss spec must be a str"):
    losses.from_spec(0.1)
