"""docs/architecture.md's walk through a run names code that exists: every module, class and
function it spells in full (`tfcl_jax.…`, `experiments.…`) imports and resolves, every file it
names is there, and the calls it describes are in the callers' source."""

import importlib
import inspect
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADING = "### One parameter from the command line to the tile"
DOTTED = re.compile(r"^((?:tfcl_jax|experiments)(?:\.[A-Za-z_]\w*)+)")


def _walkthrough() -> str:
  text = (ROOT / "docs" / "architecture.md").read_text()
  start = text.index(HEADING)
  following = text.find("\n#", start + len(HEADING))
  return text[start:] if following < 0 else text[start:following]


def _spans() -> list[str]:
  return re.findall(r"`([^`]+)`", _walkthrough())


def resolve(name: str):
  """The object a dotted name names: its longest importable module prefix, then attributes."""
  parts = name.split(".")
  for cut in range(len(parts), 0, -1):
    try:
      value = importlib.import_module(".".join(parts[:cut]))
    except ModuleNotFoundError:
      continue
    for attribute in parts[cut:]:
      value = getattr(value, attribute)
    return value
  raise ModuleNotFoundError(name)


NAMES = sorted({m.group(1) for span in _spans() if (m := DOTTED.match(span))})


def test_the_walkthrough_names_the_code_it_walks_through():
  # The steps that went stale before: the parser, the build and the objective's call.
  assert {"experiments.framework.plan.parse_losses", "experiments.framework.sweep.train_run",
          "tfcl_jax.specs.ParsedSpec.build", "tfcl_jax.losses.Loss.evaluate"} <= set(NAMES)
  assert len(NAMES) >= 25


@pytest.mark.parametrize("name", NAMES)
def test_every_named_module_and_function_exists(name):
  resolve(name)


def test_a_name_that_is_gone_fails_to_resolve():
  with pytest.raises(AttributeError):
    resolve("experiments.framework.plan.loss_specs_gone")
  with pytest.raises(ModuleNotFoundError):
    resolve("tfcl_jax_gone.losses")


def test_every_named_file_exists():
  files = [span for span in _spans() if span.endswith(".py") and "/" in span]
  assert files and all((ROOT / f).is_file() for f in files), files


@pytest.mark.parametrize("caller, callee", [
    ("experiments.framework.cli.run_main", "train_and_evaluate(config, workdir)"),
    ("experiments.framework.pretraining.plan_runs", "plan.parse_losses("),
    ("experiments.framework.plan.plan", "parse_losses("),
    ("experiments.framework.sweep.train_run", "run.loss.build(num_candidates)"),
    ("experiments.framework.pretraining.Trainer.train", "sweep.train_run("),
    ("experiments.framework.pretraining.Trainer.train_step", "make_train_step("),
    ("tfcl_jax.objectives.simclr.make_simclr_loss", "loss.evaluate("),
    ("tfcl_jax.losses._loss.FamilyLoss.compute", "self.family.evaluate("),
    ("tfcl_jax.losses._loss.FamilyLoss.compute", "self.bound_mapping("),
    ("tfcl_jax.losses._info_nce.info_nce", "tile_reduce"),
    ("tfcl_jax.losses._engine._tiles.LogSumExp.fast_form", "exp_form("),
])
def test_each_step_calls_what_the_walkthrough_says(caller, callee):
  assert callee in inspect.getsource(resolve(caller)), f"{caller} no longer calls {callee}"
