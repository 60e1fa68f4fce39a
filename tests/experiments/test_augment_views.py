"""`experiments.augment_views`: files written, digits statistics sensible, bad configs refused."""

from __future__ import annotations

import csv
import os

import pytest

from experiments import augment_views
from experiments.configs import augment_views_digits
from experiments.framework import plan


def _config(**overrides):
  config = augment_views_digits.get_config()
  config.update({"num_images": 2, "num_pairs": 1, "stats_images": 64} | overrides)
  return config


def test_writes_results_and_figure(tmp_path):
  augment_views.check_config(_config())
  augment_views.train_and_evaluate(_config(), str(tmp_path))
  assert {"results.csv", "results.md", "views.png"} <= set(os.listdir(tmp_path))
  with open(tmp_path / "results.csv") as file:
    values = {row["what"]: float(row["value"]) for row in csv.DictReader(file)}
  # The digits statistics of the recipe fit the data: eval views are standardised.
  assert abs(values["center_view channel 0 mean"]) < 0.15
  assert abs(values["center_view channel 0 std"] - 1) < 0.15
  # Two views of one image are closer than views of different images.
  assert values["same / different"] < 1.0


@pytest.mark.parametrize("overrides, message", [
    ({"dataset": "mnist"}, "Unknown dataset"),
    ({"recipe": "byol"}, "config.recipe"),
    ({"num_pairs": 0}, "config.num_pairs"),
    ({"num_images": 100}, "config.num_images must be at most config.stats_images"),
])
def test_bad_config_fails_before_work(overrides, message):
  with pytest.raises(plan.ConfigError, match=message):
    augment_views.check_config(_config(**overrides))
