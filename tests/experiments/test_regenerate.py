"""Every committed result table is what its experiment makes of its CSV
(`experiments.regenerate`): byte for byte up to its hand-written `## Notes`."""

from __future__ import annotations

import pytest

from experiments import regenerate

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
  import shutil  # noqa: PLC0415

  name = "learnable_vs_free"
  for suffix in (".md", ".csv"):
    shutil.copy(f"{regenerate.RESULTS}/{name}{suffix}", tmp_path / f"{name}{suffix}")
  original = (tmp_path / f"{name}.md").read_text()
  monkeypatch.setattr(regenerate, "RESULTS", str(tmp_path))
  regenerate.rewrite(name)
  assert (tmp_path / f"{name}.md").read_text() == original
