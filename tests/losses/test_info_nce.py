"""The loss engine against a NumPy reference (every mode, mapping, mask, bank and tile size),
dense autodiff, optax, invariants, edge cases and bad input."""

import functools
import math

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

from tests.helpers import dense_info_nce, edge_views
from tests.helpers.marks import widest, widest_cases
from tfcl_jax import losses, mappings

DTYPES = (jnp.float64, jnp.float32, jnp.bfloat16, jnp.float16)
MODES = (("cross", False), ("cross", True), ("all", False))  # (negatives, symmetric)

# NumPy versions of the mappings, written independently of tfcl_jax.mappings.
NUMPY_MAPPINGS = {
    "tau=0.1": lambda c: c / 0.1,
    "tau=0.02": lambda c: c / 0.02,  # below 1/30: the engine takes the running-max path
    "free": lambda c: np.log1p(c) - np.log1p(-c),
    "learnable=0.2": lambda c: c / 0.2,
    "dynamic=0.1:0.3": lambda c: c / (0.1 + 0.1 * (1 + np.cos(np.pi * (1 + c)))),
    "anneal=linear:1:0.5:10": lambda c: c / 0.75,  # at step 5 (bound below)
}


def numpy_info_nce(z1, z2, logits_of, negatives, symmetric=False, where=None, bank=None,
                   bank_where=None):
  """Per-row losses, a plain loop over anchors: -log softmax of the positive among candidates."""
  z1, z2 = np.asarray(z1, np.float64), np.asarray(z2, np.float64)
  n = len(z1)
  keep = np.ones(n, bool) if where is None else np.asarray(where)
  unit = lambda z: z / np.linalg.norm(z, axis=1, keepdims=True)  # noqa: E731
  u1, u2 = unit(z1), unit(z2)
  extra = np.zeros((0, z1.shape[1])) if bank is None else unit(np.asarray(bank, np.float64))
  if bank is not None and bank_where is not None:
    extra = extra[np.asarray(bank_where)]

  def direction(anchors, candidates, positive, valid, candidate_ok):
    out = np.zeros(len(anchors))
    for i, anchor in enumerate(anchors):
      if not valid[i]:
        continue
      logits = [logits_of(anchor @ c) for j, c in enumerate(candidates) if candidate_ok(i, j)]
      logits += [logits_of(anchor @ c) for c in extra]
      out[i] = np.log(np.sum(np.exp(logits))) - logits_of(anchor @ candidates[positive[i]])
    return out

  if negatives == "cross":
    forward = direction(u1, u2, np.arange(n), keep, lambda i, j: keep[j])
    if not symmetric:
      return forward
    return np.concatenate([forward, direction(u2, u1, np.arange(n), keep, lambda i, j: keep[j])])
  both, valid = np.concatenate([u1, u2]), np.concatenate([keep, keep])
  return direction(both, both, (np.arange(2 * n) + n) % (2 * n), valid,
                   lambda i, j: i != j and valid[j])


def _mapping(spec):
  """The mapping of `spec`, held at its initial params (a learnable one is refused unbound) and,
  scheduled, at step 5."""
  mapping = mappings.from_spec(spec)
  if mapping.learnable:
    mapping = mapping.bind(params=mapping.params)
  return mapping.bind(step=5) if mapping.scheduled else mapping


def random_pair(n, d, seed=0, noise=0.5):
  rng = np.random.default_rng(seed)
  z1 = rng.normal(size=(n, d))
  return z1, z1 + noise * rng.normal(size=(n, d))


@pytest.mark.parametrize("negatives, symmetric", widest_cases(*MODES, quick=[("all", False)]))
def test_every_mapping_mask_bank_and_tile_equals_numpy(negatives, symmetric):
  n, d = 13, 5
  z1, z2 = random_pair(n, d, seed=1)
  rng = np.random.default_rng(2)
  where = rng.random(n) > 0.3
  bank, bank_where = rng.normal(size=(6, d)), np.array([1, 0, 1, 1, 0, 1], bool)
  # (where, bank, block_size): dense, tiles not dividing the rows, masks, a bank.
  cases = [(False, False, None), (True, False, 4), (False, True, 5), (True, True, 3)]
  with jax.enable_x64(True):
    @jax.jit
    def run(z1, z2, where, bank, bank_where):
      return {(spec, case): losses.info_nce(
          z1, z2, mapping=_mapping(spec), negatives=negatives, symmetric=symmetric,
          where=where if case[0] else None, block_size=case[2], reduction="none",
          extra_negatives=bank if case[1] else None,
          extra_where=bank_where if case[1] else None)
          for spec in NUMPY_MAPPINGS for case in cases}

    got = run(z1, z2, where, bank, bank_where)
  for (spec, (masked, banked, _)), rows in got.items():
    expected = numpy_info_nce(z1, z2, NUMPY_MAPPINGS[spec], negatives, symmetric,
                              where if masked else None, bank if banked else None,
                              bank_where if banked else None)
    np.testing.assert_allclose(rows, expected, rtol=1e-10, atol=1e-12, err_msg=str(spec))


def _dense_reference_loss(z1, z2, logits_of, negatives, symmetric):
  """Mean loss from full `[N, N]` / `[2N, 2N]` logits, for autodiff (independent of the engine)."""
  return dense_info_nce.row_losses(z1, z2, logits_of, negatives, symmetric).mean()


@pytest.mark.parametrize("negatives, symmetric", widest_cases(*MODES, quick=[("cross", True)]))
def test_gradients_equal_dense_autodiff_including_learnable_t(negatives, symmetric):
  z1, z2 = random_pair(11, 6, seed=3, noise=0.3)
  jax_mappings = {"tau=0.1": lambda c, t: c / 0.1, "tau=0.02": lambda c, t: c / 0.02,
              "free": lambda c, t: jnp.log1p(c) - jnp.log1p(-c),
              "learnable": lambda c, t: jnp.exp(t) * c,
              "dynamic=0.1:0.3": lambda c, t: c / jax.lax.stop_gradient(
                  0.1 + 0.1 * (1 + jnp.cos(jnp.pi * (1 + c))))}
  with jax.enable_x64(True):
    @functools.partial(jax.jit, static_argnums=2)
    def grads(z1, z2, block_size):
      out = {}
      for spec, logits_of in jax_mappings.items():
        def ours(a, b, t, spec=spec):
          mapping = (mappings.learnable_temperature(t=t) if spec == "learnable"
                     else mappings.from_spec(spec))
          return losses.info_nce(a, b, mapping=mapping, negatives=negatives,
                                 symmetric=symmetric, block_size=block_size)

        def reference(a, b, t, logits_of=logits_of):
          return _dense_reference_loss(a, b, lambda c: logits_of(c, t), negatives, symmetric)

        t = jnp.log(1 / 0.3)
        out[spec] = (jax.value_and_grad(ours, argnums=(0, 1, 2))(z1, z2, t),
                     jax.value_and_grad(reference, argnums=(0, 1, 2))(z1, z2, t))
      return out

    for block_size in (None, 4):
      for spec, (got, expected) in grads(z1, z2, block_size).items():
        chex.assert_trees_all_close(got, expected, rtol=1e-9, atol=1e-11, custom_message=spec)


def test_symmetric_is_the_mean_of_both_directions():
  z1, z2 = random_pair(9, 4, seed=4)
  z1, z2 = z1.astype(np.float32), z2.astype(np.float32)
  for mapping in (mappings.temperature_free(), mappings.temperature(0.07)):
    both = losses.info_nce(z1, z2, mapping=mapping, symmetric=True)
    halves = (losses.info_nce(z1, z2, mapping=mapping) + losses.info_nce(z2, z1, mapping=mapping))
    np.testing.assert_allclose(both, halves / 2, rtol=1e-6)


def test_extra_negatives_take_no_gradient_and_masked_entries_change_nothing():
  z1, z2 = random_pair(6, 4, seed=5)
  z1, z2 = z1.astype(np.float32), z2.astype(np.float32)
  bank = np.random.default_rng(6).normal(size=(4, 4)).astype(np.float32)
  grad = jax.grad(lambda b: losses.info_nce(z1, z2, extra_negatives=b))(bank)
  np.testing.assert_array_equal(grad, 0.0)
  masked = losses.info_nce(z1, z2, extra_negatives=bank, extra_where=np.array([1, 0, 0, 1], bool))
  np.testing.assert_allclose(masked, losses.info_nce(z1, z2, extra_negatives=bank[[0, 3]]),
                             rtol=1e-6)
  none = losses.info_nce(z1, z2, extra_negatives=bank, extra_where=np.zeros(4, bool))
  np.testing.assert_allclose(none, losses.info_nce(z1, z2), rtol=1e-6)


@pytest.mark.parametrize("tau", [0.07, 0.5, 1.0])
def test_all_equals_optax_ntxent(tau):
  z1, z2 = random_pair(16, 8, seed=3)
  z1, z2 = z1.astype(np.float32), z2.astype(np.float32)
  labels = jnp.concatenate([jnp.arange(16), jnp.arange(16)])
  expected = optax.losses.ntxent(jnp.concatenate([z1, z2]), labels, temperature=tau)
  got = losses.info_nce(z1, z2, mapping=mappings.temperature(tau), negatives="all")
  np.testing.assert_allclose(got, expected, rtol=2e-5)


@pytest.mark.parametrize("spec", ["tau=0.1", "free", "dynamic=0.1:0.3"])
def test_every_loss_takes_a_spec_string_as_its_mapping(spec):
  z1, z2 = random_pair(12, 5, seed=4)
  expected = numpy_info_nce(z1, z2, NUMPY_MAPPINGS[spec], "cross").mean()
  np.testing.assert_allclose(losses.info_nce(z1, z2, mapping=spec), expected, rtol=1e-5)
  labels = np.arange(24) % 12
  np.testing.assert_allclose(
      losses.supervised_info_nce(np.concatenate([z1, z2]), labels, mapping=spec),
      numpy_info_nce(z1, z2, NUMPY_MAPPINGS[spec], "all").mean(), rtol=1e-5)
  np.testing.assert_allclose(losses.sigmoid_loss(z1, z2, mapping=spec),
                             losses.sigmoid_loss(z1, z2, mapping=mappings.from_spec(spec)))


def test_a_mapping_that_is_no_spec_and_no_callable_is_refused_by_name():
  z1, z2 = random_pair(4, 3)
  with pytest.raises(ValueError, match="Invalid mapping spec 'fre'"):
    losses.info_nce(z1, z2, mapping="fre")
  with pytest.raises(TypeError, match="mapping must be .* a mapping spec string"):
    losses.info_nce(z1, z2, mapping=0.1)


@pytest.mark.parametrize("tau", [0.1, 0.5])
def test_supervised_equals_optax_ntxent(tau):
  rng = np.random.default_rng(1)
  z = rng.normal(size=(24, 6)).astype(np.float32)
  labels = rng.integers(0, 5, size=24)
  expected = optax.losses.ntxent(jnp.asarray(z), jnp.asarray(labels), temperature=tau)
  got = losses.supervised_info_nce(z, labels, mapping=mappings.temperature(tau))
  np.testing.assert_allclose(got, expected, rtol=2e-5)


def test_supervised_with_two_views_equals_info_nce_all():
  z1, z2 = random_pair(9, 4, seed=2)
  labels = np.concatenate([np.arange(9), np.arange(9)])
  for spec in ("free", "tau=0.2", "dynamic=0.1:0.2"):
    mapping = mappings.from_spec(spec)
    np.testing.assert_allclose(
        losses.supervised_info_nce(np.concatenate([z1, z2]).astype(np.float32), labels,
                                   mapping=mapping),
        losses.info_nce(z1.astype(np.float32), z2.astype(np.float32), mapping=mapping,
                        negatives="all"), rtol=1e-5)


class InvariantTest(chex.TestCase):

  def test_all_equal_embeddings_give_log_candidates(self):
    n = 10
    z = np.tile(np.array([[0.3, -1.2, 2.0, 0.7]], np.float32), (n, 1))
    specs = ("tau=0.1", "free", "learnable", "dynamic=0.1:0.2", "anneal=cosine:1:0.1:10")

    @jax.jit
    def run(z):
      held = {spec: mappings.from_spec(spec) for spec in specs}  # at their initial params, step 0
      held = {spec: m.bind(params=m.params, step=0) for spec, m in held.items()}
      return {(spec, negatives, symmetric): losses.info_nce(
          z, z, mapping=held[spec], negatives=negatives, symmetric=symmetric,
          block_size=3) for spec in specs for negatives, symmetric in MODES}

    for (_, negatives, _), value in run(z).items():
      expected = math.log(n) if negatives == "cross" else math.log(2 * n - 1)
      np.testing.assert_allclose(value, expected, rtol=1e-6)

  def test_where_equals_valid_subset_and_masked_rows_get_no_gradient(self):
    z1, z2 = random_pair(11, 5, seed=4)
    z1, z2 = z1.astype(np.float32), z2.astype(np.float32)
    where = np.array([1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1], bool)
    for negatives, symmetric in MODES:
      kwargs = dict(negatives=negatives, symmetric=symmetric)
      masked, grads = jax.jit(jax.value_and_grad(
          lambda a, kw=kwargs: losses.info_nce(a, z2, where=where, **kw)))(z1)
      subset = jax.jit(lambda a, b, kw=kwargs: losses.info_nce(a, b, **kw))(z1[where], z2[where])
      np.testing.assert_allclose(masked, subset, rtol=1e-6)
      np.testing.assert_array_equal(grads[~where], 0.0)

  def test_where_with_no_valid_pair_is_zero_with_finite_gradient(self):
    z1, z2 = random_pair(4, 3)
    where = np.zeros(4, bool)
    value, grad = jax.value_and_grad(lambda a: losses.info_nce(a, z2.astype(np.float32),
                                                               where=where))(z1.astype(np.float32))
    assert float(value) == 0.0
    chex.assert_tree_all_finite(grad)

  def test_scale_invariance_and_reductions(self):
    z1, z2 = random_pair(6, 4, seed=6)
    z1, z2 = z1.astype(np.float32), z2.astype(np.float32)
    np.testing.assert_allclose(losses.info_nce(3.0 * z1, 0.1 * z2), losses.info_nce(z1, z2),
                               rtol=1e-5)
    for negatives, symmetric in MODES:
      rows = losses.info_nce(z1, z2, negatives=negatives, symmetric=symmetric, reduction="none")
      assert rows.shape == ((6,) if negatives == "cross" and not symmetric else (12,))
      total = losses.info_nce(z1, z2, negatives=negatives, symmetric=symmetric, reduction="sum")
      np.testing.assert_allclose(total, rows.sum(), rtol=1e-6)

  def test_precision_as_the_loss_goes_to_zero(self):
    # Eq. 12: L -> 0 as C -> 1. Orthogonal pairs, aligned views: each row's loss is
    # softplus(0 - f(1)) = log(1 + exp(-15.25)) in float32, far below float32's epsilon;
    # `logsumexp(all) - positive` would round it to exactly 0.
    z = np.eye(4, dtype=np.float32)[:2]
    expected = np.log1p(np.exp(-mappings.max_free_logit("float32")))
    for negatives, symmetric in MODES:
      got = losses.info_nce(z, z, negatives=negatives, symmetric=symmetric)
      candidates = 1 if negatives == "cross" else 2  # negatives, each at cosine 0
      np.testing.assert_allclose(got, candidates * expected, rtol=1e-3)


@pytest.mark.parametrize("dtype", widest(*DTYPES, quick=(jnp.float32, jnp.bfloat16)),
                         ids=[jnp.dtype(dtype).name for dtype in DTYPES])
def test_finite_loss_and_gradients(dtype):
  with jax.enable_x64(True):
    z1, z2 = edge_views.stacked(dtype)

    @jax.jit
    def run(z1, z2):
      out = []
      for spec in ("free", "tau=0.1", "learnable", "dynamic=0.1:0.2"):
        for negatives, symmetric in MODES:
          def loss(a, b, spec=spec, negatives=negatives, symmetric=symmetric):
            return losses.info_nce(a, b, mapping=_mapping(spec),
                                   negatives=negatives, symmetric=symmetric)
          out.append(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1)))(z1, z2))
      return out

    results = run(z1, z2)
    for value, _ in results:
      assert value.dtype == (jnp.float64 if dtype == jnp.float64 else jnp.float32)
    chex.assert_tree_all_finite(results)


class EdgeCaseTest(chex.TestCase):

  def test_positive_at_cos_one_beats_tau_bound(self):
    # Example 3.1: at [1, -1] the positive's probability is sigmoid(2 / tau) for division by
    # tau; the free mapping gets much closer to one.
    z1 = np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32)
    loss_tau = losses.info_nce(z1, z1, mapping=mappings.temperature(0.1))
    loss_free = losses.info_nce(z1, z1)
    np.testing.assert_allclose(loss_tau, -np.log(1 / (1 + np.exp(-20.0))), rtol=1e-4)
    assert float(loss_free) < float(loss_tau) * 1e-3


@hypothesis.settings(deadline=None, max_examples=5, derandomize=True)
@hypothesis.given(n=st.integers(2, 6), d=st.integers(1, 4), scale=st.floats(1e-3, 1e3),
                  seed=st.integers(0, 2**16), mode=st.sampled_from(MODES),
                  spec=st.sampled_from(["free", "tau=0.1", "dynamic=0.1:0.3"]))
def test_property_matches_reference_and_is_finite(n, d, scale, seed, mode, spec):
  z1, z2 = random_pair(n, d, seed=seed, noise=1.0)
  z1, z2 = z1 * scale, z2 * scale
  negatives, symmetric = mode
  value, grad = jax.jit(jax.value_and_grad(lambda a, b: losses.info_nce(
      a, b, mapping=mappings.from_spec(spec), negatives=negatives,
      symmetric=symmetric)))(z1.astype(np.float32), z2.astype(np.float32))
  chex.assert_tree_all_finite((value, grad))
  logits_of = NUMPY_MAPPINGS[spec]
  if spec == "free":  # float32's 8-ulp clamp: d = 1 gives cosines of exactly +-1
    margin = 8 * np.finfo(np.float32).epsneg
    logits_of = lambda c: NUMPY_MAPPINGS["free"](np.clip(c, -1 + margin, 1 - margin))  # noqa: E731
  expected = numpy_info_nce(z1, z2, logits_of, negatives, symmetric).mean()
  np.testing.assert_allclose(value, expected, rtol=2e-3, atol=2e-3)


def test_mapping_passes_through_jit_and_optax_updates_it():
  z1, z2 = random_pair(8, 4, seed=7)
  z1, z2 = z1.astype(np.float32), z2.astype(np.float32)
  mapping = mappings.learnable_temperature(tau=0.5)
  loss = jax.jit(lambda m, a, b: losses.info_nce(a, b, mapping=m, symmetric=True))
  grad = jax.grad(loss)(mapping, z1, z2)
  assert isinstance(grad, mappings.Mapping) and grad.spec == mapping.spec
  t = mapping.params["t"]
  numeric = (loss(mapping.bind(params={"t": t + 1e-2}), z1, z2)
             - loss(mapping.bind(params={"t": t - 1e-2}), z1, z2)) / 2e-2
  np.testing.assert_allclose(grad.params["t"], numeric, rtol=1e-2)
  optimizer = optax.sgd(0.1)
  updates, _ = optimizer.update(grad, optimizer.init(mapping))
  moved = optax.apply_updates(mapping, updates)
  np.testing.assert_allclose(moved.params["t"], t - 0.1 * grad.params["t"], rtol=1e-6)
  assert loss._cache_size() == 1  # same spec and form: one compilation for both mappings


def test_vmap_over_batches_of_pairs():
  rng = np.random.default_rng(0)
  z1 = rng.normal(size=(3, 5, 4)).astype(np.float32)
  z2 = rng.normal(size=(3, 5, 4)).astype(np.float32)
  batched = jax.vmap(lambda a, b: losses.info_nce(a, b, negatives="all"))(z1, z2)
  looped = [losses.info_nce(a, b, negatives="all") for a, b in zip(z1, z2, strict=True)]
  np.testing.assert_allclose(batched, looped, rtol=1e-6)


def _largest_intermediate(jaxpr) -> int:
  largest = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      largest = max(largest, math.prod(getattr(var.aval, "shape", ())))
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", None)
        if inner is not None:
          largest = max(largest, _largest_intermediate(getattr(inner, "jaxpr", inner)))
  return largest


def test_loss_and_gradient_never_hold_the_logits():
  n, d, block_size = 64, 4, 8
  z1, z2 = random_pair(n, d)
  for negatives, symmetric in MODES:
    def loss(a, b, block_size, negatives=negatives, symmetric=symmetric):
      return losses.info_nce(a, b, negatives=negatives, symmetric=symmetric,
                             block_size=block_size)

    rows = n if negatives == "cross" else 2 * n
    dense = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(z1, z2, rows)
    tiled = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(z1, z2, block_size)
    assert _largest_intermediate(dense.jaxpr) >= rows**2  # the check sees the logits
    assert _largest_intermediate(tiled.jaxpr) <= max(block_size**2, 2 * n * d)


def test_balanced_tile_bounds_memory_keeps_tile_count_and_pads_under_a_row_per_tile():
  for n in range(1, 200):
    for block_size in range(1, 230, 7):
      tile = losses.balanced_tile(block_size, n)
      count = -(-n // block_size)
      assert tile <= block_size and -(-n // tile) == count and count * tile - n < count


def test_fast_forms_are_declared_by_the_mapping():
  bound = mappings.temperature_free().bind(params={}, step=3)
  assert bound.exp_form(jnp.float32) is not None  # bind keeps the Eq. 11 closed form
  assert mappings.temperature(0.1).exp_form(jnp.float32).shift == pytest.approx(10.0)
  assert mappings.temperature(0.02).exp_form(jnp.float32) is None  # 2/tau = 100 nats
  assert mappings.temperature(0.02).exp_form(jnp.float64) is not None
  assert mappings.learnable_temperature(tau=0.5).exp_form(jnp.float32) is None
  assert mappings.as_mapping(lambda c: 2 * c).exp_form(jnp.float32) is None
  assert mappings.dynamic_temperature(0.02, 0.2).exp_form(jnp.float32) is None


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 2e-6), (np.float64, 1e-14)])
def test_dynamic_exp_form_equals_numpy(dtype, rtol):
  # DySTreSS: w = exp(s / tau(s) - 1/tau_min) with tau from its cosine formula, dw/ds = w / tau.
  cos = np.linspace(-1.0, 1.0, 4001)
  tau = 0.1 + 0.5 * (0.3 - 0.1) * (1.0 + np.cos(np.pi * (1.0 + cos)))
  weight = np.exp(cos / tau - 10.0)
  with jax.enable_x64(dtype == np.float64):
    form = mappings.dynamic_temperature(0.1, 0.3).exp_form(jnp.dtype(dtype))
    assert form.shift == pytest.approx(10.0)  # |s / tau(s)| <= 1 / tau_min: w <= 1
    x = jnp.asarray(cos, dtype)
    np.testing.assert_allclose(form.weight(x), weight, rtol=rtol, atol=1e-30)
    np.testing.assert_allclose(form.weight_grad(x), weight / tau, rtol=rtol, atol=1e-30)
    assert float(jnp.max(form.weight(x))) <= 1.0  # the shift bounds every weight


class BadInputTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.z = np.ones((4, 3), np.float32)

  def test_shapes_and_dtypes(self):
    with pytest.raises(ValueError, match="z1 must have rank 2"):
      losses.info_nce(np.ones(4, np.float32), np.ones(4, np.float32))
    with pytest.raises(ValueError, match="z must have rank 2"):
      losses.supervised_info_nce(np.ones((2, 3, 4), np.float32), np.zeros(2, int))
    with pytest.raises(ValueError, match="same shape"):
      losses.info_nce(self.z, np.ones((4, 2), np.float32))
    with pytest.raises(TypeError, match="z2 must have a floating dtype"):
      losses.info_nce(self.z, np.ones((4, 3), np.int32))
    with pytest.raises(ValueError, match="N >= 2"):
      losses.info_nce(self.z[:1], self.z[:1])

  def test_bad_modes(self):
    with pytest.raises(ValueError, match="negatives"):
      losses.info_nce(self.z, self.z, negatives="some")
    with pytest.raises(ValueError, match="reduction"):
      losses.info_nce(self.z, self.z, reduction="max")
    with pytest.raises(ValueError, match="symmetric=True is for negatives=\"cross\""):
      losses.info_nce(self.z, self.z, negatives="all", symmetric=True)
    with pytest.raises(TypeError, match="symmetric must be a bool"):
      losses.info_nce(self.z, self.z, symmetric="yes")

  def test_bad_where_and_bank(self):
    with pytest.raises(TypeError, match="where"):
      losses.info_nce(self.z, self.z, where=np.ones(4, np.float32))
    with pytest.raises(ValueError, match="where"):
      losses.info_nce(self.z, self.z, where=np.ones(3, bool))
    with pytest.raises(ValueError, match=r"extra_negatives must have shape \[K, 3\]"):
      losses.info_nce(self.z, self.z, extra_negatives=np.ones((5, 2), np.float32))
    with pytest.raises(ValueError, match="extra_where"):
      losses.info_nce(self.z, self.z, extra_negatives=self.z, extra_where=np.ones(3, bool))
    with pytest.raises(ValueError, match="extra_where was given without extra_negatives"):
      losses.info_nce(self.z, self.z, extra_where=np.ones(3, bool))

  def test_bad_block_size_and_mapping(self):
    for block_size in (0, -3):
      with pytest.raises(ValueError, match="block_size"):
        losses.info_nce(self.z, self.z, block_size=block_size)
    for block_size in (2.0, True, "4"):
      with pytest.raises(TypeError, match="block_size"):
        losses.info_nce(self.z, self.z, block_size=block_size)
    assert losses.check_block_size(np.int64(8)) == 8
    with pytest.raises(TypeError, match="mapping"):
      losses.info_nce(self.z, self.z, mapping=0.1)

  def test_bad_labels(self):
    with pytest.raises(TypeError, match="labels"):
      losses.supervised_info_nce(self.z, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="labels"):
      losses.supervised_info_nce(self.z, np.zeros(3, int))
    with pytest.raises(ValueError, match="positive pair"):
      losses.supervised_info_nce(self.z, np.arange(4))


def test_dot_product_softmax_is_optax_cross_entropy():
  rng = np.random.default_rng(0)
  q, c = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
  want = optax.softmax_cross_entropy(q @ c.T, np.eye(6))
  np.testing.assert_allclose(losses.dot_product_softmax(q, c, reduction="none"), want, rtol=1e-6)
  np.testing.assert_allclose(losses.dot_product_softmax(q, c, reduction="sum"), want.sum(),
                             rtol=1e-6)
  where = np.array([1, 1, 0, 1, 1, 1], bool)
  keep = np.flatnonzero(where)
  want = optax.softmax_cross_entropy(q[keep] @ c[keep].T, np.eye(5)).mean()
  np.testing.assert_allclose(losses.dot_product_softmax(q, c, where=where), want, rtol=1e-6)
  bias = rng.normal(size=6)
  want = optax.softmax_cross_entropy(q @ c.T + bias[None, :], np.eye(6)).mean()
  np.testing.assert_allclose(losses.dot_product_softmax(q, c, candidate_bias=bias), want,
                             rtol=1e-6)
  with pytest.raises(ValueError, match=r"candidate_bias must have shape \(6,\)"):
    losses.dot_product_softmax(q, c, candidate_bias=bias[:3])
  with pytest.raises(ValueError, match="q and c must have the same shape"):
    losses.dot_product_softmax(q, c[:, :3])


@pytest.mark.parametrize("spec", ["tau=0.004", "calibrated_free@100"])
@pytest.mark.parametrize("block_size", widest(None, 4, quick=(4,)))
def test_sharp_one_directional_gradient_is_finite_and_equals_dense_autodiff(spec, block_size):
  # Logits up to +-250 (float32's exp overflows past ~88): the columns of a one-directional loss
  # take no gradient and have no logsumexp of their own, and once gave 0 * inf = NaN there.
  z1, z2 = random_pair(10, 3, seed=7, noise=1.5)
  if spec == "tau=0.004":
    mapping, logits_of = mappings.temperature(0.004), lambda c: c / 0.004
  else:  # the batch-scaled mapping bound at its cap: s 2 artanh(c), s = 100
    mapping = mappings.calibrated_free().bind(scale=mappings.S_MAX)
    logits_of = lambda c: mappings.S_MAX * (jnp.log1p(c) - jnp.log1p(-c))  # noqa: E731
  value, grad = jax.value_and_grad(lambda a: losses.info_nce(
      a, z2.astype(np.float32), mapping=mapping, block_size=block_size))(z1.astype(np.float32))
  chex.assert_tree_all_finite((value, grad))
  with jax.enable_x64(True):
    expected, expected_grad = jax.value_and_grad(lambda a: _dense_reference_loss(
        a, jnp.asarray(z2), logits_of, "cross", False))(jnp.asarray(z1))
  assert float(expected) > 1.0  # a loss well above float32's rounding: the gradient is not zero
  np.testing.assert_allclose(value, expected, rtol=1e-4)
  np.testing.assert_allclose(grad, expected_grad, rtol=2e-3,
                             atol=2e-4 * float(np.abs(expected_grad).max()))
