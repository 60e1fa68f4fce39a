"""`experiments.framework.held_out`: the steps of each fraction of training, the fixed rows of the
held-out set, and its columns read back from a run's file."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.framework import held_out


def test_held_out_steps_are_the_first_steps_past_each_fraction():
  assert held_out.steps(100) == {0.1: 10, 0.25: 25, 0.5: 50, 1.0: 100}
  assert held_out.steps(1000) == {0.1: 100, 0.25: 250, 0.5: 500, 1.0: 1000}
  assert held_out.steps(7) == {0.1: 1, 0.25: 2, 0.5: 4, 1.0: 7}
  assert held_out.steps(2) == {0.1: 1, 0.25: 1, 0.5: 1, 1.0: 2}  # fractions may share a step
  with pytest.raises(ValueError, match="num_steps must be >= 1"):
    held_out.steps(0)


def test_held_out_subset_is_fixed_and_capped():
  np.testing.assert_array_equal(held_out.subset(5), np.arange(5))
  rows = held_out.subset(10_000)
  assert len(rows) == held_out.MAX_ROWS == len(set(rows.tolist()))
  assert np.all(np.diff(rows) > 0) and rows.max() < 10_000
  np.testing.assert_array_equal(rows, held_out.subset(10_000))  # every run the same rows


def test_held_out_columns_read_each_fraction_from_the_runs_file(tmp_path):
  assert held_out.columns(str(tmp_path), 8) == {}  # a run without scores
  (tmp_path / held_out.FILE).write_text(
      "step,rankme,lidar\n1,1.5,2.0\n4,3.0,4.0\n8,5.0,6.0\n")  # step 2 (25%) missing
  got = held_out.columns(str(tmp_path), 8)
  assert list(got) == [f"label_free/{name}{at}" for at in ("@10%", "@25%", "@50%", "")
                       for name in ("rankme", "lidar")]
  assert (got["label_free/rankme@10%"], got["label_free/lidar@50%"], got["label_free/rankme"]
          ) == (1.5, 4.0, 5.0)
  assert np.isnan(got["label_free/rankme@25%"]) and np.isnan(got["label_free/lidar@25%"])
