"""The tests mirror the package: every library module has its test at the mirrored path
(`tests/<package>/test_<module>.py`) or a line in tests/README.md that says where it is tested,
and that list names only modules that exist and have no mirrored test."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- untested-at-mirror: begin -->", "<!-- untested-at-mirror: end -->"


def _mirrored(module: pathlib.Path) -> pathlib.Path:
  parts = module.relative_to(ROOT / "tfcl_jax").with_suffix("").parts
  return ROOT.joinpath("tests", *[part.lstrip("_") for part in parts[:-1]],
                       "test_" + parts[-1].lstrip("_") + ".py")


def _listed() -> dict[str, str]:
  text = (ROOT / "tests" / "README.md").read_text()
  block = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
  return dict(re.findall(r"^- `([^`]+)`: (.+)$", block, re.M))


def test_every_library_module_has_its_mirrored_test_or_a_reason():
  modules = sorted(p for p in (ROOT / "tfcl_jax").rglob("*.py") if p.name != "__init__.py")
  listed = _listed()
  missing = [str(p.relative_to(ROOT)) for p in modules
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
