r"""Cost of formulations of the temperature-free mapping (Eq. 11) inside info_nce loss + grad.

`mappings.temperature_free()` computes `log1p(c) - log1p(-c)` after a clamp. This compares, in
one process with interleaved repeats, other forms of the same function (same clamp) and
`cos / tau`, and prints each form's largest deviation from a float64 reference over [-1, 1].

Run: python -m benchmarks.free_map_bench [--sizes 1024 2048]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import time_interleaved
from tfcl_jax import losses, mappings

_MARGIN = 8 * float(jnp.finfo(jnp.float32).epsneg)


def _clamped(form):
  def fn(cos, params, step):
    return form(jnp.clip(cos, -1.0 + _MARGIN, 1.0 - _MARGIN))
  return mappings.Mapping("variant", fn)


@jax.custom_jvp
def _free_custom_jvp(c):
  return jnp.log1p(c) - jnp.log1p(-c)


@_free_custom_jvp.defjvp
def _free_jvp(primals, tangents):
  # One division for the derivative 2 / (1 - c^2) instead of autodiff's two.
  (c,), (dc,) = primals, tangents
  return _free_custom_jvp(c), 2.0 * dc / (1.0 - c * c)


FORMS = {
    "log1p(c) - log1p(-c) (library)": None,
    "log((1 + c) / (1 - c))": lambda c: jnp.log((1.0 + c) / (1.0 - c)),
    "log1p(2c / (1 - c))": lambda c: jnp.log1p(2.0 * c / (1.0 - c)),
    "2 arctanh(c)": lambda c: 2.0 * jnp.arctanh(c),
    "log1p form, custom_jvp 2/(1-c^2)": _free_custom_jvp,
}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", type=int, nargs="*", default=[1024, 2048])
  parser.add_argument("--repeats", type=int, default=9)
  args = parser.parse_args()
  cos = np.linspace(-1.0, 1.0, 200001).astype(np.float32)
  reference = np.log1p(np.clip(cos.astype(np.float64), -1 + _MARGIN, 1 - _MARGIN))
  reference -= np.log1p(-np.clip(cos.astype(np.float64), -1 + _MARGIN, 1 - _MARGIN))
  candidates = {"tau=0.1": mappings.temperature(0.1)}
  for name, form in FORMS.items():
    candidates[name] = mappings.temperature_free() if form is None else _clamped(form)
    error = np.max(np.abs(np.asarray(candidates[name](cos), np.float64) - reference))
    print(f"{name:>32}: max |logit error| over [-1, 1] = {error:.2e}")
  for n in args.sizes:
    z1 = jax.random.normal(jax.random.key(0), (n, 128))
    z2 = z1 + 0.5 * jax.random.normal(jax.random.key(1), (n, 128))
    fns = {}
    for negatives in ("cross", "all"):
      for name, mapping in candidates.items():
        loss = lambda a, b, m=mapping, k=negatives: losses.info_nce(a, b, mapping=m, negatives=k)
        fns[(negatives, name)] = (jax.jit(jax.value_and_grad(loss, argnums=(0, 1))), (z1, z2))
    timings = time_interleaved(fns, args.repeats, {})
    for (negatives, name), (median, fastest) in timings.items():
      base_median, base_min = timings[(negatives, "tau=0.1")]
      print(f"N = {n:>5} {negatives:>5} {name:>32}: median {1e3 * median:8.2f} ms "
            f"({median / base_median:4.2f} x tau), min {1e3 * fastest:8.2f} ms "
            f"({fastest / base_min:4.2f} x tau)")


if __name__ == "__main__":
  main()
