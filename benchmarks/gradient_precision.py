r"""How accurately autodiff through `info_nce` gets the gradient scale in float32 (not a test).

`info_nce` computes a row loss as `logsumexp(all candidates) - positive logit`; its gradient in
the positive logit is `p_positive - 1`, which rounds once `1 - p_positive` nears the float
epsilon, so the positive's pull is lost near the optimum and the scale is off by up to 2x.
The form `softplus(logsumexp(negatives) - positive logit)` (same value) gets it from
`sigmoid(...)` instead. This script prints both against the float64 closed forms (Eq. 7, 13).

Run: python -m benchmarks.gradient_precision
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import analysis, mappings
from tfcl_jax.analysis import gradients


def softplus_row0(cosines, mapping):
  """Row-0 loss as softplus(logsumexp over negatives - positive logit): the suggested form."""
  logits = mapping(cosines)
  return jax.nn.softplus(jax.nn.logsumexp(logits[1:]) - logits[0])


def softplus_scale(mapping, C, n):
  pattern = lambda c: jnp.concatenate([c[None], jnp.broadcast_to(-c, (n - 1,))])
  return jnp.abs(jax.vmap(jax.grad(lambda c: softplus_row0(pattern(c), mapping)))(C))


def main() -> None:
  cs = np.array([0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999], np.float32)
  cases = [("tau=0.1", 2), ("tau=0.1", 16), ("tau=0.25", 16), ("free", 2), ("free", 16)]
  print("relative error of |dL/dC| in float32 against the float64 closed form")
  print(f"{'mapping':>9} {'N':>3} " + " ".join(f"C={c:<6g}" for c in cs))
  for spec, n in cases:
    mapping = mappings.from_spec(spec)
    with jax.enable_x64(True):
      c64 = cs.astype(np.float64)
      exact = np.asarray(analysis.eq13(c64, n) if spec == "free" else
                         analysis.eq7(c64, float(spec.split("=")[1]), n))
    ours = np.asarray(gradients.gradient_scale(mapping, jnp.asarray(cs), n), np.float64)
    alt = np.asarray(softplus_scale(mapping, jnp.asarray(cs), n), np.float64)
    for name, got in (("info_nce", ours), ("softplus", alt)):
      rel = np.abs(got - exact) / exact
      print(f"{spec:>9} {n:>3} " + " ".join(f"{r:<8.1e}" for r in rel) + f"  {name}")


if __name__ == "__main__":
  main()
