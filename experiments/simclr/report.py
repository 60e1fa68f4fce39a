"""Tables and plots of `experiments.simclr` (SimCLR or SupCon): Table 2 (kNN top-1 mean +- std
per loss), the N-sensitivity table, training curves and geometry (alignment/uniformity) per
loss.
"""

from __future__ import annotations

import collections
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments.framework import tables  # noqa: E402
from tfcl_jax.training import outputs  # noqa: E402

COLUMNS = ("spec", "seed", "batch_size", "knn_top1", "linear_top1", "final_loss", "final_t",
           "steps", "final_bias")


# config.form -> the tables' name for SupCon in that form.
SUPCON_TITLES = {
    "supcon": "SupCon (form supcon: Khosla et al.'s L_out)",
    "ntxent": "SupCon (form ntxent: each positive pair against the negatives only)",
}
CURVE = "knn_top1@"  # result columns of the kNN top-1 during training: knn_top1@<step>


def write(results: list[dict], workdir: str, *, config, command: str, run_dirs: list[str],
          figures: bool = True) -> None:
  """`results.csv` (one row per run, its kNN curve in `knn_top1@<step>` columns), `results.md`
  (`results_markdown`) and, with `figures`, the plots (`write_plots`) of the runs in
  `run_dirs` (in `results` order)."""
  curve_columns = list(dict.fromkeys(k for row in results for k in row if k.startswith(CURVE)))
  tables.write_results(
      workdir, results, columns=[*COLUMNS, *curve_columns],
      markdown=results_markdown(results, config, command),
      figures=[lambda path: write_plots(results, path, mode=config.mode, run_dirs=run_dirs)]
      if figures else ())


def results_markdown(rows: list[dict], config, command: str) -> str:
  """`results.md` of `rows` made with `config` by `command`: Table 2 (or the N table) and the
  kNN during training; what a sweep writes and what `experiments.regenerate` rebuilds from
  `results.csv`."""
  sweep = config.mode != "n_sensitivity"
  objective = SUPCON_TITLES[config.form] if config.objective == "supcon" else "SimCLR"
  name = f"{objective} on {config.dataset}"
  title = (f"# {name}: kNN top-1 per loss, {config.epochs} epochs" if sweep
           else f"# {name}: kNN top-1 against the batch size N")
  body = (table2(rows, knn_k=config.knn_k, knn_tau=config.knn_tau) + training_table(rows)
          if sweep else n_table(rows))
  return "\n".join([title, "", f"Command: `{command}`", "", body.rstrip()]) + "\n"


def _groups(results, key):
  groups = collections.defaultdict(list)
  for row in results:
    groups[key(row)].append(row)
  return groups


def _mean_std(values) -> str:
  values = 100 * np.asarray(values, float)
  std = values.std(ddof=1) if len(values) > 1 else float("nan")
  return f"{values.mean():.2f} ± {std:.2f}"


def _paired_cell(row: dict) -> str:
  """`free − loss` in points, paired by seed: mean (s.e.), p and free's wins."""
  if row["seeds"] < 2:
    return f"{row['mean']:+.2f}"
  return (f"{row['mean']:+.2f} ({row['sem']:.2f}), p = {row['p_value']:.2g}, "
          f"{row['wins']}/{row['seeds']}")


def table2(results: list[dict], *, knn_k: int = 200, knn_tau: float = 0.1) -> str:
  """A Markdown table shaped like the paper's Table 2: kNN and linear top-1 per loss and,
  with a `free` row, `free − loss` paired by seed; plus best against worst, paired.

  A seed fixes the initialisation, the views and the data order of every loss's run, so
  per-seed differences (paired t-test, `tables.paired_differences`) cancel that noise.
  """
  groups = _groups(results, lambda row: row["spec"])
  has_probe = all("linear_top1" in row for row in results)
  against_free = "free" in groups and len(groups) > 1
  paired = ({row["spec"]: row for row in tables.paired_differences(
      results, list(groups), metric="knn_top1")} if against_free else {})
  header = ("| loss | kNN top-1 (%) | " + ("linear top-1 (%) | " if has_probe else "")
            + ("kNN: free − loss, paired by seed (s.e.), p, free wins | "
               if against_free else "") + "seeds |")
  lines = [header, "|---|---|" + ("---|" if has_probe else "") + ("---|" if against_free else "")
           + "---|"]
  for spec, rows in groups.items():
    knn_values = [r["knn_top1"] for r in rows]
    cells = [spec, _mean_std(knn_values)]
    if has_probe:
      cells.append(_mean_std([r["linear_top1"] for r in rows]))
    if against_free:
      cells.append(_paired_cell(paired[spec]) if spec in paired else "")
    lines.append("| " + " | ".join(cells + [str(len(rows))]) + " |")
  lines.append("")
  lines.append(f"Mean ± sample std over seeds; kNN: k = {knn_k}, τ_kNN = {knn_tau:g} on backbone "
               "features.")
  means = {m: np.mean([r["knn_top1"] for r in rows]) for m, rows in groups.items()}
  if len(means) >= 2 and all(len(rows) >= 2 for rows in groups.values()):
    best, worst = max(means, key=means.get), min(means, key=means.get)
    test = tables.paired_differences(results, [best, worst], metric="knn_top1",
                                     reference=best)
    if test and test[0]["seeds"] >= 2:
      p_value = test[0]["p_value"]
      lines.append(
          f"Best `{best}` against worst `{worst}`: {test[0]['mean']:.2f} points, paired by "
          f"seed, t-test p = {p_value:.3g} ({'beyond' if p_value < 0.05 else 'within'} "
          f"seed noise at 5%).")
  return "\n".join(lines) + "\n"


def training_table(results: list[dict], *, columns: int = 6) -> str:
  """kNN top-1 during training: the mean over seeds of each loss's curve
  (`knn_top1@<step>` of its results) at up to `columns` evaluation steps spread evenly to the
  last, with `free − loss` paired by seed at the first and last of them; "" when the runs
  logged fewer than two evaluations.

  It tells a gap that closes with training (a slower start) from one that stays.
  """
  rows = []
  for result in results:
    curve = {int(k[len(CURVE):]): v for k, v in result.items()
             if k.startswith(CURVE) and v != ""}
    if curve:
      rows.append((result, curve))
  if not rows:
    return ""
  common = sorted(set.intersection(*(set(curve) for _, curve in rows)))
  if len(common) < 2:
    return ""
  steps = [common[int(i)] for i in
           dict.fromkeys(np.linspace(0, len(common) - 1, min(columns, len(common))).round())]
  groups = _groups(rows, lambda row: row[0]["spec"])
  ends = (steps[0], steps[-1]) if "free" in groups else ()
  paired = {step: {row["spec"]: row for row in tables.paired_differences(
      [{**result, "knn_top1": curve[step]} for result, curve in rows], list(groups),
      metric="knn_top1")} for step in ends}
  lines = ["", "kNN top-1 (%) during training, mean over seeds at each evaluation step"
           + (" (free − loss paired by seed at the first and last):" if ends else ":"), "",
           "| loss | " + " | ".join(f"step {step:g}" for step in steps)
           + "".join(f" | free − loss, step {step:g}" for step in ends) + " |",
           "|---|" + "---|" * (len(steps) + len(ends))]
  for spec, members in groups.items():
    cells = [f"{100 * np.mean([curve[step] for _, curve in members]):.2f}" for step in steps]
    cells += [_paired_cell(paired[step][spec]) if spec in paired[step] else ""
              for step in ends]
    lines.append(f"| {spec} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def n_table(results: list[dict]) -> str:
  """kNN top-1 per loss (rows) and batch size N (columns); with `free`, a row of
  `free − loss` paired by seed at each N for every other loss."""
  sizes = sorted({row["batch_size"] for row in results})
  groups = _groups(results, lambda row: (row["spec"], row["batch_size"]))
  specs = list(dict.fromkeys(row["spec"] for row in results))
  lines = ["| loss | " + " | ".join(f"N = {n}" for n in sizes) + " | spread (max - min) |",
           "|---|" + "---|" * (len(sizes) + 1)]
  for spec in specs:
    means = [np.mean([r["knn_top1"] for r in groups[(spec, n)]]) for n in sizes
             if (spec, n) in groups]
    cells = [_mean_std([r["knn_top1"] for r in groups[(spec, n)]]) if (spec, n) in groups
             else "-" for n in sizes]
    spread = 100 * (max(means) - min(means)) if means else float("nan")
    lines.append(f"| {spec} | " + " | ".join(cells) + f" | {spread:.2f} |")
  if "free" in specs:
    for spec in specs:
      if spec == "free":
        continue
      cells = []
      for n in sizes:
        paired = tables.paired_differences(
            [r for r in results if r["batch_size"] == n], ["free", spec], metric="knn_top1")
        cells.append(f"{paired[0]['mean']:+.2f} ({paired[0]['p_value']:.2g}, "
                     f"{paired[0]['wins']}/{paired[0]['seeds']})" if paired else "-")
      lines.append(f"| free − {spec}, paired (p, free wins) | " + " | ".join(cells) + " | |")
  lines.append("")
  lines.append("kNN top-1 (%), mean ± std over seeds; same epochs at every N, lr scaled by N/256.")
  return "\n".join(lines) + "\n"


def _mean_curve(run_dirs, file_name, column):
  curves = [outputs.read_csv(os.path.join(d, file_name)) for d in run_dirs]
  curves = [c for c in curves if column in c]
  if not curves:
    return None, None
  length = min(len(c[column]) for c in curves)
  return curves[0]["step"][:length], np.mean([c[column][:length] for c in curves], axis=0)


def write_plots(results: list[dict], workdir: str, *, mode: str, run_dirs: list[str]) -> None:
  """accuracy.png (or n_sensitivity.png), curves.png, geometry.png in `workdir`."""
  dirs_by_key = _groups(
      [{"dir": d, **r} for d, r in zip(run_dirs, results, strict=True)],
      lambda row: (row["spec"], row["batch_size"]))
  specs = list(dict.fromkeys(row["spec"] for row in results))
  if mode == "n_sensitivity":
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for spec in specs:
      sizes = sorted(n for m, n in dirs_by_key if m == spec)
      values = [[r["knn_top1"] * 100 for r in dirs_by_key[(spec, n)]] for n in sizes]
      ax.errorbar(sizes, [np.mean(v) for v in values], [np.std(v) for v in values], marker="o",
                  capsize=3, label=spec)
    ax.set(xscale="log", xlabel="batch size N", ylabel="kNN top-1 (%)")
    ax.minorticks_off()
    ax.set_xticks(sorted({n for _, n in dirs_by_key}), labels=sorted({n for _, n in dirs_by_key}))
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(workdir, "n_sensitivity.png"), dpi=120)
    plt.close(fig)
  else:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for index, spec in enumerate(specs):
      values = [r["knn_top1"] * 100 for r in results if r["spec"] == spec]
      ax.bar(index, np.mean(values), yerr=np.std(values), capsize=4, color=f"C{index}", alpha=0.6)
      ax.plot([index] * len(values), values, "k.", ms=4)
    ax.set_xticks(range(len(specs)), labels=specs, rotation=20)
    ax.set_ylabel("kNN top-1 (%)")
    lows = [r["knn_top1"] * 100 for r in results]
    ax.set_ylim(max(0, min(lows) - 5), min(100, max(lows) + 3))
    fig.tight_layout()
    fig.savefig(os.path.join(workdir, "accuracy.png"), dpi=120)
    plt.close(fig)
  panels = [(outputs.METRICS_FILE, "loss"), (outputs.METRICS_FILE, "grad_norm"),
            (outputs.METRICS_FILE, "pos_cos"), (outputs.METRICS_FILE, "neg_cos")]
  geometry_panels = [(outputs.EVAL_FILE, "knn_top1"), (outputs.EVAL_FILE, "alignment"),
                     (outputs.EVAL_FILE, "uniformity")]
  for name, chosen in (("curves.png", panels), ("geometry.png", geometry_panels)):
    fig, axes = plt.subplots(1, len(chosen), figsize=(4 * len(chosen), 3.2))
    for ax, (file_name, column) in zip(axes, chosen, strict=True):
      for (spec, batch_size), rows in dirs_by_key.items():
        steps, curve = _mean_curve([r["dir"] for r in rows], file_name, column)
        if steps is not None:
          label = spec if mode == "sweep" else f"{spec} N={batch_size}"
          ax.plot(steps, curve, label=label, marker="." if file_name == outputs.EVAL_FILE else None)
      ax.set(xlabel="step", title=column + (" ||dL/dW||" if column == "grad_norm" else ""))
      if column == "grad_norm":
        ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(workdir, name), dpi=120)
    plt.close(fig)
