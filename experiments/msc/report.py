"""Tables and plot of `experiments.msc`: ROC-AUC per normal class and loss, Table 4 layout."""

from __future__ import annotations

import collections
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments.framework import tables  # noqa: E402

COLUMNS = ("spec", "seed", "normal_class", "roc_auc", "roc_auc_pretrained", "final_loss",
           "final_center_cos", "num_normal_train", "steps")
CLASS_NAMES = {
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                "truck"),
}
PRETRAINED = "pretrained (no MSC)"


def class_name(dataset: str, index: int) -> str:
  names = CLASS_NAMES.get(dataset)
  return names[index] if names else str(index)


def _table_rows(results: list[dict]) -> dict[str, dict[int, list[float]]]:
  """`{row name: {class: [roc_auc per seed]}}`, the pretrained encoder first."""
  rows: dict[str, dict[int, list[float]]] = collections.defaultdict(
      lambda: collections.defaultdict(list))
  pretrained_seen = set()
  for result in results:
    if result["normal_class"] not in pretrained_seen:
      rows[PRETRAINED][result["normal_class"]].append(result["roc_auc_pretrained"])
      pretrained_seen.add(result["normal_class"])
  for result in results:
    rows[result["spec"]][result["normal_class"]].append(result["roc_auc"])
  return rows


def table4(results: list[dict], *, dataset: str) -> str:
  """Markdown: one row per loss, one column per normal class, and the mean over classes.

  Cells are ROC-AUC (%) as mean (std) over seeds; the best loss of each column is bold.
  """
  rows = _table_rows(results)
  classes = sorted({r["normal_class"] for r in results})
  seeds = len({r["seed"] for r in results})
  means = {name: {c: 100 * np.mean(v[c]) for c in classes if c in v} for name, v in rows.items()}
  specs = [name for name in rows if name != PRETRAINED]
  # Bold every loss whose rounded mean equals the best one (ties shown as ties).
  best = {c: round(max(means[m].get(c, -1) for m in specs), 2) for c in classes}
  complete = {name: len(means[name]) == len(classes) for name in rows}
  class_means = {m: round(float(np.mean(list(means[m].values()))), 2) for m in rows if complete[m]}
  best_mean = max((class_means[m] for m in specs if m in class_means), default=None)
  header = "| loss | " + " | ".join(class_name(dataset, c) for c in classes) + " | mean |"
  lines = [header, "|---|" + "---|" * (len(classes) + 1)]
  for name, per_class in rows.items():
    cells = []
    for c in classes:
      if c not in per_class:
        cells.append("-")
        continue
      values = 100 * np.asarray(per_class[c])
      std = f" ({values.std(ddof=1):.2f})" if len(values) > 1 else ""
      cell = f"{values.mean():.2f}{std}"
      is_best = name != PRETRAINED and round(values.mean(), 2) == best[c]
      cells.append(f"**{cell}**" if is_best else cell)
    mean = f"{np.mean(list(means[name].values())):.2f}" if complete[name] else "-"
    mean = f"**{mean}**" if name != PRETRAINED and class_means.get(name) == best_mean else mean
    lines.append(f"| {name} | " + " | ".join(cells) + f" | {mean} |")
  lines += [
      "",
      f"ROC-AUC (%) of the kNN score (k = 2), mean (sample std) over {seeds} seed(s); bold: best "
      "loss per column. Column = the normal class (one class normal, all others anomalous, as "
      "in MSC's code; the paper's Section 5.3 sentence states the reverse). "
      f"`{PRETRAINED}`: the encoder before MSC fine-tuning.",
  ]
  return "\n".join(lines) + "\n"


def results_markdown(rows: list[dict], config, command: str) -> str:
  """`results.md` of `rows` made with `config` by `command`: a title, the command and Table 4;
  what a sweep writes and what `experiments.regenerate` rebuilds from `results.csv`."""
  title = f"# MSC anomaly detection on {config.dataset}: ROC-AUC per normal class"
  body = table4(rows, dataset=config.dataset)
  return "\n".join([title, "", f"Command: `{command}`", "", body.rstrip()]) + "\n"


def write(results: list[dict], workdir: str, *, config, command: str,
          figures: bool = True) -> None:
  """`results.csv` (one row per run), `results.md` (`results_markdown`) and, with `figures`,
  `roc_auc.png`."""
  dataset = config.dataset
  tables.write_results(
      workdir, results, columns=COLUMNS, markdown=results_markdown(results, config, command),
      figures=[lambda path: write_plot(results, path, dataset=dataset)] if figures else ())


def write_plot(results: list[dict], workdir: str, *, dataset: str) -> None:
  """`roc_auc.png`: ROC-AUC per normal class, one line per loss (mean +- std over seeds)."""
  rows = _table_rows(results)
  classes = sorted({r["normal_class"] for r in results})
  fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(classes) + 2), 3.5))
  for index, (name, per_class) in enumerate(rows.items()):
    present = [c for c in classes if c in per_class]
    values = [100 * np.asarray(per_class[c]) for c in present]
    offset = 0.06 * (index - (len(rows) - 1) / 2)
    ax.errorbar(np.asarray(present) + offset, [v.mean() for v in values],
                [v.std() for v in values], marker="o" if name != PRETRAINED else "x",
                linestyle="-" if name != PRETRAINED else ":", capsize=2, label=name,
                color="k" if name == PRETRAINED else f"C{index}")
  ax.set_xticks(classes, labels=[class_name(dataset, c) for c in classes], rotation=30)
  ax.set(xlabel="normal class", ylabel="ROC-AUC (%)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, "roc_auc.png"), dpi=120)
  plt.close(fig)
