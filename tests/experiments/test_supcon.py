"""SupCon pretraining: `objectives.simclr.make_simclr_loss(..., form=form)` against NumPy
transcriptions of both forms over the two views' rows, a learnable temperature's gradient, and
`experiments.simclr` with `config.objective` and `config.form` end to end."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import regenerate
from experiments import simclr as experiment
from experiments.framework import plan, pretraining, tables
from tests.experiments import test_simclr as simclr_tests
from tfcl_jax import losses, mappings
from tfcl_jax.objectives import simclr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LABELS = np.array([0, 1, 0, 2, 1, 0])


class _Identity(nn.Module):
  """Projections = inputs: the loss sees the hand-built views as they are."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    return x, x


def _views(seed: int = 0, n: int = len(LABELS), d: int = 5) -> np.ndarray:
  """`[N, 2, D]`: two noisy views of N random points (the views `_augment` takes apart)."""
  rng = np.random.default_rng(seed)
  base = rng.normal(size=(n, 1, d))
  return base + 0.5 * rng.normal(size=(n, 2, d))


def _augment(key, images):
  del key
  return images[:, 0], images[:, 1]


def _objective(views, labels, *, loss, form, params=None):
  loss = losses.as_loss(loss)
  loss_fn = simclr.make_simclr_loss(_Identity(), loss=loss, augment=_augment, form=form)
  params = {"model": {}, "loss": loss.params if params is None else params}
  batch = {"image": jnp.asarray(views, jnp.float32), "label": jnp.asarray(labels, jnp.int32)}
  value, _ = loss_fn(params, {}, batch, jax.random.key(0), 0)
  return value


def _reference(views, labels, f, form):
  """Both forms over the 2N rows written per (image, view), image-major: a row's positives are
  the other rows whose image has its label (its own other view among them)."""
  rows = [(image, view) for image in range(len(labels)) for view in range(2)]
  unit = views / np.linalg.norm(views, axis=-1, keepdims=True)
  logit = {(r, s): f(float(unit[r] @ unit[s])) for r in rows for s in rows if r != s}
  per_anchor, per_pair = [], []
  for r in rows:
    others = [s for s in rows if s != r]
    positives = [s for s in others if labels[s[0]] == labels[r[0]]]
    negatives = [s for s in others if labels[s[0]] != labels[r[0]]]
    everyone = np.log(sum(np.exp(logit[r, s]) for s in others))
    per_anchor.append(everyone - np.mean([logit[r, p] for p in positives]))
    for p in positives:
      denominator = np.exp(logit[r, p]) + sum(np.exp(logit[r, s]) for s in negatives)
      per_pair.append(np.log(denominator) - logit[r, p])
  return np.mean(per_anchor) if form == "supcon" else np.mean(per_pair)


MAPS = {"tau=0.1": lambda c: c / 0.1, "free": lambda c: np.log((1 + c) / (1 - c))}


@pytest.mark.parametrize("form", simclr.FORMS)
@pytest.mark.parametrize("spec", list(MAPS))
def test_supcon_objective_matches_both_forms_over_the_two_views(form, spec):
  views = _views()
  value = _objective(views, LABELS, loss=losses.from_spec(spec), form=form)
  np.testing.assert_allclose(value, _reference(views, LABELS, MAPS[spec], form), rtol=2e-5)
  # The same as the loss of the rows stacked view by view, with the labels repeated.
  z = np.concatenate([views[:, 0], views[:, 1]])
  direct = losses.supervised_info_nce(z, np.tile(LABELS, 2), mapping=mappings.from_spec(spec),
                                      form=form)
  chex.assert_trees_all_close(value, direct, rtol=1e-6)


@pytest.mark.parametrize("form", simclr.FORMS)
def test_distinct_labels_give_simclr(form):
  """One image per class: a row's one positive is its other view, as in SimCLR."""
  views, loss = _views(seed=1), losses.from_spec("tau=0.5")
  supervised = _objective(views, np.arange(len(LABELS)), loss=loss, form=form)
  loss_fn = simclr.make_simclr_loss(_Identity(), loss=loss, augment=_augment)
  unsupervised, _ = loss_fn({"model": {}, "loss": {}}, {},
                            {"image": jnp.asarray(views, jnp.float32)}, jax.random.key(0), 0)
  chex.assert_trees_all_close(supervised, unsupervised, rtol=1e-5)


@pytest.mark.parametrize("form", simclr.FORMS)
def test_learnable_temperature_gets_the_gradient_of_the_loss(form):
  """d loss / d t of `exp(t) cos` against a central difference of the NumPy transcription."""
  views, t, h = _views(seed=2), float(np.log(1 / 0.2)), 1e-4
  loss = losses.from_spec("learnable=0.2")
  grad = jax.grad(lambda t: _objective(views, LABELS, loss=loss, form=form,
                                       params={"t": t}))(jnp.float32(t))
  chex.assert_tree_all_finite(grad)

  def reference(t):
    return _reference(views, LABELS, lambda c: np.exp(t) * c, form)

  expected = (reference(t + h) - reference(t - h)) / (2 * h)
  assert abs(expected) > 1e-3
  np.testing.assert_allclose(grad, expected, rtol=1e-3)


def test_the_forms_differ_by_the_other_positives_in_the_denominator():
  """Every anchor with the same number of positives: `"supcon"` − `"ntxent"` is the mean over
  positive pairs `(i, p)` of `log(sum_{a != i} e^f / (e^{f_ip} + sum_{negatives} e^f))`, the
  other positives that `"supcon"` adds to the denominator; > 0 with two or more positives."""
  labels = np.array([0, 1, 0, 1, 2, 2])  # 3 positives for each of the 12 rows
  views, tau = _views(seed=3), 0.5
  values = {form: _objective(views, labels, loss=losses.from_spec(f"tau={tau}"), form=form)
            for form in simclr.FORMS}
  z = np.concatenate([views[:, 0], views[:, 1]])
  z = z / np.linalg.norm(z, axis=1, keepdims=True)
  rows = np.tile(labels, 2)
  exp = np.exp(z @ z.T / tau)
  gaps = []
  for i in range(len(rows)):
    others = np.arange(len(rows)) != i
    negatives = rows != rows[i]
    for p in np.flatnonzero(others & ~negatives):
      gaps.append(np.log(exp[i, others].sum() / (exp[i, p] + exp[i, negatives].sum())))
  assert min(gaps) > 0
  np.testing.assert_allclose(values["supcon"] - values["ntxent"], np.mean(gaps), rtol=1e-4)


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(form="supcon2"), ValueError,
     r"form must be None \(SimCLR\) or one of 'supcon', 'ntxent' \(SupCon\), got 'supcon2'"),
    (dict(form="supcon_ntxent"), ValueError, "form must be None .* got 'supcon_ntxent'"),
    (dict(supervised="ntxent"), TypeError, "unexpected keyword argument 'supervised'"),
    (dict(form="supcon", loss=losses.from_spec("sigmoid/free")), ValueError,
     "form='supcon' takes an InfoNCE loss"),
    (dict(form="ntxent", negatives="cross"), ValueError, "negatives='all'"),
])
def test_form_options_are_checked(kwargs, error, message):
  kwargs = {"loss": mappings.temperature(0.1), **kwargs}
  with pytest.raises(error, match=message):
    simclr.make_simclr_loss(_Identity(), augment=_augment, **kwargs)


def _tiny_config(**overrides):
  """SimCLR's tiny digits runs (`test_simclr.tiny_config`) with SupCon's objective."""
  return simclr_tests.tiny_config(**{"objective": "supcon", "form": "supcon",
                                     "losses": "tau=0.1,learnable=0.2",
                                     "seeds": 1, **overrides})


COMMAND = ("python -m experiments.simclr --config=experiments/configs/supcon_digits.py "
           "--workdir=DIR --config.form={form} --config.epochs=1 --config.knn_k=20")


@pytest.mark.parametrize("form,title", [
    ("supcon", "# SupCon (form supcon: Khosla et al.'s L_out) on digits"),
    pytest.param("ntxent", "# SupCon (form ntxent: each positive pair against the negatives only)",
                 marks=pytest.mark.heavy),  # a second whole run: CI's heavy step
])
def test_supcon_runs_write_a_table_that_regenerates(tmp_path, form, title):
  command = COMMAND.format(form=form)
  simclr_tests.run(_tiny_config(form=form), str(tmp_path), command=command)
  with open(tmp_path / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert [(row["spec"], row["seed"]) for row in rows] == [("tau=0.1", "0"),
                                                           ("learnable=0.2", "0")]
  assert all(0.1 < float(row["knn_top1"]) <= 1.0 for row in rows)  # above chance (10 classes)
  assert all(0.0 <= float(row["linear_top1"]) <= 1.0 for row in rows)
  assert float(rows[1]["final_t"]) != pytest.approx(np.log(1 / 0.2), abs=1e-6)  # trained
  markdown = (tmp_path / "results.md").read_text()
  assert markdown.startswith(title)
  # What experiments.regenerate rebuilds from the CSV and the recorded command.
  module, config = regenerate.config_of(regenerate.recorded_command(markdown))
  assert (module, config.objective, config.form) == ("experiments.simclr", "supcon", form)
  recorded = tables.typed(tables.read_csv(str(tmp_path / "results.csv")))
  assert experiment.results_markdown(recorded, config, command).rstrip() == markdown.rstrip()


@pytest.mark.parametrize("overrides,message", [
    ({"objective": "simclr2"}, "config.objective must be one of"),
    ({"objective": "supcon_ntxent"},
     "config.objective must be one of 'simclr', 'supcon', got 'supcon_ntxent'"),
    ({"form": "supcon_ntxent"}, "config.form must be one of 'supcon', 'ntxent' with "
                                "config.objective='supcon', got 'supcon_ntxent'"),
    ({"objective": "simclr", "form": "L_out"}, "config.form must be one of"),
    ({"losses": "sigmoid/free"}, "config.objective='supcon': .*takes an InfoNCE loss"),
    ({"negatives": "cross"}, "config.objective='supcon': .*negatives='all'"),
])
def test_bad_objective_raises_before_anything_is_written(tmp_path, overrides, message):
  workdir = tmp_path / "run"
  with pytest.raises(plan.ConfigError, match=message):
    simclr_tests.run(_tiny_config(**overrides), str(workdir))
  assert not workdir.exists()


def test_supcon_trains_on_the_labelled_split():
  config = _tiny_config(dataset="stl10")  # STL-10 pretrains on train+unlabelled (label -1)
  assert pretraining.training_split(config) == "train"
  config.objective = "simclr"
  assert pretraining.training_split(config) == "train+unlabelled"


@pytest.mark.parametrize("form", simclr.FORMS)
def test_simclr_refuses_a_form_and_supcon_needs_one(form):
  config = _tiny_config(objective="simclr", form=form)
  with pytest.raises(plan.ConfigError, match=r"config.form must be one of '' with "
                     r"config.objective='simclr', got '" + form + "'"):
    pretraining.check_config(config)
  pretraining.check_config(_tiny_config(objective="simclr", form=""))
  assert pretraining.form(_tiny_config(objective="simclr", form="")) is None
  with pytest.raises(plan.ConfigError, match="config.form must be one of 'supcon', 'ntxent'"):
    pretraining.check_config(_tiny_config(form=""))
  assert pretraining.form(_tiny_config(form=form)) == form


def test_unknown_objective_is_one_line_and_exit_2(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.simclr",
       f"--config={os.path.join(ROOT, 'experiments', 'configs', 'supcon_digits.py')}",
       f"--workdir={tmp_path / 'run'}", "--config.objective=simclr2"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.startswith("error: config.objective must be one of 'simclr', 'supcon', "
                                "got 'simclr2'.")
  assert len(proc.stderr.strip().splitlines()) == 1
  assert not (tmp_path / "run").exists()
