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
  """Returns `run()`: one eager NT-Xent forward + backward on CPU copies of `z1`, `z2` `[N, D]`.

  `mapping`: `"tau"` (`cos / temperature`) or `"free"` (Eq. 11; `temperature` unused).
  """
  spec = "free" if mapping == "free" else f"tau={temperature}"
  run, _ = device_loss_and_grad_fn(z1, z2, mapping=spec, device="cpu")
  return run


def device_loss_and_grad_fn(z1: np.ndarray, z2: np.ndarray, *, mapping: str,
                            dtype: str = "float32", compile: bool = False,
                            device: str | None = None):
  """`(run, peak)`: one NT-Xent forward + backward of `z1`, `z2` `[N, D]` on `device`
  (default: CUDA if available), and `peak()`: the peak bytes allocated on a GPU (else None).

  `mapping`: `"free"` (Eq. 11) or `"tau=<value>"`. Inputs are stored in `dtype` and computed
  in float32, as `tfcl_jax.losses.info_nce` does. `compile`: the loss through `torch.compile`.
  """
  import torch
  import torch.nn.functional as F

  if mapping == "free":
    temperature = None
  elif mapping.startswith("tau="):
    temperature = float(mapping[len("tau="):])
  else:
    raise ValueError(f"the PyTorch baseline has mapping 'free' or 'tau=<value>', got "
                     f"{mapping!r}.")
  device = device or ("cuda" if torch.cuda.is_available() else "cpu")
  storage = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  out0 = torch.tensor(np.asarray(z1, np.float32), dtype=storage, device=device,
                      requires_grad=True)
  out1 = torch.tensor(np.asarray(z2, np.float32), dtype=storage, device=device,
                      requires_grad=True)
  n = out0.shape[0]
  diagonal = torch.eye(n, dtype=torch.bool, device=device)
  labels = torch.arange(n, device=device).repeat(2)
  margin = 8 * float(np.finfo(np.float32).epsneg)

  def logit(cos):
    if temperature is None:
      cos = cos.clamp(-1 + margin, 1 - margin)
      return torch.log1p(cos) - torch.log1p(-cos)
    return cos / temperature

  def forward(x0, x1):
    a, b = F.normalize(x0.float(), dim=1), F.normalize(x1.float(), dim=1)
    logits_00, logits_01 = logit(a @ a.T), logit(a @ b.T)
    logits_10, logits_11 = logit(b @ a.T), logit(b @ b.T)
    logits_00 = logits_00[~diagonal].view(n, -1)
    logits_11 = logits_11[~diagonal].view(n, -1)
    logits = torch.cat([torch.cat([logits_01, logits_00], dim=1),
                        torch.cat([logits_10, logits_11], dim=1)], dim=0)
    return F.cross_entropy(logits, labels)

  return runner(torch.compile(forward) if compile else forward, out0, out1, device)


def runner(loss_fn, x1, x2, device: str):
  """`(run, peak)`: `run()` is one `loss_fn(x1, x2)` forward + backward, waited for; `peak()`
  the peak bytes allocated on a GPU since this call (else None)."""
  import torch

  def run():
    x1.grad = x2.grad = None
    loss = loss_fn(x1, x2)
    loss.backward()
    return float(loss.detach())  # waits for the device

  if device == "cuda":
    torch.cuda.reset_peak_memory_stats()

  def peak():
    return torch.cuda.max_memory_allocated() if device == "cuda" else None

  return run, peak
