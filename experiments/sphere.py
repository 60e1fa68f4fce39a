r"""Annealing on the sphere: InfoNCE over free embeddings on S^(d-1), by SGD and Langevin dynamics.

M instances with two views each are free unit vectors (no network). Each
mapping of `config.mappings` (fixed, annealed, learnable, dynamic temperature,
temperature-free) is trained from random starts over many seeds, jitted and
vmapped over seeds.

Known optimum: for M <= d + 1, the regular simplex (pairwise cosine
-1/(M-1)) with both views equal. `L*` is the loss of that configuration under
the mapping as it stands at the end (final step, final learnable t),
evaluated numerically with `tfcl_jax.losses.info_nce`; a run "reaches" the
optimum when every positive cosine is >= 1 - tol and every cross-view negative
cosine <= -1/(M-1) + tol.

Run: python -m experiments.sphere --config=experiments/configs/sphere.py --workdir=DIR
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from experiments.framework import experiment, plan, sphere_study, sweep, tables
from tfcl_jax import langevin, losses, mappings
from tfcl_jax.analysis import geometry

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "sphere.py")
OPTIMIZERS = ("sgd", "langevin")


def parse_setting(text: str) -> tuple[int, int, str]:
  """`"d:M:negatives"` -> `(d, M, negatives)`, checking that the simplex fits (M <= d + 1)."""
  try:
    d, m, negatives = text.split(":")
    d, m = int(d), int(m)
  except ValueError:
    raise ValueError(f"setting must look like 'd:M:cross' or 'd:M:all', got {text!r}.") from None
  if negatives not in ("cross", "all"):
    raise ValueError(f"setting {text!r}: negatives must be 'cross' or 'all'.")
  if not 2 <= m <= d + 1:
    raise ValueError(f"setting {text!r}: need 2 <= M <= d + 1 for the simplex optimum.")
  return d, m, negatives


def simplex(m: int, d: int) -> np.ndarray:
  """`[m, d]` vertices of a regular simplex on S^(d-1) (pairwise cosine -1/(m-1)), m <= d + 1."""
  if not 2 <= m <= d + 1:
    raise ValueError(f"need 2 <= m <= d + 1, got m={m}, d={d}.")
  centred = np.eye(m) - 1.0 / m  # rows: the simplex in the hyperplane sum(x) = 0 of R^m.
  u, _, _ = np.linalg.svd(centred)
  coords = centred @ u[:, : m - 1]  # the same points in an orthonormal basis of that hyperplane.
  coords /= np.linalg.norm(coords, axis=1, keepdims=True)
  return np.pad(coords, ((0, 0), (0, d - (m - 1))))


def reached(z1, z2, *, tol: float) -> jax.Array:
  """Whether the views form the simplex optimum within `tol` (cross-view cosines)."""
  m = z1.shape[0]
  cos = losses.l2_normalize(z1) @ losses.l2_normalize(z2).T
  off = jnp.where(jnp.eye(m, dtype=bool), -jnp.inf, cos)
  return (jnp.min(jnp.diag(cos)) >= 1.0 - tol) & (jnp.max(off) <= -1.0 / (m - 1) + tol)


def make_runner(mapping: mappings.Mapping, *, d: int, m: int, negatives: str, config):
  """A jitted `(keys [S], beta0) -> (final, curves)` over S seeds for one mapping and setting."""
  steps, every = config.steps, config.eval_every
  if steps % every:
    raise ValueError(f"steps ({steps}) must be a multiple of eval_every ({every}).")
  target = jnp.asarray(simplex(m, d), jnp.float32)
  optimal_uniformity = -4.0 * m / (m - 1)  # -t ||v_i - v_j||^2 with t = 2, ||.||^2 = 2m/(m-1).

  sigma = config.augment

  def views_of(state, noise):
    """The two views: the state itself, or one point per instance plus fixed perturbations."""
    if sigma == 0:
      return state
    (u,) = state
    return tuple(losses.l2_normalize(u + sigma * n) for n in noise)

  def loss_at(state, noise, params, step):
    z1, z2 = views_of(state, noise)
    return sphere_study.mean_loss(z1, z2, mapping.bind(params=params, step=step), negatives)

  def at_optimum(state):
    # The geometric target: views (or instance points) on the simplex.
    return reached(*(state if sigma == 0 else state * 2), tol=config.tol)

  def draw_perturbations(key):
    return tuple(jax.random.normal(k, (m, d)) / np.sqrt(d) for k in jax.random.split(key))

  def train_step(carry, step):
    state, params, key, first_hit, beta0, noise = carry
    key, noise_key = jax.random.split(key)
    if sigma > 0:  # fresh perturbations every step, like random augmentations.
      noise_key, perturbation_key = jax.random.split(noise_key)
      noise = draw_perturbations(perturbation_key)
    # The potential is the summed loss (m x the mean): each point's gradient is O(1) in m.
    # beta(t) = beta0 log(t + 2): logarithmic cooling (Theorem 1 of the annealing paper).
    _, state, params, _ = sphere_study.sphere_step(
        lambda state, params: loss_at(state, noise, params, step), state, params,
        lr=config.learning_rate, t_lr=config.t_learning_rate, scale=m, key=noise_key,
        beta=beta0 * jnp.log(step + 2.0))
    first_hit = jnp.where((first_hit < 0) & at_optimum(state), step + 1, first_hit)
    return (state, params, key, first_hit, beta0, carry[-1]), None

  def metrics(state, noise, params, step):
    loss = loss_at(state, noise, params, step)
    optimum = loss_at((target,) * len(state), noise, params, step)
    z1, z2 = views_of(state, noise)
    return dict(
        loss_gap=loss - optimum,
        optimum=optimum,
        alignment=geometry.alignment(z1, z2),
        uniformity_gap=geometry.uniformity(state[0]) - optimal_uniformity,
        reached=at_optimum(state),
        tau=jnp.exp(-params["t"]) if "t" in params else jnp.nan,
    )

  def run_one(key, beta0):
    key, key1, key2 = jax.random.split(key, 3)
    if sigma == 0:
      state = (langevin.random_sphere(key1, (m, d)), langevin.random_sphere(key2, (m, d)))
      noise = ()
    else:
      state = (langevin.random_sphere(key1, (m, d)),)
      noise = draw_perturbations(key2)  # fixed ones for the metrics.
    carry = (state, dict(mapping.params), key, jnp.asarray(-1, jnp.int32), beta0, noise)

    def block(carry, start):
      carry, _ = jax.lax.scan(train_step, carry, start + jnp.arange(every))
      state, params = carry[:2]
      return carry, metrics(state, noise, params, start + every)

    carry, curves = jax.lax.scan(block, carry, jnp.arange(0, steps, every))
    final = jax.tree.map(lambda c: c[-1], curves)
    final["first_hit"] = carry[3]
    return final, curves

  return jax.jit(jax.vmap(run_one, in_axes=(0, None)))


def summarise(final) -> dict:
  """Per-configuration summary over seeds (means; steps-to-optimum as a median of reaching runs)."""
  final = jax.tree.map(np.asarray, final)
  reached = final["reached"].astype(bool)
  hits = final["first_hit"][reached]
  return dict(
      loss_gap=float(np.mean(final["loss_gap"])),
      loss_gap_min=float(np.min(final["loss_gap"])),
      optimum=float(np.mean(final["optimum"])),
      alignment=float(np.mean(final["alignment"])),
      uniformity_gap=float(np.mean(final["uniformity_gap"])),
      reached=float(np.mean(reached)),
      median_steps=float(np.median(hits)) if hits.size else float("nan"),
      final_tau=float(np.mean(final["tau"])),
  )


COLUMNS = ("spec", "optimizer", "loss_gap", "loss_gap_min", "alignment", "uniformity_gap",
           "reached", "median_steps", "final_tau")


def _plot(workdir: str, setting: str, curves_by_run: dict, *, every: int) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  specs = list(dict.fromkeys(spec for spec, _ in curves_by_run))
  colors = dict(zip(specs, plt.cm.tab10(np.linspace(0, 1, 10)), strict=False))
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
  for (spec, optimizer), curves in curves_by_run.items():
    x = every * (1 + np.arange(curves["loss_gap"].shape[1]))
    style = "-" if optimizer == "sgd" else "--"
    for ax, name in zip(axes, ("loss_gap", "uniformity_gap", "reached"), strict=True):
      y = np.mean(np.asarray(curves[name], np.float64), axis=0)
      y = np.maximum(y, 1e-8) if name == "loss_gap" else y
      ax.plot(x, y, style, color=colors[spec], label=f"{spec} ({optimizer})")
  for ax, title in zip(axes, ("loss - L* (mean over seeds)", "uniformity - simplex",
                              "fraction at the optimum"), strict=True):
    ax.set_title(title)
    ax.set_xlabel("step")
  axes[0].set_yscale("log")
  axes[2].legend(fontsize=6, ncol=2)
  fig.suptitle(f"sphere study, d:M:negatives = {setting} (solid: sgd, dashed: langevin)")
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, f"curves_{setting.replace(':', '_')}.png"), dpi=110)
  plt.close(fig)


def check_config(config) -> None:
  """Each field's type and range, the settings, the mappings and the optimizers.

  Raises:
    ConfigError: naming the first bad field.
  """
  plan.check_fields(config, positive=("seeds", "steps", "eval_every"), non_negative=("seed",),
                    positive_numbers=("learning_rate", "beta0", "tol"),
                    non_negative_numbers=("t_learning_rate", "augment"))
  if config.steps % config.eval_every:
    raise plan.ConfigError(f"config.steps ({config.steps}) must be a multiple of "
                           f"config.eval_every ({config.eval_every}).")
  unknown = [name for name in config.optimizers if name not in OPTIMIZERS]
  if unknown or not config.optimizers:
    raise plan.ConfigError(f"config.optimizers must name some of {', '.join(OPTIMIZERS)}, got "
                           f"{config.optimizers!r}.")
  with plan.config_errors("config.settings: "):
    for setting in config.settings:
      parse_setting(setting)
  with plan.config_errors("config.mappings: "):
    for spec in config.mappings:
      mappings.from_spec(spec.format(steps=config.steps))


@sweep.study
def train_and_evaluate(config, workdir: str) -> list[dict]:
  """Runs every (setting, mapping, optimizer) (`check_config` passed) and writes results.csv,
  results.md and PNGs."""
  keys = jax.random.split(jax.random.key(config.seed), config.seeds)
  betas = {"sgd": float("inf"), "langevin": float(config.beta0)}
  rows, curves = [], {setting: {} for setting in config.settings}
  jobs = [(s, spec) for s in config.settings for spec in config.mappings]
  for setting, spec_template in tqdm.tqdm(jobs, desc="sphere"):
    d, m, negatives = parse_setting(setting)
    mapping = mappings.from_spec(spec_template.format(steps=config.steps))
    runner = make_runner(mapping, d=d, m=m, negatives=negatives, config=config)
    for optimizer in config.optimizers:
      final, curves[setting][(mapping.spec, optimizer)] = runner(keys, betas[optimizer])
      row = dict(setting=setting, d=d, M=m, negatives=negatives, spec=mapping.spec,
                 optimizer=optimizer, augment=config.augment, seeds=config.seeds,
                 steps=config.steps)
      row.update(summarise(final))
      rows.append(row)
  figures = [lambda path, s=s, c=c: _plot(path, s, c, every=config.eval_every)
             for s, c in curves.items()] if config.plots else []
  tables.write_results(workdir, rows, markdown=results_markdown(rows, config), figures=figures)
  return rows


def results_markdown(rows: list[dict], config, command: str | None = None) -> str:
  """`results.md` of `rows` made with `config` by `command` (default: the one running)."""
  notes = NOTES.format(seeds=config.seeds, steps=config.steps, lr=config.learning_rate,
                       beta0=config.beta0, tol=config.tol)
  if config.augment:
    notes += AUGMENT_NOTES.format(augment=config.augment)
  return tables.study_markdown(
      rows, title="Annealing on the sphere", columns=COLUMNS, notes=notes, command=command,
      sections=[(f"d:M:negatives = {s}", [r for r in rows if r["setting"] == s])
                for s in config.settings])


NOTES = """\
Embeddings on S^(d-1), {seeds} seeds per row, {steps} steps, step size lr = {lr}; `langevin`
adds noise sqrt(2 lr / beta(t)) with beta(t) = {beta0} log(t + 2), `sgd` none.
Optimum: regular simplex with both views equal; L* = the loss there under the mapping as it
stands at the end (final tau / learnable t). `loss_gap` = mean final loss - L*
(`loss_gap_min` the smallest over seeds: >= 0 up to rounding means no run beat the simplex).
`alignment` = E||z1 - z2||^2, `uniformity_gap` = uniformity(z1) - (-4M/(M-1)) (0 at the simplex).
`reached` = fraction of seeds at the optimum at the end (positive cosines >= 1 - {tol}, negative
cross cosines <= -1/(M-1) + {tol}); `median_steps` = median first step at the optimum among those.
`final_tau` = exp(-t) for the learnable temperature.
"""

AUGMENT_NOTES = """
Augmented views: one point u_i per instance, views normalize(u_i + {augment} n) with n ~ N(0, I/d)
drawn afresh at every step, so positives cannot align perfectly. `reached` and `uniformity_gap`
are those of the u_i; `alignment` and `loss_gap` use one fixed draw of n per seed, the gap against
the u_i at the simplex with that draw (a reference, not a proven optimum: it can be negative).
"""


EXPERIMENT = experiment.Experiment(
    name="sphere", kind="study", train_and_evaluate=train_and_evaluate,
    check_config=check_config, configs=("experiments/configs/sphere.py",),
    default_config=DEFAULT_CONFIG, results_markdown=results_markdown)

if __name__ == "__main__":
  EXPERIMENT.main()
