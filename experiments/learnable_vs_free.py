r"""Learnable temperature vs temperature-free: Eq. 10's stuck t, and numerics as C -> 1.

Part 1 (Eq. 10): M pairs start exactly orthogonal (every cosine 0, so dL/dt = 0
at step 0 for every t) and are trained with CLIP's learnable `exp(t) cos`
(Eq. 8) or the free mapping (Eq. 11); a random start (positive cosine ~ 0.5) is the
control. We follow t, |dL/dt|, the positive cosine C and the loss.

Part 2 (precision): pairs trained towards perfect alignment with embeddings
stored in float32 or bfloat16; at each snapshot the loss the library computes
is compared with a float64 NumPy evaluation of the same stored embeddings.

Run: python -m experiments.learnable_vs_free --config=experiments/configs/learnable_vs_free.py \
  --workdir=DIR
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from experiments.framework import experiment, plan, sphere_study, sweep, tables
from tfcl_jax import langevin, losses, mappings

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                              "learnable_vs_free.py")
DTYPES = ("float32", "bfloat16")


def orthogonal_pairs(m: int, d: int) -> tuple[jax.Array, jax.Array]:
  """`z1[i] = e_i`, `z2[i] = e_(m+i)`: every cross-view cosine is exactly 0 (needs d >= 2m)."""
  if d < 2 * m:
    raise ValueError(f"orthogonal pairs need d >= 2m, got m={m}, d={d}.")
  eye = jnp.eye(d, dtype=jnp.float32)
  return eye[:m], eye[m:2 * m]


def correlated_pairs(key, m: int, d: int, *, cos: float) -> tuple[jax.Array, jax.Array]:
  """Random pairs whose positive cosine is `cos` (the view is rotated away from its anchor)."""
  key1, key2 = jax.random.split(key)
  z1 = langevin.random_sphere(key1, (m, d))
  away = langevin.tangent(z1, jax.random.normal(key2, (m, d)))
  away = losses.l2_normalize(away)
  return z1, cos * z1 + math.sqrt(1.0 - cos**2) * away


def stuck_t_runner(mapping: mappings.Mapping, *, steps: int, lr: float, t_lr: float):
  """A jitted `(z1 [S, M, d], z2 [S, M, d]) -> records [S, steps]` over S starts.

  Trains `(z1, z2, t)` jointly; records per step t, |dL/dt|, mean positive cosine C, loss.
  """

  def loss_fn(views, params):
    return sphere_study.mean_loss(*views, mapping.bind(params=params), "cross")

  def step(carry, _):
    views, params = carry
    loss, new_views, new_params, (_, param_grads) = sphere_study.sphere_step(
        loss_fn, views, params, lr=lr, t_lr=t_lr, scale=views[0].shape[0])
    record = dict(
        t=params.get("t", jnp.nan),
        dt=jnp.abs(param_grads["t"]) if "t" in param_grads else jnp.nan,
        C=jnp.mean(jnp.sum(views[0] * views[1], axis=-1)),
        loss=loss)
    return (new_views, new_params), record

  def run(z1, z2):
    return jax.lax.scan(step, ((z1, z2), dict(mapping.params)), None, length=steps)[1]

  return jax.jit(jax.vmap(run))


def _steps_until(values: np.ndarray, condition) -> float:
  hits = np.flatnonzero(condition(values))
  return float(hits[0]) if hits.size else float("nan")


def stuck_t_study(config) -> tuple[list[dict], dict]:
  rows, curves = [], {}
  m, d = config.stuck.m, config.stuck.d
  starts = {"orthogonal": orthogonal_pairs(m, d),
            "random C=0.5": correlated_pairs(jax.random.key(config.seed), m, d, cos=0.5)}
  z1s, z2s = (jnp.stack(views) for views in zip(*starts.values(), strict=True))
  for spec in tqdm.tqdm(config.stuck.mappings, desc="stuck t"):
    mapping = mappings.from_spec(spec)
    runner = stuck_t_runner(mapping, steps=config.stuck.steps, lr=config.stuck.learning_rate,
                            t_lr=config.stuck.t_learning_rate)
    batch = runner(z1s, z2s)
    for index, start in enumerate(starts):
      records = jax.tree.map(lambda x, i=index: np.asarray(x[i]), batch)
      curves[(spec, start)] = records
      rows.append(_stuck_row(records, spec, start, config))
  order = list(starts)
  rows.sort(key=lambda row: order.index(row["start"]))  # table grouped by start
  return rows, curves


def _stuck_row(records, spec: str, start: str, config) -> dict:
  t0 = records["t"][0]
  row = dict(part="stuck_t", start=start, spec=spec, C0=float(records["C"][0]),
             t0=float(t0), dLdt_step0=float(records["dt"][0]))
  for k in config.stuck.report_steps:
    row[f"t@{k}"] = float(records["t"][k])
    row[f"C@{k}"] = float(records["C"][k])
  moved = np.abs(records["t"] - t0) > 0.1
  row["steps_until_t_moves_0.1"] = _steps_until(moved, lambda m: m)
  row["steps_until_C_0.9"] = _steps_until(records["C"], lambda c: c > 0.9)
  row["final_loss"] = float(records["loss"][-1])
  return row




def free_logits_f64(cos: np.ndarray) -> np.ndarray:
  """Eq. 11 in float64 without any clamp: the reference the library's value is compared with."""
  return np.log1p(cos) - np.log1p(-cos)


def reference_loss(z1, z2, spec: str) -> float:
  """Symmetric cross InfoNCE of stored embeddings, in float64 NumPy (independent of the library)."""
  u1 = np.asarray(z1, np.float64)
  u2 = np.asarray(z2, np.float64)
  u1 /= np.linalg.norm(u1, axis=1, keepdims=True)
  u2 /= np.linalg.norm(u2, axis=1, keepdims=True)
  cos = np.clip(u1 @ u2.T, -1.0, 1.0)
  if spec == "free":
    logits = free_logits_f64(np.minimum(cos, 1.0 - 1e-300))
  else:
    logits = cos / float(spec.removeprefix("tau="))

  def one_way(logits):
    top = logits.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.sum(np.exp(logits - top), axis=1))
    return np.mean(lse - np.diag(logits))

  return 0.5 * (one_way(logits) + one_way(logits.T))


def precision_run(spec: str, dtype, *, key, config):
  """Trains pairs in `dtype` storage; returns snapshots of (z1, z2) and the computed loss."""
  p = config.precision
  mapping = mappings.from_spec(spec)
  key1, key2 = jax.random.split(key)
  z1 = langevin.random_sphere(key1, (p.m, p.d), dtype=dtype)
  z2 = langevin.random_sphere(key2, (p.m, p.d), dtype=dtype)

  def loss_fn(views, params):
    return sphere_study.mean_loss(*views, mapping, "cross")

  def block(views, _):
    def step(views, _):
      _, views, _, grads = sphere_study.sphere_step(
          loss_fn, views, {}, lr=p.learning_rate, t_lr=0.0, scale=p.m)
      return views, None

    views, _ = jax.lax.scan(step, views, None, length=p.every)
    loss, (grads, _) = jax.value_and_grad(loss_fn, argnums=(0, 1))(views, {})
    finite = jnp.isfinite(loss) & jnp.all(jnp.isfinite(grads[0])) & jnp.all(jnp.isfinite(grads[1]))
    return views, dict(z1=views[0], z2=views[1], loss=loss, finite=finite,
                       grad_norm=jnp.sqrt(jnp.sum(jnp.square(grads[0].astype(jnp.float32)))))

  _, snapshots = jax.jit(
      lambda views: jax.lax.scan(block, views, None, length=p.steps // p.every))((z1, z2))
  return jax.tree.map(np.asarray, snapshots)


def precision_study(config) -> tuple[list[dict], dict]:
  p = config.precision
  rows, curves = [], {}
  # 1 - c where the free mapping's clamp starts (its gradient is 0 beyond): 2 / (1 + e^max_logit).
  clamp_gap = 2.0 / (1.0 + math.exp(mappings.max_free_logit("float32")))
  jobs = [(spec, dtype) for spec in p.mappings for dtype in p.dtypes]
  for spec, dtype_name in tqdm.tqdm(jobs, desc="precision"):
    snaps = precision_run(spec, jnp.dtype(dtype_name), key=jax.random.key(config.seed),
                          config=config)
    gaps, rel_errors, past_clamp = [], [], []
    for z1, z2, loss in zip(snaps["z1"], snaps["z2"], snaps["loss"], strict=True):
      u1 = np.asarray(z1, np.float64)
      u2 = np.asarray(z2, np.float64)
      cos = np.sum(u1 * u2, axis=1) / np.linalg.norm(u1, axis=1) / np.linalg.norm(u2, axis=1)
      gaps.append(max(1.0 - float(np.min(cos)), 0.0))
      past_clamp.append(float(np.mean(1.0 - cos <= clamp_gap)))
      reference = reference_loss(z1, z2, spec)
      rel_errors.append(abs(float(loss) - reference) / max(abs(reference), 1e-300))
    gaps, rel_errors = np.asarray(gaps), np.asarray(rel_errors)
    final_reference = reference_loss(snaps["z1"][-1], snaps["z2"][-1], spec)
    curves[(spec, dtype_name)] = dict(gap=gaps, rel_error=rel_errors, loss=snaps["loss"],
                                      grad_norm=snaps["grad_norm"])
    rows.append(dict(
        part="precision", spec=spec, dtype=dtype_name,
        final_one_minus_C=float(gaps[-1]),
        final_loss=float(snaps["loss"][-1]),
        final_reference_loss=final_reference,
        final_abs_error=abs(float(snaps["loss"][-1]) - final_reference),
        final_rel_error=float(rel_errors[-1]),
        final_past_clamp=past_clamp[-1],
        max_rel_error=float(np.max(rel_errors)),
        final_grad_norm=float(snaps["grad_norm"][-1]),
        all_finite=bool(np.all(snaps["finite"]))))
  return rows, curves


def _plot(workdir: str, stuck_curves: dict, precision_curves: dict, config) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
  colors = {spec: f"C{i}" for i, spec in enumerate(dict.fromkeys(s for s, _ in stuck_curves))}
  for (spec, start), records in stuck_curves.items():
    style = dict(ls="-" if start == "orthogonal" else ":", color=colors[spec],
                 label=f"{spec}, {start}")
    if not np.all(np.isnan(records["t"])):
      axes[0].plot(records["t"], **style)
    axes[1].plot(records["C"], **style)
    axes[2].plot(records["loss"], **style)
  for ax, title in zip(axes, ("learnable t (log inverse temperature)", "mean positive cosine C",
                              "loss"), strict=True):
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_xscale("symlog", linthresh=10)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, "stuck_t.png"), dpi=110)
  plt.close(fig)

  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  every = config.precision.every
  for (spec, dtype), c in precision_curves.items():
    x = every * (1 + np.arange(len(c["gap"])))
    axes[0].plot(x, np.maximum(c["gap"], 1e-12), label=f"{spec} {dtype}")
    axes[1].plot(np.maximum(c["gap"], 1e-12), np.maximum(c["rel_error"], 1e-12), "o-", ms=2,
                 label=f"{spec} {dtype}")
  axes[0].set(title="1 - min positive cosine", xlabel="step", yscale="log")
  axes[1].set(title="|loss - float64 reference| / reference", xlabel="1 - min positive cosine",
              xscale="log", yscale="log")
  axes[1].invert_xaxis()
  for ax in axes:
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, "precision.png"), dpi=110)
  plt.close(fig)


def check_config(config) -> None:
  """Each part's sizes, steps and rates, its mappings, and that the orthogonal start fits.

  Raises:
    ConfigError: naming the first bad field.
  """
  plan.check_fields(
      config, non_negative=("seed",),
      positive=("stuck.m", "stuck.d", "stuck.steps", "precision.m", "precision.d",
                "precision.steps", "precision.every"),
      positive_numbers=("stuck.learning_rate", "precision.learning_rate"),
      non_negative_numbers=("stuck.t_learning_rate",))
  if config.stuck.d < 2 * config.stuck.m:
    raise plan.ConfigError(f"config.stuck.d must be >= 2 * config.stuck.m (orthogonal pairs), "
                           f"got m={config.stuck.m}, d={config.stuck.d}.")
  if not all(isinstance(k, int) and 0 <= k < config.stuck.steps
             for k in config.stuck.report_steps):
    raise plan.ConfigError(f"config.stuck.report_steps must be steps in [0, "
                           f"{config.stuck.steps}), got {config.stuck.report_steps!r}.")
  if config.precision.steps % config.precision.every:
    raise plan.ConfigError(f"config.precision.steps ({config.precision.steps}) must be a "
                           f"multiple of config.precision.every ({config.precision.every}).")
  unknown = [dtype for dtype in config.precision.dtypes if dtype not in DTYPES]
  if unknown:
    raise plan.ConfigError(f"config.precision.dtypes: unknown {unknown}; expected names from "
                           f"{', '.join(DTYPES)}.")
  for field in ("stuck.mappings", "precision.mappings"):
    with plan.config_errors(f"config.{field}: "):
      for spec in config[field]:
        mappings.from_spec(spec)
  not_referenced = [spec for spec in config.precision.mappings
                    if spec != "free" and not spec.startswith("tau=")]
  if not_referenced:
    raise plan.ConfigError(f"config.precision.mappings: the float64 reference computes free and "
                           f"tau=<value> only, got {not_referenced}.")


@sweep.study
def train_and_evaluate(config, workdir: str) -> list[dict]:
  """Runs both parts (`check_config` passed); writes `results.csv`, `results.md`,
  `stuck_t.png` and `precision.png`."""
  stuck_rows, stuck_curves = stuck_t_study(config)
  precision_rows, precision_curves = precision_study(config)
  # One CSV for both parts: the union of their columns, blanks where a part has none.
  columns = list(dict.fromkeys([*stuck_rows[0], *precision_rows[0]]))
  rows = [{c: row.get(c, "") for c in columns} for row in stuck_rows + precision_rows]
  tables.write_results(
      workdir, rows, markdown=results_markdown(rows, config),
      figures=[lambda path: _plot(path, stuck_curves, precision_curves, config)]
      if config.plots else [])
  return rows


def results_markdown(rows: list[dict], config, command: str | None = None) -> str:
  """`results.md` of `rows` (both parts, `part` naming each) by `command` (default: the one
  running); each part's table shows the columns it fills."""
  del config  # the notes name no config value

  def part(name, order=()):
    own = [row for row in rows if row["part"] == name]
    filled = [c for c in rows[0] if any(row[c] != "" for row in own)]
    columns = [c for c in order if c in filled] + [c for c in filled if c not in order]
    return [{c: row[c] for c in columns} for row in own]

  return tables.study_markdown(
      rows, title="Learnable temperature vs temperature-free", notes=NOTES, command=command,
      sections=[("Eq. 10: learnable t from an orthogonal start", part("stuck_t")),
                ("Precision as C -> 1", part("precision", PRECISION_COLUMNS))])


# The precision part's columns in the order its rows are built (the CSV puts the stuck part's
# columns first).
PRECISION_COLUMNS = ("part", "spec", "dtype", "final_one_minus_C", "final_loss")


NOTES = """\
Stuck t: `t0` the initial log inverse temperature, `dLdt_step0` = |dL/dt| at step 0 (Eq. 10: 0 at
C = 0), `t@k`/`C@k` after k steps, `steps_until_t_moves_0.1` the first step with |t - t0| > 0.1.
Precision: `final_one_minus_C` = 1 - min positive cosine of the stored embeddings (float64),
`final_loss` the library's loss, `final_reference_loss` a float64 NumPy evaluation without clamp
of the same embeddings, `abs_error`/`rel_error` their difference; `final_past_clamp` = fraction of
positive pairs with 1 - cos below the free mapping's float32 clamp (4.8e-7: zero gradient there).
"""


EXPERIMENT = experiment.Experiment(
    name="learnable_vs_free", kind="study", train_and_evaluate=train_and_evaluate,
    check_config=check_config, configs=("experiments/configs/learnable_vs_free.py",),
    default_config=DEFAULT_CONFIG, results_markdown=results_markdown)

if __name__ == "__main__":
  EXPERIMENT.main()
