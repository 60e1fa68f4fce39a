"""The README's quickstart block runs as written."""

import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_block_runs():
  text = README.read_text()
  section = text[text.index("## Quickstart"):]
  code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  namespace = {}
  exec(compile(code, "README.md quickstart", "exec"), namespace)  # noqa: S102
  loss = float(namespace["loss"])
  assert np.isfinite(loss) and 0.0 < loss < np.log(2 * 256 - 1) + 1e-3
