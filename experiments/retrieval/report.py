"""The tables and the figure of the two-tower retrieval sweep (`experiments.retrieval`)."""

from __future__ import annotations

import math

import numpy as np

from experiments.framework import plan, tables
from tfcl_jax import losses, mappings

KS = (1, 5, 10, 50, 100)
METRICS = (*(f"top@{k}" for k in KS), "ndcg@10")
COLUMNS = ("dataset", "spec", "seed", *METRICS, "final_loss", "scale_start", "scale_end",
           "scale_max", "epochs", "steps", "train_seconds", "seconds_per_epoch")
EXAMPLE = "free,clip:learnable=0.07:100"
POPULARITY = "popularity"  # not trained: movies ranked by their count in the training pairs
# TensorFlow Recommenders' retrieval tutorial: test top-k accuracy printed by two executed
# copies of its page (dot-product softmax, ids only, 3 epochs; its shuffles are TensorFlow's).
TUTORIAL_PUBLISHED = {"top@1": (0.00105, 0.00100), "top@5": (0.00975, 0.00870),
                      "top@10": (0.02240, 0.02115), "top@50": (0.12480, 0.12180),
                      "top@100": (0.23250, 0.23340)}



def columns(config) -> tuple[str, ...]:
  """The CSV's columns: `COLUMNS`, then the scale after each epoch (`scale@<epoch>`)."""
  return (*COLUMNS, *(f"scale@{e}" for e in range(1, config.epochs + 1)))



# -- tables -----------------------------------------------------------------------------------


def reference(spec: str, present) -> str:
  """The free loss a spec is paired with: CLIP's and the sigmoid loss's against
  `clip:free`, corrected ones against `free+logq`, the others against `free`."""
  if spec.startswith(("clip:", "sigmoid/")) and "clip:free" in present:
    return "clip:free"
  if spec.endswith("+logq") and "free+logq" in present:
    return "free+logq"
  return "free"


def _cell(values, digits: int = 4) -> str:
  mean, std = tables.mean_std(values)
  return f"{mean:.{digits}f} ± {std:.{digits}f}" if np.isfinite(std) else f"{mean:.{digits}f}"


def table(rows: list[dict], specs: list[str], *, config, command: str) -> str:
  """Markdown: metrics per loss, the tutorial's published numbers, paired differences
  against each loss's free counterpart, and the learnable scales."""
  present = [spec for spec in specs if any(r["spec"] == spec for r in rows)]
  of = lambda spec, key: [float(r[key]) for r in rows if r["spec"] == spec]  # noqa: E731
  towers_text = (f"query features {config.query_features}; candidate features "
                 f"{config.candidate_features}; width {config.dim}"
                 + (f", hidden {config.hidden_dims}" if str(config.hidden_dims).strip() else ""))
  split = (f"random {config.train_fraction:g} split (seed {config.split_seed})"
           if config.split == "random" else "leave-last-out split")
  lines = [
      f"# Two-tower retrieval on {config.dataset}: top-k accuracy against every movie",
      "",
      f"Command: `{command}`",
      "",
      f"{split}; {towers_text}; {config.optimizer} {config.learning_rate:g}, batch "
      f"{config.batch_size}, {config.epochs} epochs, {config.reduction} reduction; test "
      "metrics after the last epoch, mean ± sample std over seeds; each test movie ranked "
      "against all movies"
      + (" except the user's training movies." if config.exclude_seen else "."),
      "",
      "| loss | top-10 | top-50 | top-100 | NDCG@10 | seeds | s / run |",
      "|---|---|---|---|---|---|---|",
  ]
  for spec in present:
    lines.append(f"| {spec} | " + " | ".join(_cell(of(spec, m)) for m in (
        "top@10", "top@50", "top@100", "ndcg@10"))
        + f" | {len(of(spec, 'seed'))} | {np.mean(of(spec, 'train_seconds')):.1f} |")
  if config.split == "random" and config.query_features == "user_id" and (
      config.candidate_features == "item_id"):
    lines += ["", "The tutorial's own test accuracy (its `dot` model; the range over two "
              "executed copies of its page, docs/retrieval.md): " + ", ".join(
                  f"{m.replace('@', '-')} {min(v):.5f}–{max(v):.5f}"
                  for m, v in TUTORIAL_PUBLISHED.items()) + "."]
  fixed = [s for s in present if s.startswith("tau=") and not s.endswith("+logq")]
  if fixed:
    best = max(fixed, key=lambda s: np.mean(of(s, "top@100")))
    lines += ["", f"Best fixed τ of the one-directional loss by mean top-100: `{best}`."]
  clip_fixed = [s for s in present if s.startswith("clip:tau=")]
  if clip_fixed:
    best = max(clip_fixed, key=lambda s: np.mean(of(s, "top@100")))
    lines += [f"Best fixed τ of CLIP's loss by mean top-100: `{best}`."]
  for ref in dict.fromkeys(reference(s, present) for s in present):
    if ref not in present:
      continue
    group = [ref] + [s for s in present if s != ref and reference(s, present) == ref]
    paired = {metric: {row["spec"]: row for row in tables.paired_differences(
        rows, group, metric=metric, reference=ref, scale=100.0)}
              for metric in ("top@100", "top@10")}
    if not paired["top@100"]:
      continue
    lines += ["", f"`{ref}` minus each loss, in points of accuracy, paired by seed (same "
              "initialisation and batches): mean (s.e.), paired t-test p, seeds it wins.", "",
              "| loss | seeds | top-100 | p | wins | top-10 | p | wins |",
              "|---|---|---|---|---|---|---|---|"]
    for spec, row in paired["top@100"].items():
      cells = [f"{row['seeds']}"]
      for metric in ("top@100", "top@10"):
        d = paired[metric][spec]
        cells += [f"{d['mean']:+.2f} ({d['sem']:.2f})", f"{d['p_value']:.2g}",
                  f"{d['wins']}/{d['seeds']}"]
      lines.append(f"| {spec} | " + " | ".join(cells) + " |")
  scaled = [s for s in present if not math.isnan(np.mean(of(s, "scale_start")))]
  if scaled:
    lines += ["", "Logit scale over training: learnt, `exp(t)` (capped where the spec says), or "
              "solved from each batch (`calibrated_free`, `perplexity_free`'s mean over anchors, "
              f"`accuracy_free`, within [{mappings.S_MIN:g}, {mappings.S_MAX:g}]): start, end and "
              "largest value, mean over seeds; runs at a bound: the largest value at the cap, or "
              "for a solved scale at the top of its range or the last value at its floor.",
              "", "| loss | start | end | max | runs at a bound |", "|---|---|---|---|---|"]
    for spec in scaled:
      # Any candidate count builds the loss (a `prior` bias needs one).
      loss = losses.from_spec(spec, num_candidates=2)
      lows, highs = of(spec, "scale_end"), of(spec, "scale_max")
      if mappings.batch_scaled(loss.mapping):
        at_bound = sum(low <= mappings.S_MIN * (1 + 1e-4) or high >= mappings.S_MAX * (1 - 1e-4)
                       for low, high in zip(lows, highs, strict=True))
        bound = ""
      else:
        cap = mappings.max_logit_scale(loss.mapping)
        at_bound = sum(v >= cap - 1e-6 for v in highs) if cap else 0
        bound = "" if cap else " (no cap)"
      lines.append(f"| {spec} | {np.mean(of(spec, 'scale_start')):.2f} | "
                   f"{np.mean(lows):.2f} | {np.mean(highs):.2f}"
                   f" | {at_bound}/{len(of(spec, 'seed'))}{bound} |")
  return "\n".join(lines) + "\n"


def specs_of(config) -> list[str]:
  """The canonical loss specs of `config.losses`, each once; `popularity` names the untrained
  popularity ranking.

  Raises:
    ConfigError: an empty list or a malformed spec, naming `config.losses`.
  """
  return plan.loss_specs(config, example=EXAMPLE, others=(POPULARITY,))


def results_markdown(rows: list[dict], config, command: str) -> str:
  return table(rows, specs_of(config), config=config, command=command)


def write_plot(file, rows: list[dict], config) -> None:
  """Top-100 accuracy of every run per loss (left); the learnable scale's start, end
  and maximum per loss (right)."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  specs = [s for s in specs_of(config) if any(r["spec"] == s for r in rows)]
  fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.5),
                                    gridspec_kw={"width_ratios": [3, 1]})
  for i, spec in enumerate(specs):
    values = np.array([float(r["top@100"]) for r in rows if r["spec"] == spec])
    color = "C2" if "free" in spec else ("C1" if "learnable" in spec else "C0")
    left.scatter(np.full(values.size, i), values, s=10, alpha=0.5, color=color)
    left.errorbar(i, values.mean(), yerr=values.std(ddof=1) if values.size > 1 else 0,
                  fmt="o", color=color, capsize=3)
  left.set_xticks(range(len(specs)), specs, rotation=60, ha="right", fontsize=7)
  left.set_ylabel("test top-100 accuracy")
  learnable = [s for s in specs if any(r["spec"] == s and not math.isnan(float(
      r["scale_start"])) for r in rows)]
  epochs = np.arange(0, config.epochs + 1)
  for i, spec in enumerate(learnable):
    runs = [r for r in rows if r["spec"] == spec]
    curves = np.array([[float(r["scale_start"])] + [float(r[f"scale@{e}"]) for e in epochs[1:]]
                       for r in runs])
    for curve in curves:
      right.plot(epochs, curve, color=f"C{i}", alpha=0.25, lw=0.8)
    right.plot(epochs, curves.mean(axis=0), color=f"C{i}", lw=2, label=spec)
  right.axhline(100, color="grey", lw=0.8, ls="--")
  right.set_xlabel("epoch")
  right.set_ylabel("logit scale min(exp(t), cap)")
  right.set_yscale("log")
  if learnable:
    right.legend(fontsize=7)
  fig.suptitle(f"Two-tower retrieval on {config.dataset} ({config.split} split)")
  fig.tight_layout()
  fig.savefig(file, dpi=120)
  plt.close(fig)
