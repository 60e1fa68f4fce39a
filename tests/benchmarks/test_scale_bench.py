"""benchmarks/scale_bench.py measures the loss it names: `--loss` picks `info_nce` or
`sigmoid_loss`, both against a dense NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import scale_bench


def _unit(x):
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def _numpy_losses(z1, z2, tau):
  """NT-Xent (`negatives="all"`) and the sigmoid loss (`"all"`, b = 0) of `cos / tau`."""
  u = _unit(np.concatenate([z1, z2]))
  n = len(z1)
  logits = u @ u.T / tau
  positive = (np.arange(2 * n) + n) % (2 * n)
  off = ~np.eye(2 * n, dtype=bool)
  lse = np.log(np.sum(np.where(off, np.exp(logits), 0.0), axis=1))
  nt_xent = np.mean(lse - logits[np.arange(2 * n), positive])
  sign = -np.ones((2 * n, 2 * n))
  sign[np.arange(2 * n), positive] = 1.0
  sigmoid = np.sum(np.where(off, np.logaddexp(0.0, -sign * logits), 0.0)) / (2 * n)
  return {"info_nce": nt_xent, "sigmoid": sigmoid}


@pytest.mark.parametrize("loss_name", ["info_nce", "sigmoid"])
@pytest.mark.parametrize("method", ["tiled", "dense"])
def test_loss_fn_is_the_named_loss(loss_name, method):
  z1, z2 = scale_bench._views(48, 8, "float32")
  ours = scale_bench._loss_fn(method, "tau", "all", 16, loss_name)(z1, z2)
  expected = _numpy_losses(np.asarray(z1), np.asarray(z2), tau=0.1)[loss_name]
  np.testing.assert_allclose(float(ours), expected, rtol=1e-5)
