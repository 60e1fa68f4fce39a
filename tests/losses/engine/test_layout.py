"""The rows the tiles take, per input dtype (`_layout`): half-precision inputs as raw rows whose
float32 norms scale each product, against float64 references written from the definitions.

The accuracy stated in docs/platforms.md: with bfloat16 and float16 inputs the loss is as
accurate as with float32 (relative error below 1e-6), the gradient within 1e-2 (bfloat16) and
5e-3 (float16) of the largest entry, for every mapping; rows keep their direction at every
scale and down to the norm floor.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import batch_scaled_reference as ref
from tests.helpers import dense_info_nce
from tests.helpers.marks import widest
from tfcl_jax import losses, mappings

MODES = {"cross": ("cross", False), "two-tower": ("cross", True), "all": ("all", False)}
LOSS_TOLERANCE = 1e-6
GRADIENT_TOLERANCE = {"bfloat16": 1e-2, "float16": 5e-3}
LEARNABLE = mappings.learnable_temperature(tau=0.07)
LEARNABLE_FREE = mappings.learnable_free(max_scale=100.0)
FIXED = {
    "tau=0.1": mappings.temperature(0.1),
    "free": mappings.temperature_free(),
    "learnable": LEARNABLE.bind(params=LEARNABLE.params),
    "learnable_free": LEARNABLE_FREE.bind(params=LEARNABLE_FREE.params),
    "dynamic=0.1:0.2": mappings.dynamic_temperature(0.1, 0.2),
    "anneal": mappings.from_spec("anneal=cosine:0.5:0.1:100").bind(step=jnp.int32(30)),
}
BATCH_SCALED = {"calibrated": mappings.calibrated_free(),
                "perplexity": mappings.perplexity_free(),
                "accuracy": mappings.accuracy_free()}


def _views(n=160, d=64, seed=0, noise=1.5):
  rng = np.random.default_rng(seed)
  z1 = rng.normal(size=(n, d)) * 3.0
  return z1, z1 + noise * rng.normal(size=(n, d))


def _dense_loss(z1, z2, logits_of, negatives, symmetric):
  """The summed InfoNCE from full logits, float64 (summed: float16's gradients of a mean would
  fall below its smallest number, as without loss scaling)."""
  return dense_info_nce.row_losses(z1, z2, logits_of, negatives, symmetric).sum()


def _errors(got, want):
  """(relative error of the loss, largest gradient error over the largest gradient entry)."""
  (value, grads), (want_value, want_grads) = got, want
  loss_error = abs(float(value) - float(want_value)) / abs(float(want_value))
  grad_error = max(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w))) / np.max(np.abs(w))
                   for g, w in zip(grads, want_grads, strict=True))
  return loss_error, grad_error


def _half_and_reference(dtype, loss, reference, views=None):
  """`loss` on half-precision views and `reference` (float64) on the same rounded values."""
  z1, z2 = _views() if views is None else views
  a, b = jnp.asarray(z1, dtype), jnp.asarray(z2, dtype)
  got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(a, b)
  assert got[1][0].dtype == jnp.dtype(dtype)  # gradients come back in the inputs' dtype
  assert got[0].dtype == jnp.float32
  with jax.enable_x64(True):
    want = jax.jit(jax.value_and_grad(reference, argnums=(0, 1)))(a.astype(jnp.float64),
                                                                  b.astype(jnp.float64))
  return _errors(got, want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("mode", widest(*sorted(MODES), quick=("all",)))
@pytest.mark.parametrize("name", widest(*sorted(FIXED), quick=("free", "learnable")))
def test_half_precision_loss_and_gradient_against_float64(dtype, mode, name):
  negatives, symmetric = MODES[mode]
  mapping = FIXED[name]
  loss_error, grad_error = _half_and_reference(
      dtype,
      lambda a, b: losses.info_nce(a, b, mapping=mapping, negatives=negatives,
                                   symmetric=symmetric, reduction="sum", block_size=64),
      lambda a, b: _dense_loss(a, b, mapping, negatives, symmetric))
  assert loss_error < LOSS_TOLERANCE
  assert grad_error < GRADIENT_TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", widest("bfloat16", "float16", quick=("bfloat16",)))
@pytest.mark.parametrize("mode", widest("cross", "all", quick=("all",)))
@pytest.mark.parametrize("name", widest(*sorted(BATCH_SCALED), quick=("calibrated",)))
def test_half_precision_batch_scaled_mappings_against_float64(dtype, mode, name):
  """The scale is solved on the half-precision batch's own cosines; the reference's on the same
  rounded inputs in float64 (`batch_scaled_reference`), each held constant."""
  mapping = BATCH_SCALED[name]
  negatives = "all" if mode == "all" else "cross"

  # Harder pairs: no scale at its cap, no zero loss; 192 anchors over three tiles a side.
  z1, z2 = views = _views(n=96, noise=6.0)
  with jax.enable_x64(True):
    rounded = (jnp.asarray(z, dtype).astype(jnp.float64) for z in (z1, z2))
    scale = ref.solve(name, ref.dense(*rounded, mode=mode))

  def reference(a, b):
    dense = ref.dense(a, b, mode=mode)
    return ref.info_nce(dense, scale, masked=False) * dense.valid.shape[0]

  loss_error, grad_error = _half_and_reference(
      dtype, lambda a, b: losses.info_nce(a, b, mapping=mapping, negatives=negatives,
                                          reduction="sum", block_size=64), reference, views)
  assert loss_error < 1e-3  # the solved scales agree to the grid's 1e-3
  assert grad_error < 2 * GRADIENT_TOLERANCE[dtype]  # and the scales move the gradient too


@pytest.mark.parametrize("dtype", widest("bfloat16", "float16", quick=("float16",)))
def test_sigmoid_and_supcon_in_half_precision_against_float64(dtype):
  z1, z2 = _views(seed=3)
  labels = np.arange(z1.shape[0]) % 7
  sigmoid = _half_and_reference(
      dtype, lambda a, b: losses.sigmoid_loss(a, b, reduction="sum", block_size=64),
      lambda a, b: ref.sigmoid(ref.dense(a, b), 1.0, 0.0) * a.shape[0])
  free = mappings.temperature_free()

  def supcon_reference(a, b):
    u = jnp.concatenate([a, b])
    u = u / jnp.linalg.norm(u, axis=1, keepdims=True)
    both = np.concatenate([labels, labels])
    itself = jnp.eye(u.shape[0], dtype=bool)
    logits = jnp.where(itself, 0.0, free(jnp.where(itself, 0.0, u @ u.T)))
    lse = jax.nn.logsumexp(jnp.where(itself, -jnp.inf, logits), axis=1)
    positives = (both[:, None] == both[None, :]) & ~np.eye(u.shape[0], dtype=bool)
    mean_positive = jnp.sum(jnp.where(positives, logits, 0.0), 1) / positives.sum(1)
    return jnp.mean(lse - mean_positive)

  supcon = _half_and_reference(
      dtype, lambda a, b: losses.supervised_info_nce(
          jnp.concatenate([a, b]), np.concatenate([labels, labels]), form="supcon",
          block_size=64), supcon_reference)
  for loss_error, grad_error in (sigmoid, supcon):
    assert loss_error < LOSS_TOLERANCE
    assert grad_error < GRADIENT_TOLERANCE[dtype] * (50 if dtype == "float16" else 1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_rows_keep_their_direction_at_every_scale_the_dtype_holds(dtype):
  z1, z2 = _views(n=32, d=16)
  info = jnp.finfo(dtype)
  loss = jax.jit(lambda a, b: losses.info_nce(a, b, negatives="all"))
  base = loss(jnp.asarray(z1, jnp.float32), jnp.asarray(z2, jnp.float32))
  smallest = max(float(info.tiny), losses.norm_floor(dtype)) * 64  # rows above the norm floor
  for scale in (smallest, 3e-3, 1.0, float(info.max) / 64):
    # Powers of two times each view: the same rows in every dtype, up to its rounding.
    factor = 2.0 ** np.round(np.log2(scale) - np.log2(np.abs(z1).max()))
    a = jnp.asarray(z1 * factor, dtype)
    b = jnp.asarray(z2 * factor, dtype)
    got = loss(a, b)
    want = loss(a.astype(jnp.float32) / factor, b.astype(jnp.float32) / factor)
    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{dtype} at {scale:g}")
  assert np.isfinite(base)


def test_float16_rows_of_small_norm_are_not_shrunk_toward_zero():
  """Norms in float32: a float16 row of norm 3e-3 keeps its direction (the floor is float16's
  smallest normal number, `losses.norm_floor`); only rows made of subnormal entries shrink."""
  z1, z2 = _views(n=16, d=8, seed=7)
  small = 3e-3 / np.linalg.norm(z1, axis=1, keepdims=True)
  loss = jax.jit(losses.info_nce)
  got = loss(jnp.asarray(z1 * small, jnp.float16), jnp.asarray(z2, jnp.float16))
  want = loss(jnp.asarray(z1 * small, jnp.float16).astype(jnp.float32),
              jnp.asarray(z2, jnp.float16).astype(jnp.float32))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert losses.norm_floor("float16") == float(jnp.finfo(jnp.float16).smallest_normal)


def test_zero_rows_have_cosine_zero_and_a_finite_gradient_in_every_dtype():
  z1, z2 = _views(n=8, d=4, seed=2)
  z1[3] = 0.0
  for dtype in ("bfloat16", "float16", "float32"):
    value, grads = jax.jit(jax.value_and_grad(
        lambda a, b: losses.info_nce(a, b, negatives="all"), argnums=(0, 1)))(
            jnp.asarray(z1, dtype), jnp.asarray(z2, dtype))
    assert np.isfinite(float(value))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads), dtype
