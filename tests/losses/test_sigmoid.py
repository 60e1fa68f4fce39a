"""The sigmoid (SigLIP) loss against NumPy transcriptions of big_vision's and open_clip's
formulas, dense autodiff, the closed form of Eq. 11, 8 devices, edge cases and bad input."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import edge_views
from tests.helpers.marks import widest
from tfcl_jax import losses, mappings

DTYPES = (jnp.float64, jnp.float32, jnp.bfloat16, jnp.float16)


def _log_sigmoid(x):
  return -np.logaddexp(0.0, -x)


def _unit(z):
  return z / np.linalg.norm(z, axis=1, keepdims=True)


def big_vision_siglip(zimg, ztxt, t, b):
  """big_vision `trainers/proj/image_text/siglip.py`: logits = z_img z_txt^T e^t + b,
  labels 2 I - 1, loss = mean over images of -sum_j log_sigmoid(labels * logits)."""
  logits = _unit(zimg) @ _unit(ztxt).T * np.exp(t) + b
  labels = 2.0 * np.eye(len(zimg)) - 1.0
  return np.mean(-np.sum(_log_sigmoid(labels * logits), axis=-1))


def open_clip_siglip(zimg, ztxt, logit_scale, logit_bias, world_size):
  """open_clip `SigLipLoss` with its bidirectional neighbour exchange: each rank scores its
  images against its own texts (labels 2 I - 1) and every other rank's (labels -1),
  sum / local batch; the ranks' losses are averaged (DDP averages their gradients)."""
  img, txt = np.split(_unit(zimg), world_size), np.split(_unit(ztxt), world_size)
  per_rank = []
  for rank in range(world_size):
    def part(texts, negative_only, rank=rank):
      logits = logit_scale * img[rank] @ texts.T + logit_bias
      labels = -np.ones_like(logits) if negative_only else 2 * np.eye(len(texts)) - 1
      return -np.sum(_log_sigmoid(labels * logits)) / len(img[rank])
    loss = part(txt[rank], False)
    for hop in range(1, world_size):  # texts arriving from the neighbours
      loss += part(txt[(rank - hop) % world_size], True)
    per_rank.append(loss)
  return np.mean(per_rank)


def _pair(n=12, d=6, seed=0):
  rng = np.random.default_rng(seed)
  z1 = rng.normal(size=(n, d))
  return z1, z1 + 0.6 * rng.normal(size=(n, d))


def test_equals_big_vision_and_open_clip_transcriptions():
  z1, z2 = _pair()
  t, b = np.log(10.0), -10.0  # SigLIP's init
  with jax.enable_x64(True):
    for t_value, b_value in ((t, b), (1.0, -2.0)):
      scaled = mappings.learnable_temperature(t=t_value)
      ours = losses.sigmoid_loss(z1, z2, mapping=scaled.bind(params=scaled.params),
                                 bias=b_value, block_size=5)
      expected = big_vision_siglip(z1, z2, t_value, b_value)
      np.testing.assert_allclose(ours, expected, rtol=1e-12)
      np.testing.assert_allclose(
          open_clip_siglip(z1, z2, np.exp(t_value), b_value, world_size=4), expected, rtol=1e-12)


def _dense_reference(z1, z2, logits_of, bias, negatives):
  """Mean over anchors of -sum_j log_sigmoid(l_ij (f(c_ij) + b)), dense, for autodiff."""
  unit = lambda z: z / jnp.linalg.norm(z, axis=1, keepdims=True)  # noqa: E731
  n = z1.shape[0]
  if negatives == "cross":
    logits = logits_of(unit(z1) @ unit(z2).T) + bias
    return jnp.mean(-jnp.sum(jax.nn.log_sigmoid((2 * jnp.eye(n) - 1) * logits), axis=1))
  u = jnp.concatenate([unit(z1), unit(z2)])
  index = jnp.arange(2 * n)
  labels = jnp.full((2 * n, 2 * n), -1.0).at[index, (index + n) % (2 * n)].set(1.0)
  self_pairs = jnp.eye(2 * n, dtype=bool)
  logits = logits_of(jnp.where(self_pairs, 0.0, u @ u.T)) + bias
  terms = jnp.where(self_pairs, 0.0, -jax.nn.log_sigmoid(labels * logits))
  return jnp.mean(jnp.sum(terms, axis=1))


@pytest.mark.parametrize("negatives", widest("cross", "all", quick=("all",)))
def test_values_and_gradients_equal_dense_autodiff_for_every_mapping(negatives):
  z1, z2 = _pair(9, 5, seed=1)
  maps = {"free": lambda c, t: jnp.log1p(c) - jnp.log1p(-c), "tau=0.1": lambda c, t: c / 0.1,
          "learnable": lambda c, t: jnp.exp(t) * c,
          "dynamic=0.1:0.2": lambda c, t: c / jax.lax.stop_gradient(
              0.1 + 0.05 * (1 + jnp.cos(jnp.pi * (1 + c))))}
  with jax.enable_x64(True):
    @functools.partial(jax.jit, static_argnums=4)
    def run(z1, z2, t, b, fixed_zero_bias):
      out = {}
      for spec, logits_of in maps.items():
        def ours(a, c, t, b, spec=spec):
          mapping = (mappings.learnable_temperature(t=t) if spec == "learnable"
                     else mappings.from_spec(spec))
          return losses.sigmoid_loss(a, c, mapping=mapping, negatives=negatives, block_size=4,
                                     bias=0.0 if fixed_zero_bias else b)

        def reference(a, c, t, b, logits_of=logits_of):
          return _dense_reference(a, c, lambda x: logits_of(x, t), 0.0 if fixed_zero_bias else b,
                                  negatives)

        out[spec] = (jax.value_and_grad(ours, argnums=(0, 1, 2, 3))(z1, z2, t, b),
                     jax.value_and_grad(reference, argnums=(0, 1, 2, 3))(z1, z2, t, b))
      return out

    for fixed in (True, False):  # b = 0 takes Eq. 11's closed form; a traced b the generic path
      for spec, (got, expected) in run(z1, z2, 1.3, -2.0, fixed).items():
        chex.assert_trees_all_close(got, expected, rtol=1e-9, atol=1e-12,
                                    custom_message=f"{spec} fixed={fixed}")


def test_free_map_closed_form_and_relative_bias():
  z1, z2 = _pair(7, 4, seed=2)
  c = _unit(z1) @ _unit(z2).T
  # Eq. 11: sigmoid(2 artanh c) = (1 + c)/2, so L_i = -sum_j log((1 + l_ij c_ij) / 2).
  labels = 2 * np.eye(7) - 1
  expected = -np.log((1 + labels * c) / 2).sum(axis=1)
  with jax.enable_x64(True):
    rows = losses.sigmoid_loss(z1, z2, reduction="none")
    np.testing.assert_allclose(rows, expected, rtol=1e-12)
    # Relative bias: T (c - r) for f = T c.
    relative = losses.sigmoid_loss(z1, z2, mapping=mappings.temperature(0.1), relative_bias=0.3)
    np.testing.assert_allclose(relative, big_vision_siglip(z1, z2, np.log(10.0), -3.0),
                               rtol=1e-12)


def test_where_equals_valid_subset():
  z1, z2 = (x.astype(np.float32) for x in _pair(10, 4, seed=3))
  where = np.array([1, 1, 0, 1, 0, 1, 1, 1, 0, 1], bool)
  loss = jax.jit(losses.sigmoid_loss, static_argnames="negatives")
  for negatives in ("cross", "all"):
    for bias in (0.0, -1.5):
      masked = loss(z1, z2, bias=bias, negatives=negatives, where=where)
      subset = loss(z1[where], z2[where], bias=bias, negatives=negatives)
      np.testing.assert_allclose(masked, subset, rtol=1e-5)


@pytest.mark.parametrize("dtype", widest(*DTYPES, quick=(jnp.float32, jnp.bfloat16)),
                         ids=[jnp.dtype(dtype).name for dtype in DTYPES])
def test_finite_at_cos_plus_minus_one_and_zero_vectors(dtype):
  with jax.enable_x64(True):
    z1, z2 = edge_views.stacked(dtype)

    @jax.jit
    def run(z1, z2):
      out = []
      for spec, bias in (("free", 0.0), ("free", -10.0), ("learnable", -10.0)):
        for negatives in ("cross", "all"):
          def loss(a, c, spec=spec, bias=bias, negatives=negatives):
            mapping = mappings.from_spec(spec)   # held at its initial params
            return losses.sigmoid_loss(a, c, mapping=mapping.bind(params=mapping.params),
                                       bias=bias, negatives=negatives)
          out.append(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1)))(z1, z2))
      return out

    chex.assert_tree_all_finite(run(z1, z2))


@pytest.mark.parametrize("strategy", ["ring", "all_gather"])
def test_eight_devices_equal_one(strategy):
  z1, z2 = (jnp.asarray(x, jnp.float32) for x in _pair(16, 4, seed=4))
  where = jnp.asarray(np.random.default_rng(5).random(16) > 0.3)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))

  @jax.jit
  def run(z1, z2, t, b):
    out = {}
    for negatives in ("cross", "all"):
      kwargs = dict(negatives=negatives, where=where)

      def single(a, c, t, b, kwargs=kwargs):
        return losses.sigmoid_loss(a, c, mapping=mappings.learnable_temperature(t=t), bias=b,
                                   **kwargs)

      def sharded(a, c, t, b, kwargs=kwargs):
        return losses.sigmoid_loss_on_mesh(a, c, mesh=mesh, strategy=strategy, block_size=3,
                                           mapping=mappings.learnable_temperature(t=t), bias=b,
                                           **kwargs)

      out[negatives] = [jax.value_and_grad(f, argnums=(0, 1, 2, 3))(z1, z2, t, b)
                        for f in (single, sharded)]
    return out

  for single, sharded in run(z1, z2, 1.2, jnp.float32(-2.0)).values():
    chex.assert_trees_all_close(sharded, single, atol=1e-5, rtol=1e-5)


def test_bias_inits():
  assert losses.sigmoid_bias_init() == -10.0
  np.testing.assert_allclose(losses.sigmoid_bias_init("prior", num_candidates=512),
                             np.log((1 / 512) / (1 - 1 / 512)))


def test_bad_input():
  z = np.ones((4, 3), np.float32)
  with pytest.raises(ValueError, match=r"bias must be a scalar \(shape \(\)\), got shape \(2,\)"):
    losses.sigmoid_loss(z, z, bias=jnp.zeros(2))
  with pytest.raises(TypeError, match="bias must be a float or a float scalar array"):
    losses.sigmoid_loss(z, z, bias=jnp.array(1))
  with pytest.raises(TypeError, match="bias"):
    losses.sigmoid_loss(z, z, bias=True)
  with pytest.raises(ValueError, match="give bias or relative_bias, not both"):
    losses.sigmoid_loss(z, z, bias=-1.0, relative_bias=0.2)
  with pytest.raises(ValueError, match="negatives"):
    losses.sigmoid_loss(z, z, negatives="cros")
  with pytest.raises(ValueError, match="reduction"):
    losses.sigmoid_loss(z, z, reduction="avg")
  with pytest.raises(ValueError, match="kind"):
    losses.sigmoid_bias_init("zero")
  with pytest.raises(TypeError, match="num_candidates"):
    losses.sigmoid_bias_init("prior")
  with pytest.raises(ValueError, match="axis_name 'data' is not bound: call sharded_sigmoid"):
    losses.sharded_sigmoid_loss(z, z)
