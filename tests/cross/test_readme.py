"""The README's Python blocks run as written, every one of them."""

import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
# The heading above each Python block of the README; each has its test below.
HEADINGS = ("## The loss in a few lines", "## Quickstart", "### With Flax NNX",
            "### With Flax Linen")
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def block_after(text: str, heading: str) -> str:
  """The first Python block after `heading`."""
  return PYTHON_BLOCK.search(text[text.index(heading):]).group(1)


def run_block(heading: str) -> dict:
  """Executes the first Python block after `heading` in the README; returns its namespace."""
  code = block_after(README.read_text(), heading)
  namespace = {}
  exec(compile(code, f"README.md {heading}", "exec"), namespace)  # noqa: S102
  return namespace


def test_every_python_block_is_run():
  text = README.read_text()
  run = [block_after(text, heading) for heading in HEADINGS]
  assert PYTHON_BLOCK.findall(text) == run, "a README Python block has no test: add its heading"


def _numpy_info_nce(z1, z2, logits_of, negatives):
  """InfoNCE in float64 NumPy: row i's positive is its other view, candidates every other row."""
  units = [z / np.linalg.norm(z, axis=1, keepdims=True) for z in (np.float64(z1), np.float64(z2))]
  n = len(units[0])
  if negatives == "cross":
    logits, positive = logits_of(units[0] @ units[1].T), np.arange(n)
  else:  # "all": the 2N rows against each other, the row itself left out
    rows = np.concatenate(units)
    cosines = rows @ rows.T
    np.fill_diagonal(cosines, 0.0)  # a row is not its own candidate: keep Eq. 11 off cos = 1
    logits = logits_of(cosines)
    np.fill_diagonal(logits, -np.inf)
    positive = np.concatenate([np.arange(n, 2 * n), np.arange(n)])
  top = logits.max(axis=1, keepdims=True)
  logsumexp = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
  return np.mean(logsumexp - logits[np.arange(len(logits)), positive])


def _free(cosines):
  return np.log1p(cosines) - np.log1p(-cosines)  # Eq. 11: 2 artanh(cos)


def test_loss_in_a_few_lines_block_runs():
  namespace = run_block("## The loss in a few lines")
  z1, z2 = namespace["z1"], namespace["z2"]
  np.testing.assert_allclose(namespace["loss"], _numpy_info_nce(z1, z2, _free, "cross"), rtol=1e-5)
  np.testing.assert_allclose(namespace["loss_tau"], _numpy_info_nce(z1, z2, lambda c: c / 0.1,
                                                                    "cross"), rtol=1e-5)
  np.testing.assert_allclose(namespace["nt_xent"], _numpy_info_nce(z1, z2, _free, "all"),
                             rtol=1e-5)
  grads = namespace["grads"]
  assert [g.shape for g in grads] == [z1.shape, z2.shape]
  assert all(np.all(np.isfinite(g)) and np.any(g != 0) for g in grads)


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
