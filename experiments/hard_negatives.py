r"""Hard negatives: gradient scale and convergence as the fraction of hard negatives goes 0 -> 1.

Each instance is an anchor, its positive (cosine `s_pos` to the anchor) and K
negatives, all free unit vectors in R^d. A fraction `h` of the negatives is
hard (cosine to the anchor in `[s_pos - hard_gap, s_pos]`), the rest easy
(cosine in `[-easy_spread, easy_spread]`). At initialisation we measure the
gradient each cosine receives (positive pull |dL/ds_pos|, the share of the
repulsion that goes to hard negatives); then all vectors are trained by
Riemannian SGD and we count the steps until the anchor is separated: its
positive cosine exceeds every negative's by `margin`. Each mapping of `config.mappings`
(`tfcl_jax.mappings.from_spec`) is one row per fraction.

Run: python -m experiments.hard_negatives --config=experiments/configs/hard_negatives.py \
  --workdir=DIR
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from experiments.framework import experiment, plan, sphere_study, sweep, tables
from tfcl_jax import langevin, losses, mappings

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                              "hard_negatives.py")


def rotated_towards(anchor, key, cos):
  """Unit vectors at cosine `cos` (`[..., 1]`) to `anchor` (`[..., d]`), random otherwise."""
  away = losses.l2_normalize(langevin.tangent(anchor, jax.random.normal(key, anchor.shape)))
  return cos * anchor + jnp.sqrt(1.0 - cos**2) * away


def instances(key, *, n: int, k: int, d: int, n_hard, config):
  """`n` instances: anchors `[n, d]`, positives `[n, d]`, negatives `[n, k, d]`.

  The first `n_hard` (may be traced) negatives of every instance are hard.
  """
  keys = jax.random.split(key, 5)
  anchor = langevin.random_sphere(keys[0], (n, d))
  positive = rotated_towards(anchor, keys[1], jnp.full((n, 1), config.s_pos))
  hard = jnp.arange(k) < n_hard
  hard_cos = config.s_pos - config.hard_gap * jax.random.uniform(keys[2], (n, k))
  easy_cos = config.easy_spread * jax.random.uniform(keys[3], (n, k), minval=-1.0, maxval=1.0)
  cos = jnp.where(hard, hard_cos, easy_cos)[..., None]
  negatives = rotated_towards(jnp.broadcast_to(anchor[:, None], (n, k, d)), keys[4], cos)
  return anchor, positive, negatives, hard


def cosines(anchor, positive, negatives) -> jax.Array:
  """`[n, 1 + k]` cosines of each anchor to its positive (column 0) and its negatives."""
  anchor = losses.l2_normalize(anchor)
  positive = losses.l2_normalize(positive)
  negatives = losses.l2_normalize(negatives)
  return jnp.concatenate([
      jnp.sum(anchor * positive, -1, keepdims=True),
      jnp.einsum("nd,nkd->nk", anchor, negatives)], axis=-1)


def instance_loss(cos, mapping) -> jax.Array:
  """Mean InfoNCE (Eq. 1 with the mapping's logits) with the positive in column 0."""
  logits = mapping(cos)
  return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[:, 0])


def make_runner(mapping: mappings.Mapping, *, config):
  """A jitted `(keys [S], n_hard [H]) -> results [H, S]` for one mapping (one compilation)."""
  n, k, d = config.instances, config.num_negatives, config.dim

  def run_one(key, n_hard):
    anchor, positive, negatives, hard = instances(key, n=n, k=k, d=d, n_hard=n_hard, config=config)
    params = dict(mapping.params)
    augment_key = jax.random.fold_in(key, 1)  # separate stream: the clean runs stay as they were
    cos0 = cosines(anchor, positive, negatives)
    # dL_i/ds for each cosine at initialisation (n x the mean's gradient = per-instance loss).
    grad0 = n * jax.grad(lambda c: instance_loss(c, lambda x: mapping(x, params=params)))(cos0)
    repulsion = grad0[:, 1:]
    hard_share = jnp.sum(jnp.where(hard, repulsion, 0.0)) / jnp.sum(repulsion)

    def perturbed(views, key):
      """Fresh random perturbations of every vector (augmented views), or the views themselves."""
      if config.augment == 0:
        return views
      keys = jax.random.split(key, len(views))
      return tuple(losses.l2_normalize(v + config.augment * jax.random.normal(k, v.shape) / d**0.5)
                   for v, k in zip(views, keys, strict=True))

    def step(carry, index):
      views, params, first = carry

      def loss_fn(views, params):
        views = perturbed(views, jax.random.fold_in(augment_key, index))
        return instance_loss(cosines(*views), lambda x: mapping(x, params=params))

      _, views, params, _ = sphere_study.sphere_step(
          loss_fn, views, params, lr=config.learning_rate, t_lr=config.t_learning_rate, scale=n)
      cos = cosines(*views)
      separated = cos[:, 0] - jnp.max(cos[:, 1:], axis=-1) >= config.margin
      first = jnp.where((first < 0) & separated, index + 1, first)
      return (views, params, first), None

    first = jnp.full((n,), -1, jnp.int32)
    (views, params, first), _ = jax.lax.scan(
        step, ((anchor, positive, negatives), params, first), jnp.arange(config.steps))
    cos = cosines(*views)
    return dict(
        positive_pull=jnp.mean(-grad0[:, 0]),
        hard_share=hard_share,
        first=first,
        final_positive=jnp.mean(cos[:, 0]),
        final_max_negative=jnp.mean(jnp.max(cos[:, 1:], axis=-1)),
        final_tau=jnp.exp(-params["t"]) if "t" in params else jnp.nan)

  over_seeds = jax.vmap(run_one, in_axes=(0, None))
  return jax.jit(jax.vmap(over_seeds, in_axes=(None, 0)))


def summarise(result) -> dict:
  result = jax.tree.map(np.asarray, result)
  first = result["first"].ravel()
  reached = first >= 0
  return dict(
      positive_pull=float(np.mean(result["positive_pull"])),
      hard_share=float(np.nanmean(result["hard_share"])),
      separated=float(np.mean(reached)),
      median_steps=float(np.median(first[reached])) if reached.any() else float("nan"),
      final_positive=float(np.mean(result["final_positive"])),
      final_max_negative=float(np.mean(result["final_max_negative"])),
      final_margin=float(np.mean(result["final_positive"] - result["final_max_negative"])),
      final_tau=float(np.mean(result["final_tau"])))


def _plot(workdir: str, rows: list[dict]) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
  for spec in dict.fromkeys(r["spec"] for r in rows):
    mine = [r for r in rows if r["spec"] == spec]
    h = [r["hard_fraction"] for r in mine]
    axes[0].plot(h, [r["positive_pull"] for r in mine], "o-", label=spec)
    axes[1].plot(h, [r["separated"] for r in mine], "o-", label=spec)
    axes[2].plot(h, [r["median_steps"] for r in mine], "o-", label=spec)
  titles = ("positive pull |dL/ds_pos| at init", "fraction separated at some step",
            "median steps to separation")
  for ax, title in zip(axes, titles, strict=True):
    ax.set(title=title, xlabel="fraction of hard negatives")
    ax.legend(fontsize=7)
  axes[0].set_yscale("log")
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, "hard_negatives.png"), dpi=110)
  plt.close(fig)


COLUMNS = ("spec", "hard_fraction", "positive_pull", "hard_share", "separated", "median_steps",
           "final_positive", "final_max_negative", "final_margin", "final_tau")


#: The most embedding values one seed's instances may hold (`instances × (negatives + 2) ×
#: dim`): 2^31 float32 values are 8 GiB, past what this study needs by orders of magnitude.
MAX_VALUES = 2**31


def check_config(config) -> None:
  """Each field's type and range, the mappings, and the size of one seed's instances.

  Raises:
    ConfigError: naming the first bad field.
  """
  plan.check_fields(config, positive=("seeds", "instances", "num_negatives", "dim", "steps"),
                    non_negative=("seed",), positive_numbers=("learning_rate",),
                    non_negative_numbers=("t_learning_rate", "augment", "hard_gap", "easy_spread",
                                          "margin"))
  values = config.instances * (config.num_negatives + 2) * config.dim
  if values > MAX_VALUES:
    raise plan.ConfigError(
        f"config.dim={config.dim} with config.instances={config.instances} and "
        f"config.num_negatives={config.num_negatives} makes {values:.3g} embedding values per "
        f"seed; at most {MAX_VALUES:.3g} (lower dim, instances or negatives).")
  if not all(isinstance(h, (int, float)) and 0 <= h <= 1 for h in config.hard_fractions):
    raise plan.ConfigError(f"config.hard_fractions must be numbers in [0, 1], got "
                           f"{config.hard_fractions!r}.")
  with plan.config_errors("config.mappings: "):
    for spec in config.mappings:
      mappings.from_spec(spec)


@sweep.study
def train_and_evaluate(config, workdir: str) -> list[dict]:
  """Trains every mapping's instances at every hard fraction (`check_config` passed); writes
  `results.csv`, `results.md` and `hard_negatives.png`."""
  keys = jax.random.split(jax.random.key(config.seed), config.seeds)
  rows = []
  n_hard = jnp.asarray([round(h * config.num_negatives) for h in config.hard_fractions])
  for spec in tqdm.tqdm(config.mappings, desc="hard negatives"):
    mapping = mappings.from_spec(spec)
    results = make_runner(mapping, config=config)(keys, n_hard)
    for i, h in enumerate(config.hard_fractions):
      row = dict(spec=mapping.spec, hard_fraction=h, seeds=config.seeds,
                 instances=config.instances, num_negatives=config.num_negatives, steps=config.steps)
      row.update(summarise(jax.tree.map(lambda x, i=i: x[i], results)))
      rows.append(row)
  tables.write_results(workdir, rows, markdown=results_markdown(rows, config),
                       figures=[lambda path: _plot(path, rows)] if config.plots else [])
  return rows


def results_markdown(rows: list[dict], config, command: str | None = None) -> str:
  """`results.md` of `rows` made with `config` by `command` (default: the one running)."""
  return tables.study_markdown(
      rows, title="Hard negatives", columns=COLUMNS, command=command, notes=NOTES.format(
          config=config, lr=config.learning_rate,
          augment_note=AUGMENT_NOTE.format(config=config) if config.augment else ""))


NOTES = """\
{config.seeds} seeds x {config.instances} instances, K = {config.num_negatives} negatives in d =
{config.dim}; positive cosine {config.s_pos} at the start, hard negatives at cosine in
[{config.s_pos} - {config.hard_gap}, {config.s_pos}], easy ones in [-{config.easy_spread},
{config.easy_spread}]. Riemannian SGD, lr = {lr} on the per-instance loss, {config.steps}
steps. `positive_pull` = mean |dL/ds_pos| at the start (the gradient scale of Eq. 4/7/13),
`hard_share` = share of the total repulsion sum_j dL/ds_j that goes to hard negatives, `separated`
= fraction of instances whose positive cosine exceeds every negative's by {config.margin} at some
step, `median_steps` the median first such step.{augment_note}
"""


AUGMENT_NOTE = """
Augmented views: at every step the loss sees each vector v perturbed,
normalize(v + {config.augment} n), n ~ N(0, I/d) drawn afresh, so positives cannot align perfectly;
the cosines reported (and the separation) are those of the unperturbed vectors."""


EXPERIMENT = experiment.Experiment(
    name="hard_negatives", kind="study", train_and_evaluate=train_and_evaluate,
    check_config=check_config, configs=("experiments/configs/hard_negatives.py",),
    default_config=DEFAULT_CONFIG, results_markdown=results_markdown)

if __name__ == "__main__":
  EXPERIMENT.main()
