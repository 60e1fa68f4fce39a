"""Writes notebooks/temperature_hardness.ipynb without outputs.

Run from the repository root: python -m notebooks.make_temperature_hardness
"""

from __future__ import annotations

import os

from notebooks import nbtools

CELLS = [
    ("md", """# Hardness of negatives: fixed, dynamic and no temperature

Wang & Liu (CVPR 2021) read InfoNCE as a *hardness-aware* loss: a negative with similarity `s_k`
is pushed in proportion to its softmax weight, so harder (more similar) negatives are pushed more,
and the temperature sets how much more. This notebook draws that push per negative for fixed
`tau`, DySTreSS's dynamic `tau(s)` and the temperature-free mapping of Kim & Kim (arXiv 2501.17683,
Eq. 11), works out both limits `tau -> 0` and `tau -> inf`, and places the free mapping between
them. The pushes are computed with `tfcl_jax.analysis.negative_gradients` (autodiff through the
library's own `info_nce`) or, for `cos/tau`, `negative_weights / tau`.

""" + nbtools.COLAB_NOTE),
    ("code", nbtools.colab_install_cell("")),
    ("code", """import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from tfcl_jax import analysis, mappings

jax.config.update("jax_enable_x64", True)  # float64: the limits below are checked to high order

SMALL = os.environ.get("TFCL_NOTEBOOK_SMALL") == "1"  # the test suite runs a coarse grid
S = np.linspace(-0.95, 0.95, 39 if SMALL else 191)  # similarities of the negatives
S_POS = 0.8  # similarity of the positive
MAPS = {f"tau={tau}": mappings.temperature(tau) for tau in (0.05, 0.1, 0.5, 1.0)}
MAPS["dynamic 0.1:0.2"] = mappings.dynamic_temperature(0.1, 0.2)
MAPS["free"] = mappings.temperature_free()
# Similarity levels for the equivalent temperatures of Section 4: their pushes come from the
# same call as Section 1's (ratios between negatives do not depend on who else is there).
LEVELS = [(-0.5, 0.0), (0.0, 0.5), (0.5, 0.9), (0.9, 0.99)]
ENDS = np.asarray([s for level in LEVELS for s in level])"""),
    ("md", r"""## 1. The push each negative receives

One anchor, its positive at `s_+ = 0.8`, and one negative at every similarity of the grid `S`
(all in the same softmax). `dL/ds_k = w_k f'(s_k)`, with `w_k` the negative's softmax weight
(`analysis.negative_weights`). We plot each negative's share of the total push
`g_k / sum_j g_j`: the *hardness profile* of the mapping. For `cos/tau` it is
`exp(s/tau)` up to a constant; for the free mapping, `w_k f'(s_k) ~ (1+s)/(1-s) * 2/(1-s^2)
= 2/(1-s)^2`."""),
    ("code", """push, level_push = {}, {}
for name, m in MAPS.items():  # one compiled gradient per mapping
  g = np.asarray(analysis.negative_gradients(m, S_POS, jnp.asarray(np.concatenate([S, ENDS]))))
  push[name], level_push[name] = g[:S.size], g[S.size:]
fig, ax = plt.subplots(figsize=(7, 4.5))
for name, g in push.items():
  ax.plot(S, g / g.sum(), label=name)
ax.set(xlabel="similarity of the negative s_k", ylabel="share of the total push", yscale="log",
       title="hardness profile (positive at s = 0.8)")
ax.set_ylim(1e-8, 1)
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
plt.show()

free = push["free"]
closed = 2 / (1 - S) ** 2
share, closed_share = free / free.sum(), closed / closed.sum()
print("free mapping: max relative deviation of the push from 2/(1-s)^2 (up to a constant):",
      f"{np.max(np.abs(share - closed_share) / closed_share):.2e}")"""),
    ("md", r"""## 2. The limit `tau -> 0`: only the hardest negative counts

`L = log(1 + sum_k exp((s_k - s_+)/tau))`. As `tau -> 0` every term with `s_k < s_+` vanishes
and the largest one dominates: `tau L -> max(max_k s_k - s_+, 0)`, and the push goes to the
hardest negative alone (share -> 1). Checked below on random similarities; for `cos/tau` the push
is the softmax weight over `tau`, so shares are read from `analysis.negative_weights`."""),
    ("code", """rng = np.random.default_rng(0)
negatives = rng.uniform(-0.9, 0.9, size=16)
positive = 0.5
hardest = np.argmax(negatives)
print(f"hardest negative s = {negatives[hardest]:.3f}, positive s = {positive}")
for tau in (0.5, 0.1, 0.02, 0.005):
  g = np.asarray(analysis.negative_weights(mappings.temperature(tau), positive,
                                           jnp.asarray(negatives))) / tau
  cos = jnp.asarray(np.concatenate([[positive], negatives]))
  logits = mappings.temperature(tau)(cos)
  loss = float(jax.nn.logsumexp(logits) - logits[0])
  print(f"tau={tau:<6} share of the hardest = {g[hardest] / g.sum():.4f}   "
        f"tau*L = {tau * loss:.4f}   "
        f"max(s_max - s_pos, 0) = {max(negatives.max() - positive, 0):.4f}")"""),
    ("md", r"""## 3. The limit `tau -> inf`: equal weights, the "simple" loss

With `K` candidates (the positive and `K - 1` negatives), expand `exp(s/tau) = 1 + s/tau
+ s^2/(2 tau^2) + O(tau^-3)`:

`log sum_j exp(s_j/tau) = log K + m/tau + v/(2 tau^2) + O(tau^-3)`, with `m` the mean and `v`
the variance of the `K` similarities, so

`L = log K - (s_+ - m)/tau + v/(2 tau^2) + O(tau^-3)`.

Since `s_+ - m = (K-1)/K (s_+ - mean_{k != +} s_k)`, to first order this is the *simple* loss
`-s_+ + lambda sum_k s_k` with equal weights `lambda = 1/(K-1)`, scaled by `(K-1)/(K tau)`: every
negative gets the same push `1/(K tau)`, whatever its hardness. The error of the first-order form
falls as `tau^-2` (checked below); the push shares flatten to `1/(K-1)`."""),
    ("code", """cos = np.concatenate([[positive], negatives])
K = cos.size
m, v = cos.mean(), cos.var()
print(f"K = {K} candidates")
errors = []
for tau in (10.0, 100.0, 1000.0):
  logits = mappings.temperature(tau)(jnp.asarray(cos))
  loss = float(jax.nn.logsumexp(logits) - logits[0])
  first = np.log(K) - (positive - m) / tau
  second = first + v / (2 * tau**2)
  g = np.asarray(analysis.negative_weights(mappings.temperature(tau), positive,
                                           jnp.asarray(negatives))) / tau
  errors.append(abs(loss - first))
  print(f"tau={tau:<7} L={loss:.8f}  first order err={abs(loss - first):.2e}  "
        f"second order err={abs(loss - second):.2e}  push spread max/min={g.max() / g.min():.4f}")
ratios = [f"{a / b:.1f}" for a, b in zip(errors, errors[1:], strict=False)]
print("first-order error ratio per decade of tau:", ratios)"""),
    ("md", r"""## 4. Where the free mapping sits

A fixed `tau` has the same *hardness contrast* everywhere: the push ratio between two negatives is
`exp((s_2 - s_1)/tau)`. The free mapping's ratio is `((1 - s_1)/(1 - s_2))^2`, so its *equivalent
temperature* between two similarity levels, `tau_eq = (s_2 - s_1) / log(g_2/g_1)`, changes along
the sphere. Locally, `1/f'(s) = (1 - s^2)/2`: about 0.5 around `s = 0` (the high-temperature,
near-equal-weight regime of Section 3), falling to 0 as `s -> 1` (the hardest-only regime of
Section 2). DySTreSS's `tau(s)` is the opposite shape: smallest at `s = 0`, largest at
`s = +-1`."""),
    ("code", """def equivalent_taus(g):
  \"\"\"tau_eq = (s2 - s1) / log(g2 / g1) per level, from the pushes at the level ends.\"\"\"
  pairs = zip(LEVELS, g.reshape(-1, 2), strict=True)
  return [(s2 - s1) / np.log(g2 / g1) for (s1, s2), (g1, g2) in pairs]


table = {name: equivalent_taus(level_push[name]) for name in MAPS}
print("interval          " + "  ".join(f"{name:>15}" for name in MAPS))
for i, (s1, s2) in enumerate(LEVELS):
  row = "  ".join(f"{taus[i]:15.4f}" for taus in table.values())
  print(f"[{s1:5.2f}, {s2:5.2f}]    {row}")

local = np.linspace(-0.99, 0.99, 199)
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(local, (1 - local**2) / 2, label="free: 1/f'(s) = (1 - s^2)/2")
dynamic = mappings.dynamic_tau(local, tau_min=0.1, tau_max=0.2)
ax.plot(local, np.asarray(dynamic), label="DySTreSS tau(s)")
for tau in (0.1, 0.5):
  ax.axhline(tau, ls=":", color="gray")
ax.set(xlabel="similarity s", ylabel="local temperature", title="local temperature 1/f'(s)")
ax.legend(fontsize=8)
plt.show()
free_tau = table["free"]
print("free mapping equivalent tau falls with hardness:",
      all(a > b for a, b in zip(free_tau, free_tau[1:], strict=False)))"""),
    ("md", r"""## Reading

* Fixed `tau` interpolates between the two limits with one knob: small `tau` pushes only the
  hardest negatives (and, Section 3 of the paper, starves everything else of gradient), large
  `tau` pushes all negatives equally, like the simple loss.
* The free mapping is not one point on that line: it acts like `tau ~ 0.6` among easy negatives
  (`s < 0`), `tau ~ 0.36` between 0 and 0.5, and `tau ~ 0.02` among near-duplicates
  (`0.9 < s < 0.99`). It is hardness-aware only at the top end.
* Its push per negative grows as `2/(1-s)^2`, without bound as `s -> 1`; a fixed `tau`
  caps it at `e^{1/tau}/tau`. The flip side, measured in `experiments/hard_negatives.py`: the
  push is also multiplied by the softmax weight, which collapses once the positive reaches
  `s_+ -> 1` (its logit goes to infinity), so hard negatives left at that point stop moving.
  That happens when positives can align exactly; with augmented views, which cannot, the free
  loss separated every instance (`experiments/results/hard_negatives_augmented.md`)."""),
]


if __name__ == "__main__":
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "temperature_hardness.ipynb")
  nbtools.write(CELLS, path)
  print(f"wrote {path}")
