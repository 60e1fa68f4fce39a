"""Every spec the committed results and the configs name parses as it did before the registries.

`spec_parses.json` holds what the parsers gave for each of them before the specs were registered
(the canonical string and the object built); the committed CSVs' `spec` columns hold the
canonical strings the runs were keyed by. Both are independent of the registries under test.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import pathlib
import re

import ml_collections
import pytest

from experiments.framework import plan
from experiments.retrieval import report as retrieval_report
from tfcl_jax import losses, mappings

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECORD = json.loads((ROOT / "tests" / "helpers" / "spec_parses.json").read_text())
FAMILY = {losses.InfoNCELoss: "info_nce", losses.SigmoidLoss: "sigmoid",
          losses.DotProductLoss: "dot"}
STEPS = (0, 1, 10, 100, 1000, 5000)
#: The targets of the mappings whose scale a loss solves from its batch (`<target>_free`),
#: registered after the record was taken.
BATCH_SCALED = ("calibrated", "perplexity", "accuracy")


def _csv_specs() -> dict[str, list[str]]:
  found = {}
  for path in sorted((ROOT / "experiments" / "results").glob("*.csv")):
    with open(path) as f:
      reader = csv.DictReader(f)
      if reader.fieldnames and "spec" in reader.fieldnames:
        found[path.name] = sorted({row["spec"] for row in reader})
  return found


def _config_specs() -> tuple[list[str], list[str]]:
  """The loss specs (`losses`, `n_losses`) and mapping specs (`mappings`) of every config."""
  loss_specs, mapping_specs = set(), set()
  for path in sorted((ROOT / "experiments" / "configs").glob("*.py")):
    if path.name == "__init__.py":
      continue
    spec = importlib.util.spec_from_file_location("_config", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()

    def visit(fields, steps):
      for name, value in fields.items():
        if isinstance(value, ml_collections.ConfigDict):
          visit(value, value.get("steps", steps))
        elif name in ("losses", "n_losses"):
          loss_specs.update(plan.split_list(value, name=name))
        elif name == "mappings":
          mapping_specs.update(text.format(steps=steps) for text in value)

    visit(config, config.get("steps", 0))
  return sorted(loss_specs - {retrieval_report.POPULARITY}), sorted(mapping_specs)


def _mapping(mapping: mappings.Mapping) -> dict:
  described = {"spec": mapping.spec, "fn": type(mapping.fn).__name__,
               "scheduled": mapping.scheduled,
               "params": {name: float(value) for name, value in mapping.params.items()}}
  for field in dataclasses.fields(mapping.fn):  # pyright: ignore[reportArgumentType]
    value = getattr(mapping.fn, field.name)
    described[field.name] = ([round(float(value(step)), 7) for step in STEPS] if callable(value)
                             else value if value is None or isinstance(value, str)
                             else float(value))
  return described


def _loss(loss: losses.Loss) -> dict:
  return {"spec": loss.spec, "family": FAMILY[type(loss)],
          "symmetric": getattr(loss, "symmetric", False), "logq": loss.logq,
          "bias": getattr(loss, "bias", 0.0), "learn_bias": getattr(loss, "learn_bias", False),
          "params": {name: float(value) for name, value in loss.params.items()},
          "mapping": None if loss.mapping is None else _mapping(loss.mapping)}


@pytest.mark.parametrize("text", sorted(RECORD["loss"]))
def test_loss_specs_parse_as_recorded(text):
  recorded = RECORD["loss"][text]
  assert losses.canonical_spec(text) == recorded["canonical"]
  assert _loss(losses.from_spec(text, num_candidates=100)) == recorded["built"]


@pytest.mark.parametrize("text", sorted(RECORD["mapping"]))
def test_mapping_specs_parse_as_recorded(text):
  assert _mapping(mappings.from_spec(text)) == RECORD["mapping"][text]


@pytest.mark.parametrize("name", sorted(_csv_specs()))
def test_committed_specs_are_canonical_and_recorded(name):
  for text in _csv_specs()[name]:
    if text == retrieval_report.POPULARITY:  # retrieval's untrained ranking, not a loss
      config = ml_collections.ConfigDict({"losses": text})
      assert retrieval_report.specs_of(config) == [text]
      continue
    assert losses.canonical_spec(text) == text
    assert _loss(losses.from_spec(text, num_candidates=100)) == _expected(text)


def _expected(text: str) -> dict:
  """What `text` builds: the record's entry, or one composed from recorded entries.

  Specs first run after the record was taken are a recorded spec with `+logq` added, a
  recorded fixed temperature with another value, or free with a scale solved from the batch
  (`BATCH_SCALED`) in a recorded form of free; anything else is missing from the record.
  """
  if text in RECORD["loss"]:
    return RECORD["loss"][text]["built"]
  base, logq = (text[:-len("+logq")], True) if text.endswith("+logq") else (text, False)
  tau = re.fullmatch(r"((?:clip:)?)tau=([0-9.e+-]+)", base)
  solved = re.fullmatch(r"((?:clip:)?)(\w+)_free", base)
  solved = solved if solved and solved.group(2) in BATCH_SCALED else None
  key = f"{tau.group(1)}tau=1" if tau else f"{solved.group(1)}free" if solved else base
  assert key in RECORD["loss"], f"{text!r} is neither recorded nor composed of a recorded spec"
  built = json.loads(json.dumps(RECORD["loss"][key]["built"]))
  if tau:
    built["mapping"].update(spec=base[len(tau.group(1)):], tau=float(tau.group(2)))
  if solved:
    built["mapping"] = {"spec": base[len(solved.group(1)):], "fn": "BatchScaled",
                        "scheduled": False, "params": {}, "target": solved.group(2),
                        "scale": None}
  built.update(spec=text, logq=built["logq"] or logq)
  return built


def test_config_specs_are_recorded():
  loss_specs, mapping_specs = _config_specs()
  assert loss_specs and mapping_specs
  assert set(loss_specs) <= set(RECORD["loss"])
  assert set(mapping_specs) <= set(RECORD["mapping"])
