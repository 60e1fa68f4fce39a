"""docs/architecture.md's worked examples of a new mapping and a new loss family, built from the
page: in a copy of the tree, each example's files written as the page gives them, the generated
lists rewritten (`python -m docs.make_specs`), exactly the files the page names changed, and the
examples' own tests run there (values and gradients against NumPy), with the house's checks of
the layout, the imports and the generated docs. The run in the copy takes minutes (two minutes
on two loaded cores): it is marked heavy, and `-m heavy` runs it."""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
SECTIONS = ("### Adding a mapping", "### Adding a loss family")
COPIED = ("tfcl_jax", "tests", "docs", "benchmarks", "experiments/__init__.py",
          "experiments/framework", "pyproject.toml", "CHANGELOG.md")
BLOCK = re.compile(r"^`([^`]+)`([^\n]*):\n\n```\w+\n(.*?)^```", flags=re.S | re.M)


def section(title: str) -> str:
  text = PAGE.read_text()
  start = text.index(title)
  following = text.find("\n### ", start + len(title))
  return text[start:] if following < 0 else text[start:following]


def files_of(text: str) -> tuple[list[tuple[str, str, str]], list[str]]:
  """`(blocks, generated)` of a section: `(path, note, code)` of each block the page gives a
  file's name to (a whole file where the note is empty), and the files `python -m
  docs.make_specs` then writes, as its last paragraph names them."""
  blocks = BLOCK.findall(text)
  then = text[text.index("Then `python -m docs.make_specs`"):]
  generated = [name for name in re.findall(r"`([^`\s]+\.(?:md|rst))`", then)]
  return blocks, generated


def apply(root: pathlib.Path, path: str, note: str, code: str) -> None:
  """Writes one block into the tree at `root`: a whole file, the export of a package's names
  (the import before `__all__`, the names into it), or a line of the changelog's `### Added`."""
  target = root / path
  if not note:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(code)
  elif path.endswith("__init__.py"):
    names = re.findall(r"^\s+(\w+),$", code, flags=re.M)
    text = target.read_text().replace("\n__all__ = [\n", "\n" + code + "\n__all__ = [\n" + "".join(
        f'    "{name}",\n' for name in names), 1)
    target.write_text(text)
  else:
    text = target.read_text()
    added = text.index("### Added\n\n") + len("### Added\n\n")
    target.write_text(text[:added] + code + text[added:])


def _tracked() -> list[str]:
  try:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", *COPIED], cwd=ROOT,
                            capture_output=True, text=True, check=True, timeout=60).stdout
  except (OSError, subprocess.SubprocessError):
    pytest.skip("the tree is not a git checkout: its files cannot be listed")
  return [name for name in listed.splitlines() if (ROOT / name).is_file()]


def _digests(root: pathlib.Path) -> dict[str, str]:
  return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
          for path in root.rglob("*") if path.is_file() and "__pycache__" not in path.parts}


def _run(root: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
  # The inner pytest takes none of the outer run's options (CI's coverage threshold).
  env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
  return subprocess.run([sys.executable, *args], cwd=root, capture_output=True, text=True,
                        timeout=600, env={**env, "PYTHONDONTWRITEBYTECODE": "1"})


def test_the_page_gives_both_examples_whole():
  mapping, family = (files_of(section(title)) for title in SECTIONS)
  assert [path for path, _, _ in mapping[0]] == [
      "tfcl_jax/mappings/_angle.py", "tests/mappings/test_angle.py", "CHANGELOG.md"]
  assert mapping[1] == ["docs/specs.md", "docs/api/mappings.rst"]
  assert [path for path, _, _ in family[0]] == [
      "tfcl_jax/losses/_spectral.py", "tests/losses/test_spectral.py",
      "tfcl_jax/losses/__init__.py", "CHANGELOG.md"]
  assert family[1] == ["docs/specs.md", "docs/api/losses.rst"]


@pytest.mark.heavy
def test_the_examples_take_exactly_their_files_and_pass_their_tests(tmp_path):
  root = tmp_path / "tree"
  for name in _tracked():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / name, root / name)
  tests = []
  for title in SECTIONS:
    before = _digests(root)
    blocks, generated = files_of(section(title))
    for path, note, code in blocks:
      apply(root, path, note, code)
    written = _run(root, "-m", "docs.make_specs")
    assert written.returncode == 0, written.stderr
    after = _digests(root)
    changed = sorted(name for name in after if before.get(name) != after[name])
    assert changed == sorted({path for path, _, _ in blocks} | set(generated)), title
    tests += [path for path, note, _ in blocks if not note and path.endswith(".py")]
  run = _run(root, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tests,
             "tests/cross/test_layout.py", "tests/cross/test_imports.py",
             "tests/specs/test_registry.py::test_docs_pages_hold_what_the_registries_declare")
  assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
  assert re.search(r"\b(\d+) passed", run.stdout) and " failed" not in run.stdout
