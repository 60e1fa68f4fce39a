"""The README's quickstart blocks run as written."""

import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def run_block(heading: str) -> dict:
  """Executes the first Python block after `heading` in the README; returns its namespace."""
  text = README.read_text()
  code = re.search(r"```python\n(.*?)```", text[text.index(heading):], re.S).group(1)
  namespace = {}
  exec(compile(code, f"README.md {heading}", "exec"), namespace)  # noqa: S102
  return namespace


def test_quickstart_block_runs():
  namespace = run_block("## Quickstart")
  loss = float(namespace["loss"])
  assert np.isfinite(loss) and 0.0 < loss < np.log(2 * 256 - 1) + 1e-3
  assert set(namespace["params"]) == {"model", "loss"}
  t = float(namespace["params"]["loss"]["t"])
  assert 1e-4 < abs(t) < 1e-2  # one Adam step of 1e-3 moved the scale's t from free's 0


def test_docs_index_shows_the_readme_quickstart():
  index = README.parent / "docs" / "index.md"
  block = re.compile(r"## Quickstart.*?(```python\n.*?```)", re.S)
  assert block.search(index.read_text()).group(1) == block.search(README.read_text()).group(1)


def test_nnx_learnable_temperature_block_runs():
  namespace = run_block("### With Flax NNX")
  loss, scale = float(namespace["loss"]), float(namespace["scale"])
  assert np.isfinite(loss) and 0.0 < loss < np.log(128) + 2 / 0.07  # logits span 2 / 0.07
  t = float(namespace["model"].t[...])
  assert abs(t - np.log(1 / 0.07)) > 1e-3  # the step trained it (Adam moves t by about 1e-2)
  np.testing.assert_allclose(scale, min(np.exp(t), 100.0), rtol=1e-6)


def test_linen_learnable_temperature_block_runs():
  namespace = run_block("### With Flax Linen")
  loss, scale = float(namespace["loss"]), float(namespace["scale"])
  assert np.isfinite(loss) and 0.0 < loss < np.log(128) + 2 / 0.07  # logits span 2 / 0.07
  params = namespace["params"]
  assert set(params) == {"users", "items", "t"}  # t lives in the user's params tree
  t = float(params["t"])
  assert abs(t - np.log(1 / 0.07)) > 1e-3  # the step trained it (Adam moves t by about 1e-2)
  np.testing.assert_allclose(scale, min(np.exp(t), 100.0), rtol=1e-6)
