"""Every committed result table is what its experiment makes of its CSV
(`experiments.regenerate`): byte for byte up to its hand-written `## Notes`; and every block of
README.md and docs/ that quotes the regret study is what the study's CSVs give."""

from __future__ import annotations

import csv
import os
import shutil

import pytest

from experiments import regenerate
from experiments.framework import blocks

NAMES = regenerate.tables_with_csv()


def test_the_committed_tables_have_csvs():
  assert {"grace_citeseer", "grace_cora_splits", "dcrec_ml100k", "simclr_mnist1d",
          "simclr_mnist1d_n", "sphere", "learnable_vs_free"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_table_regenerates_from_its_csv(name):
  assert regenerate.check(name), f"python -m experiments.regenerate {name}"


def test_a_recorded_command_gives_the_experiment_and_its_config():
  module, config = regenerate.config_of(
      "python -m experiments.grace --config=experiments/configs/grace_cora.py --workdir=w "
      "--config.seeds=3 --config.losses=free,tau=1")
  assert module == "experiments.grace"
  assert (config.dataset, config.seeds, config.losses) == ("cora", 3, "free,tau=1")
  assert regenerate.recorded_command("# t\n\nCommand:\n\n```\npython -m x\n```\n") == "python -m x"
  with pytest.raises(ValueError, match="records no command"):
    regenerate.recorded_command("# t\n")
  markdown = "# t\n\n| a |\n\n## Notes\n\nhand\n"
  assert regenerate.split(markdown) == ("# t\n\n| a |\n", "## Notes\n\nhand\n")
  # A study's command may leave out --config: its experiment's default_config is read.
  module, config = regenerate.config_of("python -m experiments.sphere --workdir=w "
                                        "--config.seeds=2")
  assert (module, config.seeds, config.steps) == ("experiments.sphere", 2, 2000)
  with pytest.raises(ValueError, match="no --config"):
    regenerate.config_of("python -m experiments.dcrec --workdir=w")


def test_rewrite_keeps_the_command_and_the_notes(tmp_path, monkeypatch):
  name = "learnable_vs_free"
  for suffix in (".md", ".csv"):
    shutil.copy(f"{regenerate.RESULTS}/{name}{suffix}", tmp_path / f"{name}{suffix}")
  original = (tmp_path / f"{name}.md").read_text()
  monkeypatch.setattr(regenerate, "RESULTS", str(tmp_path))
  regenerate.rewrite(name)
  assert (tmp_path / f"{name}.md").read_text() == original


def test_the_pages_quote_the_regret_study_as_the_csvs_give():
  # What `python -m experiments.regenerate --check` checks of README.md and docs/*.md.
  rendered = regenerate.rendered_pages()
  assert {os.path.relpath(p, regenerate.PAGES_ROOT) for p in rendered} >= {
      "README.md", "docs/index.md", "docs/results.md", "docs/choosing.md", "docs/regret.md"}
  stale = [p for p, (old, new) in rendered.items() if old != new]
  assert not stale, f"python -m experiments.regenerate regret (stale: {stale})"


def test_readme_shows_the_summary_beside_what_to_pick():
  with open(os.path.join(regenerate.PAGES_ROOT, "README.md")) as f:
    readme = f.read()
  names = blocks.names(readme, regenerate.COMMAND)
  assert names.index("regret: what to pick") == names.index("regret: summary") + 1
  between = readme[readme.index("<!-- end of regret: summary -->"):
                   readme.index("<!-- regret: what to pick,")]
  assert "\n#" not in between  # one section holds both


def _block(page: str, name: str) -> str:
  start = page.index(blocks.start_line(name, regenerate.COMMAND))
  return page[start:page.index(regenerate.END.format(name=name), start)]


def _copy_study(tmp_path):
  results, root = tmp_path / "results", tmp_path / "repo"
  shutil.copytree(regenerate.RESULTS, results,
                  ignore=shutil.ignore_patterns("*.png", "unfinished"))
  (root / "docs").mkdir(parents=True)
  shutil.copy(os.path.join(regenerate.PAGES_ROOT, "README.md"), root / "README.md")
  for name in ("index.md", "choosing.md", "results.md", "regret.md"):
    shutil.copy(os.path.join(regenerate.PAGES_ROOT, "docs", name), root / "docs" / name)
  return results, root


def test_a_candidates_perturbed_results_change_the_readme(tmp_path, monkeypatch):
  results, root = _copy_study(tmp_path)
  choosing = (root / "docs" / "choosing.md").read_text()
  monkeypatch.setattr(regenerate, "RESULTS", str(results))
  monkeypatch.setattr(regenerate, "PAGES_ROOT", str(root))
  # Round 2's pick, 10 points of top-100 lower on every seed of the tutorial's logQ row.
  table = results / "regret2_retrieval_ml100k_logq.csv"
  with open(table) as f:
    lines = list(csv.DictReader(f))
  for line in lines:
    if line["spec"] == "dynamic=0.1:0.2+logq":
      line["top@100"] = str(float(line["top@100"]) - 0.10)
  with open(table, "w", newline="") as f:
    writer = csv.DictWriter(f, list(lines[0]))
    writer.writeheader()
    writer.writerows(lines)
  before = (root / "README.md").read_text()
  with pytest.raises(SystemExit) as stale:
    regenerate.main(["--check", "regret"])
  assert stale.value.code == 1
  regenerate.main(["regret"])
  after = (root / "README.md").read_text()
  headline = _block(after, "regret: headline")
  assert headline != _block(before, "regret: headline")
  assert "picks `dynamic=0.1:0.2`" in _block(before, "regret: headline")
  assert "picks `dynamic=0.1:0.2`" not in headline  # its worst case is now 10 points higher
  assert _block(after, "regret: summary") != _block(before, "regret: summary")
  assert (root / "docs" / "choosing.md").read_text() != choosing
  with pytest.raises(SystemExit) as fresh:
    regenerate.main(["--check", "regret"])
  assert fresh.value.code == 0


def test_a_page_naming_an_unknown_block_is_refused(tmp_path, monkeypatch):
  start = blocks.start_line("regret: nothing", regenerate.COMMAND)
  (tmp_path / "README.md").write_text(f"{start}\n<!-- end of regret: nothing -->\n")
  monkeypatch.setattr(regenerate, "PAGES_ROOT", str(tmp_path))
  with pytest.raises(ValueError, match="README.md.*no regret block is named 'regret: nothing'"):
    regenerate.rendered_pages()
  page = "a\n<!-- x, written by tool -->\nold\n"  # no end line
  with pytest.raises(ValueError, match="no block 'x'"):
    blocks.fill(page, {"x": "new\n"}, command="tool", end="<!-- end of {name} -->")
