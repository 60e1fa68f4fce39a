"""Every loss family with the batch-scaled mappings against a dense float64 transcription at the
solved scale held constant (`batch_scaled_reference`): InfoNCE in every mode (cross, CLIP's
symmetric loss, all, the bank, masks, candidate_bias), the sigmoid loss, SupCon in both forms;
values, gradients and the scale; the sharded forms on 8 CPU devices against the single-device
loss; the Pallas kernels (interpreted) against the XLA engine for the global scales."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import batch_scaled_reference as ref
from tests.helpers.marks import widest, widest_cases
from tfcl_jax import losses, mappings

N, D, K = 12, 6, 5
BUILD = {"calibrated": mappings.calibrated_free, "perplexity": mappings.perplexity_free,
         "accuracy": mappings.accuracy_free}


def _batch(seed=0, noise=0.8):
  k1, k2, k3, k4, k5 = jax.random.split(jax.random.key(seed), 5)
  z1 = jax.random.normal(k1, (N, D))
  z2 = z1 + noise * jax.random.normal(k2, (N, D))
  where = jax.random.bernoulli(k3, 0.75, (N,)).at[:2].set(True)
  bank = jax.random.normal(k4, (K, D))
  bank_where = jnp.arange(K) != 1
  bias = 0.7 * jax.random.normal(k5, (N,))
  return z1, z2, where, bank, bank_where, bias


# A covering design: the per-anchor scale (on the sides) in every mode, the global one (a
# parameter of the tiles' mapping) in every mode, each extra (mask, bank, bias) at least twice.
INFO_NCE_CASES = [
    ("calibrated", "cross", ("bias",)),
    ("calibrated", "symmetric", ("where",)),
    ("accuracy", "all", ("where", "bank")),
    ("perplexity", "cross", ("where", "bank")),
    ("perplexity", "symmetric", ()),
    ("calibrated", "symmetric", ("bias",)),  # CLIP's logQ: a bias per direction
    ("perplexity", "symmetric", ("bias",)),
    ("perplexity", "all", ("where",)),
]


def _kwargs(mode, extras, batch):
  _, _, where, bank, bank_where, bias = batch
  kwargs = {"cross": {}, "symmetric": {"symmetric": True}, "all": {"negatives": "all"}}[mode]
  kwargs = dict(kwargs)
  if "where" in extras:
    kwargs["where"] = where
  if "bank" in extras:
    kwargs.update(extra_negatives=bank, extra_where=bank_where)
  if "bias" in extras:
    kwargs["candidate_bias"] = (bias, -bias[::-1]) if mode == "symmetric" else bias
  return kwargs


def _dense(z1, z2, mode, kwargs):
  return ref.dense(z1, z2, mode=mode, where=kwargs.get("where"),
                   bank=kwargs.get("extra_negatives"), bank_where=kwargs.get("extra_where"),
                   bias=kwargs.get("candidate_bias"))


def _x64(tree):
  """Float arrays as float64 NumPy arrays (the reference's inputs); anything else as it is."""
  def cast(x):
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating):
      return np.asarray(x, np.float64)
    return np.asarray(x) if isinstance(x, jax.Array) else x
  return jax.tree.map(cast, tree)


# The default run's two: the global scale in `all` with a mask and a bank, the per-anchor
# scale in CLIP's loss with a bias per direction.
@pytest.mark.parametrize("target, mode, extras", widest_cases(
    *INFO_NCE_CASES, quick=[INFO_NCE_CASES[2], INFO_NCE_CASES[6]]))
def test_info_nce_equals_the_dense_loss_at_the_solved_scale(target, mode, extras):
  batch = _batch()
  z1, z2 = batch[:2]
  kwargs = _kwargs(mode, extras, batch)
  m = BUILD[target]()

  @jax.jit
  def run(z1, z2):
    value, grads = jax.value_and_grad(
        lambda a, b: losses.info_nce(a, b, mapping=m, **kwargs), argnums=(0, 1))(z1, z2)
    return losses.batch_scale(z1, z2, mapping=m, **kwargs), value, grads

  scale, value, grads = run(z1, z2)
  with jax.enable_x64(True):
    z1_64, z2_64, kwargs_64 = _x64((z1, z2, kwargs))
    d = _dense(z1_64, z2_64, mode, kwargs_64)
    np.testing.assert_allclose(scale, ref.solve(target, d), rtol=1e-3)
    masked = "where" in kwargs
    dense = jax.value_and_grad(lambda a, b: ref.info_nce(_dense(a, b, mode, kwargs_64),
                                                         np.asarray(scale, np.float64),
                                                         masked=masked), argnums=(0, 1))
    want_value, want_grads = dense(z1_64, z2_64)
  np.testing.assert_allclose(value, want_value, rtol=1e-5)
  chex.assert_trees_all_close(grads, want_grads, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("target, negatives", widest_cases(
    ("calibrated", "all"), ("perplexity", "cross"), ("perplexity", "all"),
    quick=[("perplexity", "all")]))
def test_sigmoid_loss_equals_the_dense_loss_at_the_solved_scale(target, negatives):
  """The scale of the softmax over each anchor's candidates; the bias stays outside it."""
  z1, z2 = _batch(1)[:2]
  m = BUILD[target]()
  bias = -1.5

  @jax.jit
  def run(z1, z2):
    value, grads = jax.value_and_grad(lambda a, b: losses.sigmoid_loss(
        a, b, mapping=m, negatives=negatives, bias=bias), argnums=(0, 1))(z1, z2)
    return losses.batch_scale(z1, z2, mapping=m, negatives=negatives), value, grads

  scale, value, grads = run(z1, z2)
  mode = "all" if negatives == "all" else "cross"
  with jax.enable_x64(True):
    z1_64, z2_64 = _x64((z1, z2))
    np.testing.assert_allclose(scale, ref.solve(target, ref.dense(z1_64, z2_64, mode=mode)),
                               rtol=1e-3)
    dense = jax.value_and_grad(lambda a, b: ref.sigmoid(ref.dense(a, b, mode=mode),
                                                        np.asarray(scale, np.float64), bias),
                               argnums=(0, 1))
    want_value, want_grads = dense(z1_64, z2_64)
  np.testing.assert_allclose(value, want_value, rtol=1e-5)
  chex.assert_trees_all_close(grads, want_grads, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("target", widest(*sorted(BUILD), quick=("accuracy",)))
def test_supervised_both_forms_equal_the_dense_loss_at_the_solved_scale(target):
  z = jax.random.normal(jax.random.key(2), (N, D))
  labels = jnp.arange(N) % 4
  m = BUILD[target]()

  @jax.jit
  def run(z):
    out = {form: jax.value_and_grad(lambda a, form=form: losses.supervised_info_nce(
        a, labels, mapping=m, form=form, block_size=5))(z) for form in ("ntxent", "supcon")}
    return losses.supervised_batch_scale(z, labels, mapping=m, block_size=5), out

  scale, out = run(z)
  with jax.enable_x64(True):
    z_64 = np.asarray(z, np.float64)
    np.testing.assert_allclose(scale, ref.supervised_solve(target, z_64, labels), rtol=1e-3)
    for form, (value, grad) in out.items():
      want_value, want_grad = jax.value_and_grad(lambda a, form=form: ref.supervised(
          a, labels, np.asarray(scale, np.float64), form=form))(z_64)
      np.testing.assert_allclose(value, want_value, rtol=1e-5, err_msg=form)
      np.testing.assert_allclose(grad, want_grad, atol=1e-5, rtol=1e-4, err_msg=form)


def test_bound_scale_skips_the_solve_and_gives_the_same_loss():
  batch = _batch(3)
  z1, z2 = batch[:2]

  @jax.jit
  def run(z1, z2):
    out = []
    for target, mode, extras in INFO_NCE_CASES[::3]:
      m, kwargs = BUILD[target](), _kwargs(mode, extras, batch)
      s = losses.batch_scale(z1, z2, mapping=m, **kwargs)
      out.append((losses.info_nce(z1, z2, mapping=m, **kwargs),
                  losses.info_nce(z1, z2, mapping=m.bind(scale=s), **kwargs),
                  losses.batch_scale(z1, z2, mapping=m.bind(scale=s), **kwargs), s))
    return out

  for unbound, bound, again, s in run(z1, z2):
    np.testing.assert_allclose(unbound, bound, rtol=1e-6)
    np.testing.assert_array_equal(again, s)


def _mesh():
  return jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))


# (target, strategy, InfoNCE kwargs): the two strategies, per-anchor and global scales, the
# two-tower columns (combined across devices by the all-gather path), masks and the bank; the
# per-anchor scale through the all-gather path in the next test.
SHARDED_CASES = [
    ("calibrated", "all_gather", {"symmetric": True, "where": True}),
    ("perplexity", "ring", {"symmetric": True, "where": True, "bank": True}),
    ("accuracy", "ring", {"negatives": "all", "where": True}),
]


@pytest.mark.heavy
@pytest.mark.parametrize("target, strategy, options", SHARDED_CASES)
def test_sharded_info_nce_equals_the_single_device_loss(target, strategy, options):
  z1, z2, where, bank, bank_where, _ = _batch(4, noise=0.5)
  z1, z2, where = (jnp.concatenate([x, x[:4]]) for x in (z1, z2, where))  # 16 = 8 devices x 2
  kwargs = {key: value for key, value in options.items() if key in ("symmetric", "negatives")}
  if options.get("where"):
    kwargs["where"] = where
  if options.get("bank"):
    kwargs.update(extra_negatives=bank, extra_where=bank_where)
  m = BUILD[target]()
  mesh = _mesh()

  @jax.jit
  def run(z1, z2):
    single = jax.value_and_grad(lambda a, b: losses.info_nce(a, b, mapping=m, **kwargs),
                                argnums=(0, 1))(z1, z2)
    sharded = jax.value_and_grad(lambda a, b: losses.info_nce_on_mesh(
        a, b, mesh=mesh, mapping=m, strategy=strategy, block_size=3, **kwargs),
        argnums=(0, 1))(z1, z2)
    return single, sharded

  single, sharded = run(z1, z2)
  chex.assert_trees_all_close(sharded, single, atol=1e-5, rtol=1e-5)


@pytest.mark.heavy
def test_sharded_batch_scale_and_sigmoid_loss_equal_the_single_device_ones():
  z1, z2, where = _batch(5, noise=0.5)[:3]
  z1, z2, where = (jnp.concatenate([x, x[:4]]) for x in (z1, z2, where))
  mesh = _mesh()
  spec = jax.sharding.PartitionSpec("data")

  cases = (("perplexity", "all"), ("accuracy", "cross"), ("calibrated", "all"))

  def scales(a, b, mask, **sharded):
    return [losses.batch_scale(a, b, mapping=BUILD[target](), where=mask, negatives=negatives,
                               **sharded) for target, negatives in cases]

  replicated = jax.sharding.PartitionSpec()
  sharded = jax.jit(jax.shard_map(
      functools.partial(scales, axis_name="data", strategy="all_gather"), mesh=mesh,
      in_specs=(spec, spec, spec), out_specs=[spec, replicated, replicated]))(z1, z2, where)
  single = jax.jit(scales)(z1, z2, where)
  # Per anchor: each device's rows, then its second view's; the single-device loss orders all
  # first views, then all second views.
  n = z1.shape[0] // 8
  per_device = sharded[0].reshape(8, 2, n).transpose(1, 0, 2).reshape(-1)
  chex.assert_trees_all_close(per_device, single[0], rtol=1e-5)
  # The global scales are roots of moments summed over the whole batch, in another order on the
  # mesh: the root moves about ten times the moments' relative rounding (1.2e-5 for the accuracy
  # target under the tests' compile flags, against 1.3e-6 for the per-anchor scales).
  chex.assert_trees_all_close(sharded[1:], single[1:], rtol=5e-5)

  m = mappings.perplexity_free()

  @jax.jit
  def sigmoid(z1, z2):
    loss = functools.partial(losses.sigmoid_loss, mapping=m, bias=-1.0, negatives="all")
    on_mesh = functools.partial(losses.sigmoid_loss_on_mesh, mesh=mesh, mapping=m, bias=-1.0,
                                negatives="all", block_size=3)
    return [jax.value_and_grad(f, argnums=(0, 1))(z1, z2) for f in (loss, on_mesh)]

  single, sharded = sigmoid(z1, z2)
  chex.assert_trees_all_close(sharded, single, atol=1e-5, rtol=1e-5)


PALLAS_N, PALLAS_D = 20, 8


@pytest.mark.parametrize("target, kwargs", [
    ("calibrated", {"symmetric": True}),
    pytest.param("accuracy", {"negatives": "all", "masked": True}, marks=pytest.mark.heavy)])
def test_pallas_equals_xla_for_the_global_scales(target, kwargs):
  z1 = jax.random.normal(jax.random.key(6), (PALLAS_N, PALLAS_D))
  z2 = z1 + 0.8 * jax.random.normal(jax.random.key(7), (PALLAS_N, PALLAS_D))
  kwargs = dict(kwargs)
  if kwargs.pop("masked", False):
    kwargs["where"] = (jnp.arange(PALLAS_N) % 5) != 2
  m = BUILD[target]()

  def loss(a, b, implementation):
    return losses.info_nce(a, b, mapping=m, block_size=16, implementation=implementation,
                           **kwargs)

  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)
  chex.assert_trees_all_close(grad(z1, z2, "pallas"), grad(z1, z2, "xla"), atol=1e-5,
                              rtol=1e-5)


@pytest.mark.parametrize("spec, mode, extras", widest_cases(
    ("calibrated_free", "all", ("where",)),
    ("clip:perplexity_free+logq", "symmetric", ("bias",)),
    ("accuracy_free+logq", "cross", ("bias", "where")),
    ("sigmoid/calibrated_free/b=-2", "cross", ()),
    quick=[("accuracy_free+logq", "cross", ("bias", "where")),
           ("sigmoid/calibrated_free/b=-2", "cross", ())]))
def test_evaluate_reports_the_solved_scale_at_the_calls_loss(spec, mode, extras):
  """`Loss.evaluate`: the call's loss, and the scale the dense float64 solve gives."""
  batch = _batch(1)
  z1, z2 = batch[:2]
  kwargs = _kwargs(mode, extras, batch)
  loss = losses.from_spec(spec)
  assert mappings.batch_scaled(loss.mapping)
  call = {k: v for k, v in kwargs.items() if k in ("negatives", "where")}
  bias = kwargs.get("candidate_bias")
  if loss.logq:  # the loss subtracts log q: the bias is -log q
    call["log_q"] = tuple(-b for b in bias) if isinstance(bias, tuple) else -bias
  value, scale = jax.jit(lambda a, b: loss.evaluate(a, b, params=loss.params, **call))(z1, z2)
  # float32, jitted against eager: the summation order differs (2e-6 seen on another CPU)
  np.testing.assert_allclose(value, loss(z1, z2, params=loss.params, **call), rtol=1e-5)
  target = loss.mapping.spec.removesuffix("_free")
  if spec.startswith("sigmoid"):  # the softmax over each anchor's candidates, without a bias
    kwargs = {k: v for k, v in kwargs.items() if k != "candidate_bias"}
  with jax.enable_x64(True):
    z1_64, z2_64, kwargs_64 = _x64((z1, z2, kwargs))
    np.testing.assert_allclose(scale, ref.solve(target, _dense(z1_64, z2_64, mode, kwargs_64)),
                               rtol=1e-3)


def test_evaluate_and_the_supervised_form_report_none_for_other_mappings():
  z1, z2 = _batch()[:2]
  labels = jnp.arange(2 * N) % 3
  for spec in ("free", "tau=0.1", "learnable_free=100"):
    loss = losses.from_spec(spec)
    value, scale = loss.evaluate(z1, z2, params=loss.params)
    assert scale is None and not mappings.batch_scaled(loss.mapping)
    np.testing.assert_allclose(value, loss(z1, z2, params=loss.params))
    value, scale = loss.supervised(jnp.concatenate([z1, z2]), labels, form="supcon",
                                   params=loss.params)
    assert scale is None
  with pytest.raises(ValueError, match="has none to solve"):
    losses.batch_scale(z1, z2, mapping=losses.from_spec("free").mapping)


@pytest.mark.parametrize("form", widest("supcon", "ntxent", quick=("ntxent",)))
def test_the_supervised_form_reports_the_dense_solve(form):
  z1, z2 = _batch(2)[:2]
  z = jnp.concatenate([z1, z2])
  labels = jnp.arange(2 * N) % 4
  loss = losses.from_spec("calibrated_free")
  value, scale = loss.supervised(z, labels, form=form, params={})
  np.testing.assert_allclose(value, losses.supervised_info_nce(z, labels, form=form,
                                                               mapping=loss.mapping),
                             rtol=1e-5)  # float32: the summation order may differ
  with jax.enable_x64(True):  # the batch loss is flat near its minimum here (s ~ 0.03): its
    z_64 = _x64(z)  # value at the solved scale is the minimum's, the scale itself within 5 %
    want = ref.supervised_solve("calibrated", z_64, labels)
    np.testing.assert_allclose(scale, want, rtol=0.05)
    np.testing.assert_allclose(  # the minimum of L_out, whose scale both forms take
        ref.supervised(z_64, labels, np.asarray(scale, np.float64), form="supcon"),
        ref.supervised(z_64, labels, want, form="supcon"), rtol=1e-6)


def test_moment_sums_per_chunk_on_a_cpu_and_per_tile_elsewhere_equal_numpy():
  # `_row_sums` loops over `_ROWS`-row chunks on a CPU (cache) and takes the whole tile on an
  # accelerator (no loop of small launches); both forms against a NumPy transcription.
  from tfcl_jax.losses._engine import _moments
  from tfcl_jax.losses._engine._moments import GRID_EXPONENTS
  from tfcl_jax.training import lowering

  rng = np.random.default_rng(0)
  m, n = 2 * _moments._ROWS + 5, 19  # chunks that do not divide the rows
  d = -rng.exponential(2.0, (m, n))
  below = rng.random((m, n)) > 0.2
  bias = -rng.exponential(1.0, n)
  scales = 2.0 ** np.asarray(GRID_EXPONENTS, np.float64)
  w = np.where(below[:, None], np.exp(scales[None, :, None] * d[:, None] + bias), 0.0)
  expected = np.stack([np.sum(w * d[:, None] ** p, -1) for p in range(5)], -1)
  with jax.enable_x64(True):
    args = (jnp.asarray(d), jnp.asarray(below), jnp.asarray(bias))
    np.testing.assert_allclose(_moments._row_sums(*args), expected, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(_moments._chunk_sums(*args), expected, rtol=1e-12, atol=1e-300)
  shapes = [jax.ShapeDtypeStruct((256, 256), jnp.float32), jax.ShapeDtypeStruct((256, 256), bool),
            jax.ShapeDtypeStruct((256,), jnp.float32)]
  loops = {platform: lowering.lower(_moments._row_sums, *shapes, platform=platform).as_text()
           .count("stablehlo.while") for platform in ("cpu", "cuda", "tpu")}
  assert loops == {"cpu": 1, "cuda": 0, "tpu": 0}
