"""Writes notebooks/gradient_scales.ipynb (no outputs): python -m notebooks.make_gradient_scales"""

from __future__ import annotations

import os

from notebooks import nbtools

CELLS = [
    ("md", """# Gradient scales of InfoNCE: division by temperature vs temperature-free

Sections 3-4 of Kim & Kim, *Temperature-Free Loss Function for Contrastive Learning*
(arXiv 2501.17683), with `tfcl_jax.analysis`: every closed form (Eq. 3-13) is drawn as a line and
checked by autodiff **through the library's own loss** `tfcl_jax.losses.info_nce` (points).
The figures are `tfcl_jax.analysis.figures`, the same code that draws them for
`experiments/gradient_scales.py`.

""" + nbtools.COLAB_NOTE),
    ("code", nbtools.colab_install_cell("")),
    ("code", """import jax
import matplotlib.pyplot as plt
import numpy as np

from tfcl_jax import analysis, mappings
from tfcl_jax.analysis import figures

jax.config.update("jax_enable_x64", True)  # float64: closed form and autodiff agree to ~1e-15

TAUS = (0.1, 0.25, 0.5, 1.0)
NS = (2, 4, 8, 16)


def max_gap(figure):
  \"\"\"Largest |closed form - autodiff| over the points of every curve.\"\"\"
  return max(float(np.max(np.abs(c.closed - c.autodiff))) for c in figure.curves)"""),
    ("md", r"""## The setting

InfoNCE (Eq. 1) feeds the logits $f(\cos\theta_{ij})$ to a softmax, with $f(c) = c/\tau$.
Sections 3-4 study one anchor whose cosines with its candidates are
$[C, -C, \dots, -C]$: one positive at $C$ and $N - 1$ negatives at $-C$. The optimum is $C \to 1$.

`analysis.gradient_scale(mapping, C, N)` builds embeddings with exactly these cosines (anchor
$e_1$, positive $C e_1 + \sqrt{1 - C^2} e_2$, negatives $-C e_1 + \sqrt{1 - C^2} e_{k+2}$), takes
row 0 of `info_nce(..., reduction="none")` and differentiates it in $C$."""),
    ("md", r"""## Example 3.1: the representational limit

At the optimum $[1, -1]$ the positive's softmax probability is $\sigma(2/\tau) < 1$: logits live
in $[-1/\tau, 1/\tau]$, an interval of finite length $2/\tau$. (The paper's text prints
$\sigma(2\tau)$; its quoted values $\sigma(2) = 0.88$ at $\tau = 1$ and $\sigma(20) = 0.99$ at
$\tau = 0.1$ are $\sigma(2/\tau)$.) The temperature-free mapping $\log\frac{1 + c}{1 - c}$ (Eq. 11)
is unbounded; in floating point it stops at `mappings.max_free_logit`."""),
    ("code", """for tau in TAUS:
  print(f"tau = {tau:<5}: sigma(2/tau) = {float(analysis.softmax_ceiling(tau)):.10f},"
        f" 1 - p = {1 - float(analysis.softmax_ceiling(tau)):.2e}")
free = mappings.temperature_free()
print(f"free        : p = {float(analysis.optimum_probability(free)):.10f}"
      f" (largest float64 logit {mappings.max_free_logit('float64'):.1f})")
for n in NS:
  p = float(analysis.optimum_probability(mappings.temperature(0.25), N=n))
  print(f"N = {n:2d}, tau = 0.25: p = {p:.4f}")"""),
    ("md", r"""## Example 3.2: vanishing gradients (Eq. 2-4, Figures 2 and 3)

$$L_i = -\log \frac{e^{C/\tau}}{e^{C/\tau} + e^{-C/\tau}} = \log\left(1 + e^{-2C/\tau}\right)
\quad (3), \qquad
\left|\frac{\partial L_i}{\partial C}\right| = \frac{2/\tau}{1 + e^{2C/\tau}} \quad (4).$$

High $\tau$ leaves a nonzero gradient at the optimum; low $\tau$ kills it already at $C \in (0.4,
0.7)$. Only a tuned $\tau$ (about 0.25) does both (Figure 3)."""),
    ("code", """fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
figure2 = figures.figure2(taus=TAUS)
figure3 = figures.figure3(cs=(0.25, 0.5, 0.75, 1.0))
figures.plot(figure2, left)
figures.plot(figure3, right)
plt.show()
print("max |Eq. 4 - autodiff| =", max(max_gap(figure2), max_gap(figure3)))"""),
    ("md", r"""## Example 3.3: more negatives (Eq. 5-7, Figure 4)

$$L_i = \log\left(1 + (N-1) e^{-2C/\tau}\right) \quad (6), \qquad
\left|\frac{\partial L_i}{\partial C}\right|
= \frac{(N-1)\,2/\tau}{(N-1) + e^{2C/\tau}} \quad (7).$$

The $\tau = 0.25$ that looked right for $N = 2$ leaves a nonzero gradient at $C \to 1$ for
$N = 16$: the valid temperature depends on $N$."""),
    ("code", """figure4 = figures.figure4(tau=0.25, ns=NS)
figures.plot(figure4)
plt.show()
print("max |Eq. 7 - autodiff| =", max_gap(figure4))
for n in NS:
  print(f"N = {n:2d}: Eq. 7 at C = 1: {float(analysis.eq7(1.0, 0.25, n)):.4f}")"""),
    ("md", r"""## Example 3.4: a learnable temperature (Eq. 8-10)

CLIP multiplies cosines by $e^t$ and learns $t$:
$$L_i = \log\left(1 + e^{-2C e^t}\right) \quad (9), \qquad
\left|\frac{\partial L_i}{\partial t}\right| = \frac{2 C e^t}{1 + e^{2 C e^t}} \quad (10).$$

At $C = 0$, typical at initialisation, $t$ receives no gradient whatever its value. Note the peak
height is the same for every $t$ (it is a function of $C e^t$ only); $t$ only moves it."""),
    ("code", """ts = (-1.0, 0.0, 1.0, 2.0, float(np.log(1 / 0.07)))
eq10 = figures.eq10_figure(ts=ts)
figures.plot(eq10)
plt.show()
print("max |Eq. 10 - autodiff| =", max_gap(eq10))
print("|dL/dt| at C = 0:", np.asarray(analysis.eq10(0.0, np.array(ts))))"""),
    ("md", r"""## Section 4: the temperature-free mapping (Eq. 11-13, Figure 5)

$$f(c) = \log\frac{1 + c}{1 - c} = 2\,\mathrm{artanh}(c) \quad (11)$$
$$L_i = -\log \frac{(1 + C)^2}{(1 + C)^2 + (N - 1)(1 - C)^2} \quad (12), \qquad
\left|\frac{\partial L_i}{\partial C}\right|
= \frac{4(N-1)(1-C)}{(1+C)(N(1-C)^2 + 4C)} \quad (13).$$

Zero only at the optimum, for every $N$, and monotonically decreasing: no temperature to tune."""),
    ("code", """figure5 = figures.figure5(ns=NS)
figures.plot(figure5)
plt.show()
print("max |Eq. 13 - autodiff| =", max_gap(figure5))"""),
    ("md", r"""## All mappings at N = 16

`gradient_scale` works for any mapping, including those with no closed form: DySTreSS's dynamic
temperature (Manna et al. 2023) and an annealed temperature at a given step."""),
    ("code", """specs = ("tau=0.1", "tau=0.25", "tau=1", "dynamic=0.1:0.2", "free")
c_fine = np.linspace(0.01, 0.99, 50)
fig, ax = plt.subplots(figsize=(5.5, 4))
scales = jax.jit(lambda c: [analysis.gradient_scale(mappings.from_spec(spec), c, 16)
                            for spec in specs])(c_fine)
for spec, scale in zip(specs, scales, strict=True):
  ax.plot(c_fine, scale, label=spec)
ax.set_xlabel("C")
ax.set_ylabel("|dL/dC| (autodiff)")
ax.set_yscale("log")
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
ax.set_title("Gradient scale at [C, -C, ..., -C], N = 16")
plt.show()"""),
    ("md", r"""## The hardness view (Wang & Liu 2021)

The gradient of $L_i$ in the logit of negative $k$ is its softmax weight
$w_k = e^{f(s_k)} / \sum_j e^{f(s_j)}$: harder negatives (larger $s_k$) are pushed more. In cosine,
$\partial L_i / \partial s_k = w_k f'(s_k)$. With $c/\tau$ the weight grows like $e^{s/\tau}$;
with the free mapping like $\left(\frac{1 + s}{1 - s}\right)^2$ and $f'(s) = 2/(1 - s^2)$ adds a
push that grows without bound for near-duplicate negatives. Below: an anchor with positive at
$0.5$ and 16 negatives spread over $[-0.95, 0.95]$."""),
    ("code", """negatives = np.linspace(-0.95, 0.95, 16)
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
for spec in ("tau=0.1", "tau=0.5", "dynamic=0.1:0.2", "free"):
  mapping = mappings.from_spec(spec)
  weights = np.asarray(analysis.negative_weights(mapping, 0.5, negatives))
  grads = np.asarray(analysis.negative_gradients(mapping, 0.5, negatives))
  label = f"{spec} (positive p = {1 - weights.sum():.2f})"
  left.plot(negatives, weights, "o-", markersize=3, label=label)
  right.plot(negatives, grads, "o-", markersize=3, label=spec)
left.set_yscale("log")
right.set_yscale("log")
left.set_xlabel("negative cosine s_k")
right.set_xlabel("negative cosine s_k")
left.set_ylabel("softmax weight w_k")
right.set_ylabel("dL/ds_k")
left.legend(fontsize=8)
right.legend(fontsize=8)
left.grid(alpha=0.3)
right.grid(alpha=0.3)
plt.show()"""),
]


if __name__ == "__main__":
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gradient_scales.ipynb")
  nbtools.write(CELLS, path)
  print(path)
