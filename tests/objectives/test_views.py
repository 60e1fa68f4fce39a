"""`tfcl_jax.objectives.views`: the two-view step against per-view calls and a NumPy reference."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfcl_jax.objectives import views


def test_encode_two_views_equals_one_call_per_view_for_a_per_example_network():
  weights = jax.random.normal(jax.random.key(0), (5, 3))
  view1 = jax.random.normal(jax.random.key(1), (4, 5))
  view2 = jax.random.normal(jax.random.key(2), (4, 5))
  calls = []

  def apply(x):
    calls.append(x.shape)
    return (jnp.tanh(x @ weights), x.sum(-1)), {"seen": x.shape[0]}

  (h1, s1), (h2, s2), aux = views.encode_two_views(apply, view1, view2)
  assert calls == [(8, 5)]  # one forward pass for both views
  assert aux == {"seen": 8}
  chex.assert_trees_all_close((h1, s1), (np.tanh(view1 @ weights), view1.sum(-1)), rtol=1e-6)
  chex.assert_trees_all_close((h2, s2), (np.tanh(view2 @ weights), view2.sum(-1)), rtol=1e-6)


def test_encode_two_views_batch_statistics_span_both_views():
  # A batch-normalising network sees the 2B views together, as SimCLR's BatchNorm does.
  view1, view2 = jnp.zeros((3, 2)), jnp.ones((3, 2))
  z1, z2, _ = views.encode_two_views(lambda x: (x - x.mean(0), None), view1, view2)
  np.testing.assert_allclose(z1, -0.5 * np.ones((3, 2)))
  np.testing.assert_allclose(z2, 0.5 * np.ones((3, 2)))


def test_encode_two_views_rejects_views_of_different_shapes():
  with pytest.raises(ValueError, match="view1 and view2 must have the same shape"):
    views.encode_two_views(lambda x: (x, None), jnp.zeros((3, 2)), jnp.zeros((4, 2)))


def test_cosine_diagnostics_matches_numpy():
  rng = np.random.default_rng(0)
  z1, z2 = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
  u1 = z1 / np.linalg.norm(z1, axis=1, keepdims=True)
  u2 = z2 / np.linalg.norm(z2, axis=1, keepdims=True)
  cos = u1 @ u2.T
  off_diagonal = cos[~np.eye(6, dtype=bool)]
  out = views.cosine_diagnostics(jnp.asarray(z1), jnp.asarray(z2))
  np.testing.assert_allclose(out["pos_cos"], np.diag(cos).mean(), rtol=1e-5)
  np.testing.assert_allclose(out["neg_cos"], off_diagonal.mean(), rtol=1e-5, atol=1e-7)


def test_the_simclr_objective_logs_the_scale_its_loss_solved():
  """`loss/scale`: the batch scale of the step's own projections (SimCLR, then SupCon's mean)."""
  import flax.linen as nn  # noqa: PLC0415

  from tfcl_jax import losses  # noqa: PLC0415
  from tfcl_jax.objectives import simclr  # noqa: PLC0415

  class Linear(nn.Module):
    @nn.compact
    def __call__(self, x, train):
      del train
      z = nn.Dense(4)(x)
      return z, z

  model = Linear()
  images = jax.random.normal(jax.random.key(0), (6, 3))
  views_of = lambda key, x: (x, x + 0.3 * jax.random.normal(key, x.shape))  # noqa: E731
  params = {"model": model.init(jax.random.key(1), images, train=False)["params"], "loss": {}}
  key = jax.random.key(2)
  z1, z2 = (model.apply({"params": params["model"]}, v, train=False)[1]
            for v in views_of(key, images))
  loss = losses.from_spec("perplexity_free")
  mapping = loss.mapping
  loss_fn = simclr.make_simclr_loss(model, loss=loss, augment=views_of)
  value, (_, metrics) = loss_fn(params, {}, {"image": images}, key, 0)
  want = losses.batch_scale(z1, z2, mapping=mapping, negatives="all")
  np.testing.assert_allclose(metrics["loss/scale"], jnp.mean(want), rtol=1e-6)
  np.testing.assert_allclose(value, losses.info_nce(z1, z2, mapping=mapping, negatives="all"),
                             rtol=1e-6)
  labels = jnp.array([0, 1, 0, 1, 2, 2])
  supcon_fn = simclr.make_simclr_loss(model, loss=loss, augment=views_of, form="supcon")
  _, (_, metrics) = supcon_fn(params, {}, {"image": images, "label": labels}, key, 0)
  want = losses.supervised_batch_scale(jnp.concatenate([z1, z2]),
                                       jnp.concatenate([labels, labels]), mapping=mapping)
  np.testing.assert_allclose(metrics["loss/scale"], jnp.mean(want), rtol=1e-6)
  _, (_, metrics) = simclr.make_simclr_loss(model, loss=losses.from_spec("free"), augment=views_of)(
      params, {}, {"image": images}, key, 0)
  assert "loss/scale" not in metrics
