"""Temperature studies: the Langevin step, the simplex optimum, tiny end-to-end runs."""

from __future__ import annotations

import csv
import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import hard_negatives, learnable_vs_free, sphere
from experiments.configs import hard_negatives as hard_negatives_config
from experiments.configs import learnable_vs_free as learnable_vs_free_config
from experiments.configs import sphere as sphere_config
from experiments.framework import plan, sphere_study
from tfcl_jax import langevin, mappings


class LangevinStepTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_gradient_step_matches_numpy_projected_descent(self):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 4))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    g = rng.normal(size=(5, 4))
    step = self.variant(lambda z, g: langevin.langevin_step(z, g, key=None, lr=0.1))
    moved = z - 0.1 * (g - np.sum(g * z, axis=1, keepdims=True) * z)
    expected = moved / np.linalg.norm(moved, axis=1, keepdims=True)
    chex.assert_trees_all_close(step(jnp.asarray(z, jnp.float32), jnp.asarray(g, jnp.float32)),
                                expected.astype(np.float32), atol=1e-6)

  def test_infinite_beta_is_plain_descent(self):
    z = langevin.random_sphere(jax.random.key(0), (6, 3))
    g = jax.random.normal(jax.random.key(1), (6, 3))
    noisy = langevin.langevin_step(z, g, key=jax.random.key(2), lr=0.05, beta=math.inf)
    chex.assert_trees_all_close(noisy, langevin.langevin_step(z, g, key=None, lr=0.05))

  def test_noise_has_langevin_variance(self):
    # One step from the north pole with zero gradient: the tangent displacement has
    # per-coordinate variance 2 lr / beta (to first order in the step).
    d, lr, beta = 4, 1e-4, 2.0
    z = jnp.tile(jnp.eye(d)[:1], (20000, 1))
    moved = langevin.langevin_step(z, jnp.zeros_like(z), key=jax.random.key(3), lr=lr, beta=beta)
    variance = np.var(np.asarray(moved[:, 1:], np.float64))
    np.testing.assert_allclose(variance, 2 * lr / beta, rtol=0.05)
    np.testing.assert_allclose(np.linalg.norm(moved, axis=1), 1.0, atol=1e-6)

  def test_tangent_is_orthogonal_and_low_precision_storage_is_kept(self):
    z = langevin.random_sphere(jax.random.key(0), (3, 5))
    v = jax.random.normal(jax.random.key(1), (3, 5))
    np.testing.assert_allclose(np.sum(langevin.tangent(z, v) * z, axis=1), 0.0, atol=1e-6)
    z16 = z.astype(jnp.bfloat16)
    moved = langevin.langevin_step(z16, v.astype(jnp.bfloat16), key=None, lr=0.1)
    assert moved.dtype == jnp.bfloat16

  def test_bad_arguments_are_named(self):
    z = jnp.eye(2)
    with pytest.raises(ValueError, match="beta"):
      langevin.langevin_step(z, z, key=None, lr=0.1, beta=0.0)
    with pytest.raises(ValueError, match="lr"):
      langevin.langevin_step(z, z, key=None, lr=-1.0)
    with pytest.raises(ValueError, match="gradient"):
      langevin.langevin_step(z, z[:1], key=None, lr=0.1)
    with pytest.raises(TypeError, match="z"):
      langevin.langevin_step(jnp.eye(2, dtype=jnp.int32), z, key=None, lr=0.1)
    with pytest.raises(ValueError, match="shape"):
      langevin.random_sphere(jax.random.key(0), (3, 1))


class OptimumTest(chex.TestCase):

  def test_simplex_geometry(self):
    for m, d in [(2, 1), (4, 3), (9, 8), (5, 16)]:
      v = sphere.simplex(m, d)
      gram = v @ v.T
      np.testing.assert_allclose(np.diag(gram), 1.0, atol=1e-12)
      np.testing.assert_allclose(gram[~np.eye(m, dtype=bool)], -1.0 / (m - 1), atol=1e-12)

  def test_optimal_loss_matches_closed_form(self):
    # Both views at the simplex: each anchor sees its positive at cosine 1 and
    # M - 1 ("cross") or 2(M - 1) ("all") negatives at -1/(M - 1).
    m, d, tau = 6, 8, 0.3
    v = jnp.asarray(sphere.simplex(m, d), jnp.float32)
    for negatives, count in (("cross", m - 1), ("all", 2 * (m - 1))):
      value = jax.jit(lambda v, negatives=negatives: sphere_study.mean_loss(
          v, v, mappings.temperature(tau), negatives))(v)
      expected = math.log1p(count * math.exp((-1.0 / (m - 1) - 1.0) / tau))
      np.testing.assert_allclose(float(value), expected, rtol=1e-5)

  def test_no_random_configuration_beats_the_simplex(self):
    # Aligned random configurations (the hardest competitors: positives at cosine 1).
    m, d = 5, 6
    v = jnp.asarray(sphere.simplex(m, d), jnp.float32)
    keys = jax.random.split(jax.random.key(0), 256)
    maps = (mappings.temperature(0.2), mappings.temperature_free())

    @jax.jit
    def margins(keys):
      def loss(key, mapping):
        z = v if key is None else langevin.random_sphere(key, (m, d))
        return sphere_study.mean_loss(z, z, mapping, "cross")

      return [jnp.min(jax.vmap(lambda k, f=f: loss(k, f))(keys)) - loss(None, f) for f in maps]

    tau_margin, free_margin = margins(keys)
    assert float(tau_margin) >= 0.0
    # Aligned, the free loss is ~1e-6 everywhere: it tells configurations apart only up to
    # the rounding of `logsumexp - positive logit` (1 ulp of the clamped logit 15.25).
    assert float(free_margin) >= -float(np.spacing(np.float32(mappings.max_free_logit("float32"))))

  def test_reached_criterion(self):
    v = jnp.asarray(sphere.simplex(4, 3), jnp.float32)
    reached = jax.jit(lambda a, b: sphere.reached(a, b, tol=1e-3))
    assert bool(reached(v, v))
    assert not bool(reached(v, jnp.roll(v, 1, axis=0)))

  def test_setting_errors(self):
    with pytest.raises(ValueError, match="M <= d"):
      sphere.parse_setting("3:5:cross")
    with pytest.raises(ValueError, match="negatives"):
      sphere.parse_setting("3:4:some")
    with pytest.raises(ValueError, match="d:M"):
      sphere.parse_setting("3-4")


def _read_csv(path):
  with open(path) as file:
    return list(csv.DictReader(file))


def test_sphere_end_to_end(tmp_path):
  config = sphere_config.get_config()
  config.settings = ("3:4:cross",)
  config.mappings = ("learnable=0.5",)
  config.seeds, config.steps, config.eval_every, config.plots = 2, 20, 10, True
  sphere.check_config(config)
  rows = sphere.train_and_evaluate(config, str(tmp_path))
  assert len(rows) == 2  # 1 map x 2 optimizers, one compilation.
  assert {r["optimizer"] for r in rows} == {"sgd", "langevin"}
  assert len(_read_csv(tmp_path / "results.csv")) == 2
  assert "python" in (tmp_path / "results.md").read_text()
  assert os.path.exists(tmp_path / "curves_3_4_cross.png")
  for row in rows:
    assert row["loss_gap_min"] > -1e-5  # nothing below the simplex optimum.
    assert 0.0 <= row["reached"] <= 1.0


def test_sphere_augmented_views_cannot_align(tmp_path):
  config = sphere_config.get_config()
  config.settings, config.mappings, config.optimizers = ("3:4:cross",), ("free",), ("sgd",)
  config.seeds, config.steps, config.eval_every, config.plots = 2, 20, 20, False
  config.augment = 0.5
  sphere.check_config(config)
  (row,) = sphere.train_and_evaluate(config, str(tmp_path))
  assert row["augment"] == 0.5
  assert row["alignment"] > 1e-3  # fixed perturbations keep the views apart.
  assert "Augmented views" in (tmp_path / "results.md").read_text()


def test_reference_loss_is_float64_info_nce():
  z1 = jax.random.normal(jax.random.key(0), (5, 4))
  z2 = z1 + 0.3 * jax.random.normal(jax.random.key(1), (5, 4))
  for spec in ("free", "tau=0.2"):
    mapping = mappings.from_spec(spec)
    library = jax.jit(lambda a, b, f=mapping: sphere_study.mean_loss(a, b, f, "cross"))(z1, z2)
    np.testing.assert_allclose(learnable_vs_free.reference_loss(z1, z2, spec), float(library),
                               rtol=1e-5)


def test_learnable_vs_free_end_to_end(tmp_path):
  config = learnable_vs_free_config.get_config()
  config.stuck.m, config.stuck.d = 3, 6
  config.stuck.steps, config.stuck.report_steps = 12, (1, 10)
  config.stuck.mappings = ("learnable=1",)
  config.precision.mappings = ("free",)
  config.precision.steps, config.precision.every = 20, 10
  config.plots = False
  learnable_vs_free.check_config(config)
  rows = learnable_vs_free.train_and_evaluate(config, str(tmp_path))
  orthogonal, control = [r for r in rows if r["part"] == "stuck_t"]
  assert orthogonal["C0"] == 0.0 and orthogonal["dLdt_step0"] == 0.0  # Eq. 10 at C = 0, any t.
  assert orthogonal["t@1"] == orthogonal["t0"]  # so the first step leaves t where it was,
  assert control["dLdt_step0"] > 0.0 and control["t@1"] != control["t0"]  # unlike at C = 0.5.
  precision = [r for r in rows if r["part"] == "precision"]
  assert [r["dtype"] for r in precision] == ["float32", "bfloat16"]
  assert all(r["all_finite"] for r in precision)
  assert len(_read_csv(tmp_path / "results.csv")) == 4  # 2 starts + 2 dtypes.


def test_hard_negative_instances_have_the_requested_cosines():
  config = hard_negatives_config.get_config()
  @jax.jit
  def make(key):
    anchor, positive, negatives, hard = hard_negatives.instances(
        key, n=4, k=8, d=16, n_hard=3, config=config)
    return hard_negatives.cosines(anchor, positive, negatives), negatives, hard

  cos, negatives, hard = jax.tree.map(np.asarray, make(jax.random.key(0)))
  np.testing.assert_allclose(cos[:, 0], config.s_pos, atol=1e-5)
  assert np.asarray(hard).sum() == 3
  assert np.all(cos[:, 1:4] <= config.s_pos + 1e-5)
  assert np.all(cos[:, 1:4] >= config.s_pos - config.hard_gap - 1e-5)
  assert np.all(np.abs(cos[:, 4:]) <= config.easy_spread + 1e-5)
  np.testing.assert_allclose(np.linalg.norm(negatives, axis=-1), 1.0, atol=1e-5)


def test_instance_loss_is_log_k_plus_one_at_equal_cosines():
  cos = jnp.zeros((3, 9))
  for mapping in (mappings.temperature(0.1), mappings.temperature_free()):
    value = jax.jit(lambda c, f=mapping: hard_negatives.instance_loss(c, f))(cos)
    np.testing.assert_allclose(float(value), math.log(9), rtol=1e-6)


def test_hard_negatives_end_to_end(tmp_path):
  config = hard_negatives_config.get_config()
  config.mappings = ("free",)
  config.hard_fractions = (0.0, 1.0)
  config.seeds, config.instances, config.num_negatives, config.steps = 2, 4, 4, 10
  config.plots = False  # the sphere test covers the figures.
  config.augment = 0.3  # the perturbed path (it contains the plain one).
  hard_negatives.check_config(config)
  rows = hard_negatives.train_and_evaluate(config, str(tmp_path))
  assert len(rows) == 2
  by = {(r["spec"], r["hard_fraction"]): r for r in rows}
  assert by[("free", 0.0)]["hard_share"] == 0.0
  assert by[("free", 1.0)]["hard_share"] == pytest.approx(1.0)
  assert "Augmented views" in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize("module, config_module, field, value, message", [
    (sphere, sphere_config, "mappings", ("tau=0.1", "warm"), "config.mappings: .*'warm'"),
    (sphere, sphere_config, "settings", ("3:5:cross",), "config.settings: .*M <= d"),
    (sphere, sphere_config, "eval_every", 7, "multiple of config.eval_every"),
    (sphere, sphere_config, "optimizers", ("adam",), "config.optimizers"),
    (hard_negatives, hard_negatives_config, "mappings", ("tua=1",), "config.mappings"),
    (hard_negatives, hard_negatives_config, "hard_fractions", (0.5, 2.0),
     "config.hard_fractions"),
    (hard_negatives, hard_negatives_config, "dim", 10**9, "embedding values per seed"),
    (learnable_vs_free, learnable_vs_free_config, "stuck.d", 4, "config.stuck.d must be >= 2"),
    (learnable_vs_free, learnable_vs_free_config, "precision.mappings", ("learnable",),
     "config.precision.mappings: the float64 reference"),
    (learnable_vs_free, learnable_vs_free_config, "precision.every", 3, "multiple of"),
])
def test_study_configs_are_checked_before_any_work(module, config_module, field, value,
                                                   message):
  config = config_module.get_config()
  *parents, name = field.split(".")
  owner = config
  for parent in parents:  # a nested field: `config["stuck.d"] = ...` is refused
    owner = owner[parent]
  owner[name] = value
  with pytest.raises(plan.ConfigError, match=message):
    module.check_config(config)
