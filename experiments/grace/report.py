"""Tables and plot of `experiments.grace`: Table 3 (F1 per loss beside the paper) and free minus
each loss paired by seed; test F1-micro of every run; the probe's tables (`grace.probe`)."""

from __future__ import annotations

import numpy as np

from experiments.framework import tables

# `probe_best_epoch`: the linear probe's epoch with the best validation F1 (PyGCL's
# LREvaluator), not a training epoch of GRACE.
COLUMNS = ("dataset", "spec", "seed", "f1_micro", "f1_macro", "val_f1_micro",
           "probe_best_epoch", "final_loss", "final_t", "train_seconds", "epochs", "final_bias")

# Table 3 (CiteSeer, 20 runs): F1-micro (std), F1-macro (std), in %.
PAPER_TABLE3 = {
    "tau=0.1": (58.94, 3.17, 53.41, 2.72),
    "tau=0.25": (62.50, 2.92, 56.73, 2.87),
    "tau=0.5": (67.33, 3.02, 60.47, 2.82),
    "tau=1": (67.05, 3.02, 60.03, 2.47),
    "free": (67.95, 2.10, 60.56, 2.09),
}
EXAMPLE = "free,tau=0.5"


def summarize(rows: list[dict], specs: list[str]) -> list[dict]:
  """Mean and std (in %) of F1 per loss, in `specs` order, with the paper's numbers."""
  table = []
  for spec in specs:
    runs = [r for r in rows if r["spec"] == spec]
    if not runs:
      continue
    micro, micro_std = tables.mean_std([100 * float(r["f1_micro"]) for r in runs])
    macro, macro_std = tables.mean_std([100 * float(r["f1_macro"]) for r in runs])
    table.append({"spec": spec, "runs": len(runs), "micro": micro, "micro_std": micro_std,
                  "macro": macro, "macro_std": macro_std, "paper": PAPER_TABLE3.get(spec)})
  return table


def cell(mean: float, std: float) -> str:
  """`mean (std)`, or `mean (n=1)` where one value has no std."""
  return f"{mean:.2f} ({std:.2f})" if np.isfinite(std) else f"{mean:.2f} (n=1)"


def table3(rows: list[dict], specs: list[str], *, dataset: str, command: str,
           epochs: int) -> str:
  """Markdown: F1 per loss beside the paper's Table 3, and free minus each loss paired by
  seed (`tables.paired_differences`)."""
  table = summarize(rows, specs)
  paired = tables.paired_differences(rows, specs, metric="f1_micro")
  lines = [
      f"# GRACE on {dataset}: F1 (%) of node classification, mean (std) over seeds",
      "",
      f"Command: `{command}`",
      "",
      f"{epochs} training epochs per run; PyGCL LREvaluator (10% train / 10% val / 80% test). "
      "Paper: Kim & Kim, arXiv 2501.17683, Table 3 (CiteSeer, 20 runs).",
      "",
      "| loss | runs | F1-micro (ours) | F1-micro (paper) | F1-macro (ours) "
      "| F1-macro (paper) |",
      "|---|---|---|---|---|---|",
  ]
  for row in table:
    paper = row["paper"]
    paper_micro = cell(paper[0], paper[1]) if paper and dataset == "citeseer" else "-"
    paper_macro = cell(paper[2], paper[3]) if paper and dataset == "citeseer" else "-"
    lines.append(f"| {row['spec']} | {row['runs']} | {cell(row['micro'], row['micro_std'])} | "
                 f"{paper_micro} | {cell(row['macro'], row['macro_std'])} | {paper_macro} |")
  lines += tables.paired_markdown(
      paired, caption="free minus each loss, F1-micro points, paired by seed (same init, "
      "views and split):")
  return "\n".join(lines) + "\n"


def write_plot(file, rows: list[dict], specs: list[str], *, dataset: str) -> None:
  """Test F1-micro of every run per loss, its mean and std, and the paper's Table 3."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  table = summarize(rows, specs)
  fig, ax = plt.subplots(figsize=(1.2 * len(table) + 2, 3.5))
  for i, row in enumerate(table):
    values = [100 * float(r["f1_micro"]) for r in rows if r["spec"] == row["spec"]]
    ax.scatter(np.full(len(values), i), values, s=12, alpha=0.6, color="C0",
               label="ours (runs)" if i == 0 else None)
    ax.errorbar(i, row["micro"], yerr=0 if row["runs"] < 2 else row["micro_std"], fmt="o",
                color="C0", capsize=4)
    if row["paper"] and dataset == "citeseer":
      ax.errorbar(i + 0.2, row["paper"][0], yerr=row["paper"][1], fmt="s", color="C3",
                  capsize=4, label="paper Table 3" if i == 0 else None)
  ax.set_xticks(range(len(table)), [row["spec"] for row in table], rotation=20)
  ax.set_ylabel("test F1-micro (%)")
  ax.set_title(f"GRACE on {dataset}")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(file, dpi=120)
  plt.close(fig)


# What the sweep writes, and what `experiments.regenerate` rebuilds from `results.csv`.
results_markdown = tables.sweep_markdown(table3, example=EXAMPLE)
plot = tables.sweep_plot(write_plot, example=EXAMPLE)


# -- the probe's tables (`experiments.grace.probe`) --------------------------------------------


PROBE_COLUMNS = ("dataset", "spec", "seed", "train_fraction", "val_fraction", "test_nodes",
                 "draw", "f1_micro", "f1_macro", "val_f1_micro")


def split_name(train_fraction: float, val_fraction: float) -> str:
  test = 1.0 - train_fraction - val_fraction
  return f"{100 * train_fraction:.0f} / {100 * val_fraction:.0f} / {100 * test:.0f} %"


def _probe_tables(rows: list[dict], *, command: str, agreement: float | None) -> str:
  """Per split: F1-micro at draw 0 over seeds, the std over draws within a run, and free minus
  each loss paired by seed."""
  specs = list(dict.fromkeys(r["spec"] for r in rows))
  lines = [f"# GRACE on {rows[0]['dataset']}: the same encoders under other probe splits", "",
           f"Command: `{command}`", "",
           "Each run's final encoder, probed with PyGCL's LREvaluator under each split "
           "(train / validation / test). Draw 0 uses the run's own evaluation key; the "
           "within-run std is over the draws (new split and probe initialisation, same "
           "encoder).", ""]
  if agreement is not None:
    lines += [f"Draw 0 under the workdir's own split reproduces `result.json`: largest "
              f"|difference| {agreement:.2g} F1-micro.", ""]
  for val_fraction in dict.fromkeys(r["val_fraction"] for r in rows):
    split = [r for r in rows if r["val_fraction"] == val_fraction]
    first = [r for r in split if r["draw"] == 0]
    lines += [f"## Split {split_name(split[0]['train_fraction'], val_fraction)} "
              f"({split[0]['test_nodes']} test nodes)", "",
              "| loss | seeds | F1-micro, draw 0 (std over seeds) | F1-macro, draw 0 "
              "| within-run std over draws |", "|---|---|---|---|---|"]
    for spec in specs:
      ours = [r for r in first if r["spec"] == spec]
      micro = tables.mean_std([100 * r["f1_micro"] for r in ours])
      macro = tables.mean_std([100 * r["f1_macro"] for r in ours])
      within = [tables.mean_std([100 * r["f1_micro"] for r in split
                                 if r["spec"] == spec and r["seed"] == seed])[1]
                for seed in dict.fromkeys(r["seed"] for r in ours)]
      spread = f"{np.sqrt(np.mean(np.square(within))):.2f}" if np.all(np.isfinite(within)) \
          else "-"
      lines.append(f"| {spec} | {len(ours)} | {cell(*micro)} | {cell(*macro)} | {spread} |")
    lines += tables.paired_markdown(
        tables.paired_differences(first, specs, metric="f1_micro"),
        caption="free minus each loss, F1-micro points at draw 0, paired by seed:")
    lines.append("")
  return "\n".join(lines)


def probe_markdown(rows: list[dict], *, command: str, recorded: list[dict],
                   val_fraction: float) -> str:
  """`probe_splits.md` of `rows`, checked against the sweep's `recorded` results: draw 0 under
  the sweep's own split (`val_fraction`) should reproduce each run's F1-micro."""
  own = {(r["spec"], int(r["seed"])): float(r["f1_micro"]) for r in recorded}
  differences = [abs(r["f1_micro"] - own[r["spec"], r["seed"]]) for r in rows
                 if r["val_fraction"] == val_fraction and r["draw"] == 0
                 and (r["spec"], r["seed"]) in own]
  return _probe_tables(rows, command=command,
                       agreement=max(differences) if differences else None)


def probe_committed_markdown(rows: list[dict], *, command: str, name: str, committed) -> str:
  """`probe_markdown` of the committed table `NAME` (`NAME_splits` beside its sweep's `NAME`;
  `committed(name) -> (rows, config)`): what `experiments.regenerate` rebuilds it with."""
  recorded, config = committed(name.removesuffix("_splits"))
  return probe_markdown(rows, command=command, recorded=recorded,
                        val_fraction=config.val_fraction)
