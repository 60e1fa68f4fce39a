"""A mapping and a loss family added from outside the package, through the spec registries alone:
the parser, the errors and every engine mode of InfoNCE take them, checked against NumPy, and
unregistering them takes them away again."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from tests.helpers.marks import widest
from tfcl_jax import losses, mappings, specs


def cubic(*, k: float, spec: str) -> mappings.Mapping:
  """`k cos^3`: a mapping the package does not have."""
  return mappings.Mapping(spec, lambda cos, params, step: k * cos ** 3)


@dataclasses.dataclass(frozen=True)
class WeightedInfoNCE(losses.Loss):
  """`weight` times InfoNCE under a mapping, on one device or on a `mesh` (a family the package
  does not have)."""

  spec: str
  mapping: mappings.Mapping
  weight: float = 1.0

  def compute(self, z1, z2, *, params, step, log_q, mesh=None, **kwargs):
    del log_q
    mapping = self.bound_mapping(params, step)
    if mesh is None:
      return self.weight * losses.info_nce(z1, z2, mapping=mapping, **kwargs)
    return self.weight * losses.info_nce_on_mesh(z1, z2, mesh=mesh, mapping=mapping, **kwargs)


@pytest.fixture
def registered():
  forms = [
      mappings.SPECS.register("cubic=K", cubic, named=True, K=specs.Positive("k"),
                              help="K cos^3"),
      losses.SPECS.register("weighted:<mapping>[/w=W]", WeightedInfoNCE,
                            W=specs.Positive("weight"), help="W times InfoNCE (W default 1)"),
  ]
  yield
  mappings.SPECS.unregister(forms[0])
  losses.SPECS.unregister(forms[1])


def _unit(z):
  z = np.asarray(z, np.float64)
  return z / np.linalg.norm(z, axis=1, keepdims=True)


def _info_nce(z1, z2, k, negatives, symmetric):
  """InfoNCE under `k cos^3` in NumPy: each row's logsumexp over its candidates minus its
  positive's logit, averaged."""
  def rows(logits, positives, excluded=None):
    if excluded is not None:
      logits = np.where(excluded, -np.inf, logits)
    top = logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return lse - logits[np.arange(len(logits)), positives]

  u1, u2 = _unit(z1), _unit(z2)
  n = len(u1)
  if negatives == "all":
    u = np.concatenate([u1, u2])
    positives = (np.arange(2 * n) + n) % (2 * n)
    return rows(k * (u @ u.T) ** 3, positives, np.eye(2 * n, dtype=bool)).mean()
  forward = rows(k * (u1 @ u2.T) ** 3, np.arange(n)).mean()
  if not symmetric:
    return forward
  return (forward + rows(k * (u2 @ u1.T) ** 3, np.arange(n)).mean()) / 2


def _views(n=8, d=6):
  z1 = jax.random.normal(jax.random.key(0), (n, d))
  return z1, z1 + 0.3 * jax.random.normal(jax.random.key(1), (n, d))


def _mesh():
  return jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])


def test_the_parser_takes_them(registered):
  assert losses.canonical_spec(" weighted: cubic = 2.0 / w = 0.50 ") == "weighted:cubic=2/w=0.5"
  assert losses.canonical_spec("clip:cubic=2") == "clip:cubic=2"
  assert mappings.from_spec("cubic=2.0").spec == "cubic=2"
  loss = losses.from_spec("weighted:free_n/w=2", num_candidates=15)
  assert isinstance(loss, WeightedInfoNCE) and loss.weight == 2.0
  assert loss.mapping.spec == "free_n=15"
  assert any(line.startswith("cubic=K") for line in mappings.SPEC_FORMS)
  with pytest.raises(ValueError, match="did you mean 'cubic'") as error:
    losses.from_spec("weighted:cubik=2")
  assert "weighted:<mapping>[/w=W]" in str(error.value)  # listed with the package's forms
  with pytest.raises(ValueError, match="k must be a finite number > 0"):
    losses.from_spec("cubic=0")


MODES = {
    "cross": {"negatives": "cross"},
    "all": {"negatives": "all"},
    "symmetric": {"negatives": "cross", "symmetric": True},
    "cross pallas": {"negatives": "cross", "implementation": "pallas"},
    "all pallas": {"negatives": "all", "implementation": "pallas"},
    "cross gathered": {"negatives": "cross", "mesh": "mesh", "strategy": "all_gather"},
    "all ring": {"negatives": "all", "mesh": "mesh", "strategy": "ring"},
}


@pytest.mark.parametrize("mode", widest(*MODES, quick=("cross", "all", "symmetric", "all pallas",
                                                       "cross gathered")))
def test_every_engine_mode_takes_them(registered, mode):
  z1, z2 = _views()
  kwargs = dict(MODES[mode])
  if kwargs.get("mesh"):
    kwargs["mesh"] = _mesh()
  reference = _info_nce(z1, z2, 2.0, kwargs["negatives"], kwargs.get("symmetric", False))
  weighted = losses.from_spec("weighted:cubic=2/w=0.5")
  np.testing.assert_allclose(weighted(z1, z2, **kwargs), 0.5 * reference, rtol=1e-5)
  if "mesh" in kwargs:
    return  # values only: the sharded gradients are checked against one device in their tests
  np.testing.assert_allclose(losses.info_nce(z1, z2, mapping="cubic=2", **kwargs), reference,
                             rtol=1e-5)
  gradient = jax.grad(lambda z: weighted(z, z2, **kwargs))(z1)
  assert np.all(np.isfinite(gradient))


def test_without_them_the_parser_refuses_them():
  # Registered in the tests above, unregistered after each: the registries are as they were.
  with pytest.raises(ValueError, match="no mapping is named 'cubic'"):
    mappings.from_spec("cubic=2")
  with pytest.raises(ValueError, match="no mapping is named 'weighted'"):
    losses.from_spec("weighted:free")
  assert not any(line.startswith("cubic") for line in mappings.SPEC_FORMS)
