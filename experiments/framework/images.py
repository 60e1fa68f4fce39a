"""A config's image dataset, as the image experiments read it: its info, train and test arrays,
the view recipe and size, the jitted two-view augmentation and center view, and the held-out
views the label-free scores read (`held_out`). `experiments.simclr` and `experiments.msc` load it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.framework import held_out
from tfcl_jax import augment, data


def views(config: ml_collections.ConfigDict) -> tuple[data.DatasetInfo, str, int]:
  """The dataset's info, the augmentation recipe and the side of the views of `config`
  (`config.dataset`, `recipe`, `view_size`; empty fields take the dataset's)."""
  info = data.get_info(config.dataset)
  return info, config.recipe or info.recipe, config.view_size or info.view_size or info.image_size



@dataclasses.dataclass(frozen=True)
class Images:
  """A config's image dataset: its info, train and test arrays, view recipe and size, and the
  jitted two-view augmentation and center view."""

  info: data.DatasetInfo
  recipe: str
  view_size: int
  data_dir: str | None
  train_images: np.ndarray
  train_labels: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray

  @functools.cached_property
  def augment(self):
    return functools.partial(augment.two_views, recipe=self.recipe, out_size=self.view_size)

  @functools.cached_property
  def center(self):
    return jax.jit(functools.partial(augment.center_view, recipe=self.recipe,
                                     out_size=self.view_size))

  def dummy_batch(self) -> jax.Array:
    """Two zero views (images or signals), for `init`."""
    return jnp.zeros((2, *self.info.example_shape(self.view_size)), jnp.float32)

  @functools.cached_property
  def held_out_views(self) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The label-free scores' inputs, drawn once: the test split's center views (up to
    `held_out.MAX_ROWS` of them, `held_out.subset`), two augmented views of each, and
    `held_out.LIDAR_VIEWS` augmented views of each of the first `held_out.LIDAR_SAMPLES`
    (`[n * q, ...]`, sample-major)."""
    images = self.test_images[held_out.subset(len(self.test_images))]
    key = jax.random.key(held_out.VIEW_SEED)
    first, second = self.augment(jax.random.fold_in(key, 0), images)
    lidar = images[:held_out.LIDAR_SAMPLES]
    pairs = [self.augment(jax.random.fold_in(key, 1 + i), lidar)
             for i in range(held_out.LIDAR_VIEWS // 2)]
    views = jnp.stack([view for pair in pairs for view in pair], axis=1)
    return self.center(images), first, second, views.reshape(-1, *views.shape[2:])

  def held_out_set(self, embed) -> held_out.HeldOut:
    """`held_out.HeldOut` of the test split (`held_out_views`) by `embed(views) -> [N, D]`: the
    representation the metric reads of the center views, of two augmented views, and LiDAR's
    views of the recipe's own augmentation."""
    center, first, second, views = self.held_out_views
    lidar = embed(views)
    return held_out.HeldOut(embed(center), embed(first), embed(second),
                            lidar.reshape(-1, held_out.LIDAR_VIEWS, lidar.shape[-1]))


def load_images(config: ml_collections.ConfigDict) -> Images:
  """The images of `config.dataset` (`data_dir`, `recipe`, `view_size`): what SimCLR and MSC
  read."""
  info, recipe, view_size = views(config)
  data_dir = config.data_dir or None
  train = data.load_arrays(info.name, info.train_split, data_dir=data_dir)
  test = data.load_arrays(info.name, info.test_split, data_dir=data_dir)
  return Images(info, recipe, view_size, data_dir, *train, *test)

