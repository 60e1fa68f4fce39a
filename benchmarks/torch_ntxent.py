"""PyTorch eager NT-Xent with LightlySSL's math: the loss benchmarks' baseline (torch optional).

LightlySSL's `NTXentLoss` (single process): the four view-by-view logit blocks, the
self-similarity diagonals dropped, one cross-entropy over the `2N` rows. `mapping="free"`
replaces `cos / tau` by the paper's Eq. 11, `log((1 + c)/(1 - c))` after the same 8-ulp clamp
as `tfcl_jax.mappings.temperature_free`.
"""

from __future__ import annotations

import numpy as np


def available() -> bool:
  try:
    import torch  # noqa: F401
  except ImportError:
    return False
  return True


def loss_and_grad_fn(z1: np.ndarray, z2: np.ndarray, *, temperature: float | None,
                     mapping: str = "tau"):
  """Returns `run()`: one eager NT-Xent forward + backward on copies of `z1`, `z2` `[N, D]`.

  `mapping`: `"tau"` (`cos / temperature`) or `"free"` (Eq. 11; `temperature` unused).
  """
  import torch
  import torch.nn.functional as F

  out0 = torch.from_numpy(np.array(z1, np.float32)).requires_grad_(True)
  out1 = torch.from_numpy(np.array(z2, np.float32)).requires_grad_(True)
  n = out0.shape[0]
  diagonal = torch.eye(n, dtype=torch.bool)
  labels = torch.arange(n).repeat(2)
  margin = 8 * float(np.finfo(np.float32).epsneg)

  def logit(cos):
    if mapping == "free":
      cos = cos.clamp(-1 + margin, 1 - margin)
      return torch.log1p(cos) - torch.log1p(-cos)
    return cos / temperature

  def run():
    out0.grad = out1.grad = None
    a, b = F.normalize(out0, dim=1), F.normalize(out1, dim=1)
    logits_00, logits_01 = logit(a @ a.T), logit(a @ b.T)
    logits_10, logits_11 = logit(b @ a.T), logit(b @ b.T)
    logits_00 = logits_00[~diagonal].view(n, -1)
    logits_11 = logits_11[~diagonal].view(n, -1)
    logits = torch.cat([torch.cat([logits_01, logits_00], dim=1),
                        torch.cat([logits_10, logits_11], dim=1)], dim=0)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    return float(loss.detach())

  return run
