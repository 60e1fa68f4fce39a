"""Looks at the positive pairs of Eq. 1: views from `tfcl_jax.augment.two_views`, and their stats.

  python -m experiments.augment_views --config=experiments/configs/augment_views_digits.py \
    --workdir=DIR [--config.dataset=cifar10 --config.data_dir=DATA_DIR]

Writes `DIR/views.png` (one row per image: the eval view, then pairs of random views),
`DIR/results.csv` and `DIR/results.md`: over `stats_images` images and all pairs, per-channel
mean and std of the normalised views (near 0 and 1 when the recipe's statistics fit the data)
and the mean pixel distance between the two views of one image against that between views of
different images.
"""

from __future__ import annotations

import os

import jax
import matplotlib
import numpy as np
import tqdm.auto as tqdm

from experiments.framework import experiment, plan, sweep, tables
from tfcl_jax import augment, data

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402  (after choosing the Agg backend)


def check_config(config) -> None:
  """The dataset and recipe names and the sizes: everything checked before any work.

  Raises:
    ConfigError: naming the first bad field.
  """
  plan.check_fields(config, positive=("num_images", "num_pairs", "stats_images"),
                    non_negative=("view_size", "seed"))
  with plan.config_errors():
    info = data.get_info(config.dataset)
  recipe = config.recipe or info.recipe
  if recipe not in augment.RECIPES:
    raise plan.ConfigError(f"config.recipe: unknown recipe {recipe!r}; known: "
                           f"{sorted(augment.RECIPES)}")
  if config.num_images > config.stats_images:
    raise plan.ConfigError("config.num_images must be at most config.stats_images.")


def _settings(config):
  """The dataset's info, the split, the recipe and the view size of `config`."""
  info = data.get_info(config.dataset)
  recipe = config.recipe or info.recipe
  view_size = config.view_size or info.view_size or info.image_size
  return info, config.split or info.train_split, recipe, view_size


def _pixels(views: jax.Array, recipe: str) -> np.ndarray:
  spec = augment.RECIPES[recipe]
  return np.clip(np.asarray(views) * np.asarray(spec.std) + np.asarray(spec.mean), 0.0, 1.0)


def _view_pairs(key, images, recipe: str, view_size: int, num_pairs: int) -> list[tuple]:
  pairs = []
  for pair_key in tqdm.tqdm(jax.random.split(key, num_pairs), desc="view pairs"):
    pairs.append(augment.two_views(pair_key, images, recipe=recipe, out_size=view_size))
  return pairs


def _statistics(pairs: list[tuple], center: jax.Array) -> list[dict]:
  views = np.concatenate([np.asarray(view) for pair in pairs for view in pair])
  rows = []
  for name, values in (("two_views", views), ("center_view", np.asarray(center))):
    for channel in range(values.shape[-1]):
      rows.append({"what": f"{name} channel {channel} mean",
                   "value": float(values[..., channel].mean())})
      rows.append({"what": f"{name} channel {channel} std",
                   "value": float(values[..., channel].std())})
  flat = [(np.asarray(v1).reshape(len(v1), -1), np.asarray(v2).reshape(len(v2), -1))
          for v1, v2 in pairs]
  positive = np.mean([np.abs(v1 - v2).mean() for v1, v2 in flat])
  negative = np.mean([np.abs(v1 - np.roll(v2, 1, axis=0)).mean() for v1, v2 in flat])
  rows.append({"what": "mean |view1 - view2|, same image", "value": float(positive)})
  rows.append({"what": "mean |view1 - view2|, different images", "value": float(negative)})
  rows.append({"what": "same / different", "value": float(positive / negative)})
  return rows


def _figure(pairs: list[tuple], center: jax.Array, recipe: str, num_images: int, path: str):
  columns = [_pixels(center[:num_images], recipe)]
  for view1, view2 in pairs:
    columns += [_pixels(view1[:num_images], recipe), _pixels(view2[:num_images], recipe)]
  rows, cols = num_images, len(columns)
  figure, axes = plt.subplots(rows, cols, figsize=(1.2 * cols, 1.2 * rows), squeeze=False)
  for col, column in enumerate(columns):
    for row in range(rows):
      image = column[row]
      axes[row, col].imshow(image[..., 0] if image.shape[-1] == 1 else image,
                            cmap="gray" if image.shape[-1] == 1 else None, vmin=0, vmax=1)
      axes[row, col].axis("off")
    title = "eval view" if col == 0 else f"pair {(col + 1) // 2}, view {2 - col % 2}"
    axes[0, col].set_title(title, fontsize=7)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


@sweep.study
def train_and_evaluate(config, workdir: str) -> list[dict]:
  """Draws the views of `config` (`check_config` passed); writes `views.png`, `results.csv`
  and `results.md`. Nothing trains: the views are the experiment."""
  info, split, recipe, view_size = _settings(config)
  loader = data.make_loader(
      info.name, split, batch_size=config.stats_images, seed=config.seed,
      data_dir=config.data_dir or None, shard_index=0, shard_count=1)
  images = next(iter(loader))["image"]
  pairs = _view_pairs(jax.random.key(config.seed), images, recipe, view_size, config.num_pairs)
  center = augment.center_view(images, recipe=recipe, out_size=view_size)
  rows = [{"dataset": info.name, "split": split, "recipe": recipe, "view_size": view_size} | row
          for row in _statistics(pairs, center)]
  markdown = (f"Views of {info.name}:{split}, recipe `{recipe}`, {view_size} px, "
              f"{len(images)} images\n\n| statistic | value |\n|---|---|\n"
              + "".join(f"| {row['what']} | {row['value']:.4f} |\n" for row in rows))
  tables.write_results(workdir, rows, markdown=markdown, figures=[
      lambda path: _figure(pairs, center, recipe, config.num_images,
                           os.path.join(path, "views.png"))])
  return rows


EXPERIMENT = experiment.Experiment(
    name="augment_views", kind="study", train_and_evaluate=train_and_evaluate,
    check_config=check_config, configs=("experiments/configs/augment_views_digits.py",))

if __name__ == "__main__":
  EXPERIMENT.main()
