"""The tests mirror the package: every module of the library and of the experiments' framework
has its test at the mirrored path (`tfcl_jax/<package>/<module>.py`:
`tests/<package>/test_<module>.py`; `experiments/framework/<module>.py`:
`tests/experiments/test_<module>.py`) or a line in tests/README.md that says where it is tested,
and that list names only modules that exist and have no mirrored test."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- untested-at-mirror: begin -->", "<!-- untested-at-mirror: end -->"
#: Each mirrored folder and the folder of its tests.
MIRRORS = {"tfcl_jax": "tests", "experiments/framework": "tests/experiments"}


def _modules() -> list[pathlib.Path]:
  return sorted(path for folder in MIRRORS for path in (ROOT / folder).rglob("*.py")
                if path.name != "__init__.py")


def _mirrored(module: pathlib.Path) -> pathlib.Path:
  folder = next(folder for folder in MIRRORS if module.is_relative_to(ROOT / folder))
  parts = module.relative_to(ROOT / folder).with_suffix("").parts
  return ROOT.joinpath(MIRRORS[folder], *[part.lstrip("_") for part in parts[:-1]],
                       "test_" + parts[-1].lstrip("_") + ".py")


def _listed() -> dict[str, str]:
  text = (ROOT / "tests" / "README.md").read_text()
  block = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
  return dict(re.findall(r"^- `([^`]+)`: (.+)$", block, re.M))


def test_the_mirror_rule():
  assert _mirrored(ROOT / "tfcl_jax/losses/_engine/_tiles.py") == (
      ROOT / "tests/losses/engine/test_tiles.py")
  assert _mirrored(ROOT / "experiments/framework/plan.py") == (
      ROOT / "tests/experiments/test_plan.py")


def test_every_mirrored_module_has_its_test_or_a_reason():
  listed = _listed()
  missing = [str(p.relative_to(ROOT)) for p in _modules()
             if not _mirrored(p).exists() and str(p.relative_to(ROOT)) not in listed]
  assert not missing, f"no test at the mirrored path and no line in tests/README.md: {missing}"


def test_the_readme_lists_only_modules_that_exist_without_a_mirrored_test():
  stale = [name for name in _listed()
           if not (ROOT / name).is_file() or _mirrored(ROOT / name).exists()]
  assert not stale, f"tests/README.md lists modules that are gone or now mirrored: {stale}"
  assert all(reason.strip() for reason in _listed().values())


def test_every_test_module_lives_in_a_folder_with_an_init():
  """Test modules of the same name in two folders (losses/test_sigmoid, analysis/test_sigmoid)
  are told apart by their package: every folder of tests has its `__init__.py`."""
  folders = {p.parent for p in (ROOT / "tests").rglob("test_*.py")}
  assert not [str(f) for f in folders if not (f / "__init__.py").exists()]
