"""A PyTorch eager NT-Xent with LightlySSL's math: the baseline of `scale_bench` (torch optional).

LightlySSL's `NTXentLoss` (single process): the four view-by-view logit blocks, the
self-similarity diagonals dropped, one cross-entropy over the `2N` rows.
"""

from __future__ import annotations

import numpy as np


def available() -> bool:
  try:
    import torch  # noqa: F401
  except ImportError:
    return False
  return True


def loss_and_grad_fn(z1: np.ndarray, z2: np.ndarray, *, temperature: float):
  """Returns `run()`: one eager NT-Xent forward + backward on copies of `z1`, `z2` `[N, D]`."""
  import torch
  import torch.nn.functional as F

  out0 = torch.from_numpy(np.array(z1, np.float32)).requires_grad_(True)
  out1 = torch.from_numpy(np.array(z2, np.float32)).requires_grad_(True)
  n = out0.shape[0]
  diagonal = torch.eye(n, dtype=torch.bool)
  labels = torch.arange(n).repeat(2)

  def run():
    out0.grad = out1.grad = None
    a, b = F.normalize(out0, dim=1), F.normalize(out1, dim=1)
    logits_00 = a @ a.T / temperature
    logits_01 = a @ b.T / temperature
    logits_10 = b @ a.T / temperature
    logits_11 = b @ b.T / temperature
    logits_00 = logits_00[~diagonal].view(n, -1)
    logits_11 = logits_11[~diagonal].view(n, -1)
    logits = torch.cat([torch.cat([logits_01, logits_00], dim=1),
                        torch.cat([logits_10, logits_11], dim=1)], dim=0)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    return float(loss.detach())

  return run
