"""`losses.from_spec`: parsing every form of the grammar (docs/specs.md), the bias inits, and the
call against the losses it names."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfcl_jax import losses, mappings


@pytest.mark.parametrize("text, family, mapping, bias, learn", [
    ("free", losses.InfoNCELoss, "free", 0.0, False),
    (" tau = 0.5 ", losses.InfoNCELoss, "tau=0.5", 0.0, False),
    ("sigmoid/free", losses.SigmoidLoss, "free", 0.0, False),
    ("sigmoid/tau=1/b=-2.5", losses.SigmoidLoss, "tau=1", -2.5, False),
    ("sigmoid/free/learn_b=0", losses.SigmoidLoss, "free", 0.0, True),
    ("sigmoid/learnable=0.1/learn_b=siglip", losses.SigmoidLoss, "learnable=0.1", -10.0, True),
    ("sigmoid/tau=0.1/learn_b=prior", losses.SigmoidLoss, "tau=0.1", math.log(1 / 99), True),
])
def test_parse(text, family, mapping, bias, learn):
  spec = losses.from_spec(text, num_candidates=100)
  assert type(spec) is family and spec.mapping.spec == mapping
  assert getattr(spec, "learn_bias", False) == learn
  np.testing.assert_allclose(getattr(spec, "bias", 0.0), bias, rtol=1e-12)
  again = losses.from_spec(spec.spec, num_candidates=100)  # the canonical spec round-trips
  assert (again.spec, again.mapping.spec, getattr(again, "bias", 0.0)) == (
      spec.spec, spec.mapping.spec, getattr(spec, "bias", 0.0))
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
    ("tau=0.1/b=1", "'/' belongs to sigmoid/<mapping>[/b=INIT], sigmoid/<mapping>/learn_b=INIT"),
    ("dot/free", "expected dot[+logq]; '/' belongs to sigmoid/<mapping>"),
    ("sigmoid", "expected sigmoid/<mapping>[/b=INIT] or sigmoid/<mapping>/learn_b=INIT"),
    ("sigmoid/free/c=1", "expected sigmoid/<mapping>[/b=INIT] or sigmoid/<mapping>/learn_b=INIT"),
    ("sigmoid/free/b=x", "INIT is a number, siglip or prior"),
    ("sigmoid/free/b=nan", "INIT is a number, siglip or prior"),
    ("sigmoid/tau=0.1/learn_b=prior", "a prior bias needs num_candidates"),
    ("sigmoid/free_n/learn_b=prior", "the mapping 'free_n' and a prior bias need num_candidates"),
    ("sigmoid/tau=-1", "tau must be a finite number > 0, got -1.0"),
    ("sigmoid/free/b=1/c", "expected sigmoid/<mapping>"),
    ("sigmod/free", "did you mean 'sigmoid'?"),
    ("+logq", "nothing precedes +logq"),
])
def test_bad_specs_name_the_problem(text, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    losses.from_spec(text)


def test_not_a_string():
  with pytest.raises(TypeError, match="loss spec must be a str"):
    losses.from_spec(0.1)


# The canonical specs that committed result tables are keyed by, and spellings of them.
CANONICAL = [
    ("free", "free"),
    (" tau = 0.50 ", "tau=0.5"),
    ("learnable", "learnable=0.07"),
    ("learnable=0.070:100", "learnable=0.07:100"),
    ("dynamic=0.10:0.2", "dynamic=0.1:0.2"),
    ("anneal=cosine:0.50:0.1:1000", "anneal=cosine:0.5:0.1:1000"),
    ("sigmoid/learnable=0.1/learn_b=siglip", "sigmoid/learnable=0.1/learn_b=siglip"),
    ("sigmoid/free/learn_b=prior", "sigmoid/free/learn_b=prior"),
    ("clip:learnable=0.07:100", "clip:learnable=0.07:100"),
    ("clip: free", "clip:free"),
    ("dot", "dot"),
    ("dot + logq", "dot+logq"),
    ("free+logq", "free+logq"),
    ("tau=0.10+logq", "tau=0.1+logq"),
]


@pytest.mark.parametrize("text, canonical", CANONICAL)
def test_canonical_spec_is_the_built_spec(text, canonical):
  assert losses.canonical_spec(text) == canonical
  loss = losses.from_spec(text, num_candidates=8)
  assert loss.spec == canonical
  assert losses.from_spec(loss.spec, num_candidates=8).spec == canonical  # round trip
  if loss.mapping is not None:  # the mapping part of the spec is the mapping's own spec
    assert loss.mapping.spec in canonical


def test_canonical_spec_builds_no_map(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("canonical_spec built a Mapping")

  monkeypatch.setattr(mappings.Mapping, "__init__", refuse)
  assert [losses.canonical_spec(text) for text, _ in CANONICAL] == [c for _, c in CANONICAL]


@pytest.mark.parametrize("text, family, symmetric, logq, params", [
    ("clip:learnable=0.07:100", losses.InfoNCELoss, True, False, ["t"]),
    ("tau=0.1+logq", losses.InfoNCELoss, False, True, []),
    ("dot", losses.DotProductLoss, False, False, []),
    ("dot+logq", losses.DotProductLoss, False, True, []),
])
def test_parse_retrieval_forms(text, family, symmetric, logq, params):
  loss = losses.from_spec(text)
  assert type(loss) is family
  assert (getattr(loss, "symmetric", False), loss.logq, sorted(loss.params)) == (
      symmetric, logq, params)
  assert loss.scores_cosines == (family is not losses.DotProductLoss)
  assert (loss.mapping is None) == (family is losses.DotProductLoss)
  assert loss.supervised_form == (family is losses.InfoNCELoss and not (symmetric or logq))
  assert loss.softmax  # each anchor's candidates in one softmax; the sigmoid loss's pairs are not
  assert not losses.from_spec("sigmoid/free").softmax


def _unit(z):
  z = np.asarray(z, np.float64)
  return z / np.linalg.norm(z, axis=1, keepdims=True)


def _cross_entropy(logits):
  """Per-row `-log softmax(logits)[i, i]`, in NumPy."""
  top = logits.max(axis=1, keepdims=True)
  lse = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
  return lse - np.diagonal(logits)


def test_call_of_the_retrieval_forms():
  z1 = jax.random.normal(jax.random.key(0), (6, 5))
  z2 = z1 + 0.5 * jax.random.normal(jax.random.key(1), (6, 5))
  log_q = np.log(np.linspace(0.05, 0.3, 6))
  cosines = _unit(z1) @ _unit(z2).T
  clip = losses.from_spec("clip:tau=0.5")
  both = (_cross_entropy(cosines / 0.5).mean() + _cross_entropy(cosines.T / 0.5).mean()) / 2
  np.testing.assert_allclose(clip(z1, z2), both, rtol=1e-5)
  corrected = losses.from_spec("tau=0.5+logq")
  np.testing.assert_allclose(corrected(z1, z2, log_q=log_q),
                             _cross_entropy(cosines / 0.5 - log_q[None, :]).mean(), rtol=1e-5)
  dots = np.asarray(z1, np.float64) @ np.asarray(z2, np.float64).T
  np.testing.assert_allclose(losses.from_spec("dot")(z1, z2, reduction="sum"),
                             _cross_entropy(dots).sum(), rtol=1e-5)
  np.testing.assert_allclose(losses.from_spec("dot+logq")(z1, z2, log_q=log_q),
                             _cross_entropy(dots - log_q[None, :]).mean(), rtol=1e-5)


def test_call_checks_log_q_and_negatives():
  z = jax.random.normal(jax.random.key(0), (4, 3))
  with pytest.raises(ValueError, match="needs log_q"):
    losses.from_spec("free+logq")(z, z)
  with pytest.raises(ValueError, match="has none"):
    losses.from_spec("free")(z, z, log_q=jnp.zeros(4))
  with pytest.raises(ValueError, match="negatives must be 'cross'"):
    losses.from_spec("dot")(z, z, negatives="all")


@pytest.mark.parametrize("text, message", [
    ("clip:sigmoid/free", "expected clip:<mapping>[+logq]; '/' belongs to sigmoid/<mapping>"),
    ("sigmoid/free+logq", "sigmoid/<mapping>[/b=INIT] (sigmoid loss, scoring both directions"),
    ("clip:dot", "'dot' is not a mapping spec: no mapping is named 'dot'"),
    ("tua=1", "no mapping is named 'tua'; did you mean 'tau'?\nAccepted forms"),
    ("tua=1", "where <mapping> is a mapping spec"),
])
def test_bad_retrieval_forms_name_the_problem(text, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    losses.canonical_spec(text)


@pytest.mark.parametrize("make, error, message", [
    (lambda: losses.InfoNCELoss("x", None), TypeError, "mapping of InfoNCELoss must be"),
    (lambda: losses.SigmoidLoss("x", "free"), TypeError, "mapping of SigmoidLoss must be"),
    # What belongs to one family is no field of another.
    (lambda: losses.InfoNCELoss("x", mappings.temperature_free(), bias=1.0), TypeError, "bias"),
    (lambda: losses.SigmoidLoss("x", mappings.temperature_free(), symmetric=True), TypeError,
     "symmetric"),
    (lambda: losses.DotProductLoss("x", mapping=mappings.temperature_free()), TypeError,
     "mapping"),
    (lambda: losses.Loss(), TypeError, "abstract"),
])
def test_loss_fields_are_checked(make, error, message):
  with pytest.raises(error, match=message):
    make()
