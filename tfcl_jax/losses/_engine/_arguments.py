"""The loss functions' argument checks: embeddings, masks, biases, modes, the block size, the
mapping a loss is given, and `check_finite`.

Every public loss (single-device, sharded, sigmoid, supervised, dot) checks its arguments here
before its layout (`_layout`), so that a bad argument is refused with its name and what was
expected, not deep inside the tiles.
"""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify
from jax.interpreters import ad

from tfcl_jax import _checks, mappings

NEGATIVES = ("cross", "all")
REDUCTIONS = ("mean", "sum", "none")


def check_bias_row(bias, n: int, *, rows: str) -> jax.Array:
  """`bias` as `[n]` floats, one per row of `rows` (a candidate's logit bias).

  Raises:
    TypeError: not floats; ValueError: another shape (both name `candidate_bias`).
  """
  bias = jnp.asarray(bias)
  if not jnp.issubdtype(bias.dtype, jnp.floating):
    raise TypeError(f"candidate_bias must be a float array, got dtype {bias.dtype}.")
  if bias.shape != (n,):
    raise ValueError(f"candidate_bias must have shape ({n},) (one per row of {rows}), got "
                     f"{bias.shape}.")
  return bias


def check_where(where, n: int, *, name: str = "where") -> jax.Array | None:
  if where is None:
    return None
  where = jnp.asarray(where)
  if where.dtype != jnp.bool_:
    raise TypeError(f"{name} must be a boolean mask, got dtype {where.dtype}.")
  if where.shape != (n,):
    raise ValueError(f"{name} must have shape ({n},), got {where.shape}.")
  return where


def check_block_size(block_size: int | None) -> int | None:
  """Checks `block_size`: None (automatic) or an int > 0.

  Examples:
    >>> from tfcl_jax.losses import check_block_size
    >>> check_block_size(512), check_block_size(None)
    (512, None)
  """
  if block_size is None:
    return None
  return _checks.positive_int(block_size, name="block_size (or None: automatic)")


def check_embeddings(z, *, name: str, rows: str = "N") -> jax.Array:
  """Checks float embeddings `[rows, D]` with `D >= 1`: a cosine needs at least one feature.

  Every loss's inputs go through here (and `check_pair`), so an empty feature axis fails
  with its name instead of deep inside the tiles.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.losses._engine import _arguments
    >>> _arguments.check_embeddings(jnp.zeros((8, 0)), name="z1")
    Traceback (most recent call last):
    ...
    ValueError: z1 must have D >= 1 features (shape [N, D]), got shape (8, 0).

  Raises:
    TypeError: `z` is not floating.
    ValueError: `z` is not rank 2, or has no features.
  """
  z = _checks.float_matrix(z, name=name)
  if z.shape[1] < 1:
    raise ValueError(f"{name} must have D >= 1 features (shape [{rows}, D]), got shape "
                     f"{z.shape}.")
  return z


def check_pair(z1, z2, *, local: bool = False, names: tuple[str, str] = ("z1", "z2")
               ) -> tuple[jax.Array, jax.Array]:
  """Checks two views `[N, D]`, `D >= 1`, of the same shape (`local`: a device's share, N >= 1);
  errors call them `names`."""
  first, second = names
  z1 = check_embeddings(z1, name=first)
  z2 = check_embeddings(z2, name=second)
  if z1.shape != z2.shape:
    raise ValueError(f"{first} and {second} must have the same shape [N, D], got {z1.shape} and "
                     f"{z2.shape}.")
  if not local and z1.shape[0] < 2:
    raise ValueError(f"{first} and {second} need N >= 2 pairs to have a negative, got "
                     f"N = {z1.shape[0]}.")
  return z1, z2


#: The values of the losses' `check_finite`: off, checks of concrete values, or checks that
#: `jax.experimental.checkify` reports from inside a trace.
CHECK_FINITE = (False, True, "checkify")


def check_finite_mode(check_finite) -> bool | str:
  """`check_finite` checked: one of `CHECK_FINITE`.

  Raises:
    ValueError: any other value.
  """
  if not any(check_finite is value or (isinstance(value, str) and check_finite == value)
             for value in CHECK_FINITE):
    raise ValueError(f"check_finite must be one of {CHECK_FINITE}, got {check_finite!r}.")
  return check_finite


def _traced(what: str) -> ValueError:
  return ValueError(
      f"check_finite=True checks concrete values, but {what} is traced (the loss is inside "
      "jax.jit, grad, vmap or another transformation). A check inside a trace is reported only "
      "through jax.experimental.checkify: pass check_finite='checkify' and wrap the traced "
      "function, error, value = checkify.checkify(jax.jit(f))(...), then error.throw() raises "
      "the first failed check.")


def check_finite(x: jax.Array, *, name: str, mode: bool | str,
                 where: jax.Array | None = None) -> None:
  """`check_finite` of the losses: every value of `x` is finite (no NaN, no inf).

  Concrete `x` (called outside any transformation) raises at once. A traced `x` adds a
  `jax.experimental.checkify` check under `mode="checkify"`, reported by the function that
  `checkify.checkify` wraps; under `mode=True` it is refused, since JAX can report a check
  inside a trace only through checkify. `where` (`[rows]` bool) leaves out the rows it masks:
  a bank's rows masked by `extra_where` are no candidates, and the loss zeroes them.

  Raises:
    ValueError: concrete `x` holds a NaN or an inf (names `name` and the first bad row, or the
      value of a scalar); a traced `x` under `mode=True` (says how to check it).
  """
  if _checks.is_concrete(x) and (where is None or _checks.is_concrete(where)):
    values = np.asarray(x)
    bad = ~np.isfinite(values)
    if where is not None:
      bad &= np.asarray(where).reshape((-1,) + (1,) * (bad.ndim - 1))
    if bad.any():
      if values.ndim == 0:
        raise ValueError(f"{name} must be finite (check_finite), got {values.item()!r}.")
      row = int(np.argwhere(bad)[0][0])
      raise ValueError(f"{name} must be finite (check_finite), got {int(bad.sum())} "
                       f"NaN/inf value(s), the first in row {row}.")
    return
  if mode != "checkify":
    raise _traced(name)
  bad = ~jnp.isfinite(x)
  if where is not None:
    bad = bad & jnp.reshape(where, (-1,) + (1,) * (bad.ndim - 1))
  if bad.ndim == 0:
    checkify.check(~bad, f"{name} must be finite (check_finite), got {{}}.", x)
    return
  rows = jnp.any(bad.reshape(bad.shape[0], -1), axis=1)
  checkify.check(~jnp.any(rows), f"{name} must be finite (check_finite), got "
                 "NaN/inf value(s), the first in row {}.", jnp.argmax(rows))


def check_parameters(mapping: mappings.Mapping, *, mode: bool | str) -> None:
  """`check_finite` of the losses: the mapping's parameters meet its declared conditions.

  `Mapping.parameter_checks`: a traced `tau` finite and > 0, a learnable `t` finite, ...
  A concrete condition raises at once; a traced one adds a `jax.experimental.checkify` check
  under `mode="checkify"` and is refused under `mode=True`, as `check_finite` does. Without it
  a traced `tau = 0` gives a non-finite loss and `tau < 0` a finite but meaningless one.

  Raises:
    ValueError: a concrete parameter fails its condition (names the parameter and the mapping);
      a traced one under `mode=True`.
  """
  for check in mapping.parameter_checks():
    # `{}` is checkify's slot for the traced value; braces of the names are escaped.
    condition = f"{check.name} must be {check.requirement} (check_finite)"
    message = (condition.replace("{", "{{").replace("}", "}}") + ", got {} (mapping "
               + repr(mapping.spec).replace("{", "{{").replace("}", "}}") + ").")
    if _checks.is_concrete(check.valid):
      if not bool(check.valid):
        raise ValueError(message.format(np.asarray(check.value)))
    elif mode != "checkify":
      raise _traced(f"the parameter {check.name} of mapping {mapping.spec!r}")
    else:
      checkify.check(check.valid, message, check.value)


def loss_mapping(mapping: mappings.MappingLike | None, *, num_candidates: int,
                 inputs: tuple = ()) -> mappings.Mapping:
  """A loss's `mapping` as a `Mapping` (`mappings.as_mapping`), refusing what would silently
  not train or not follow its schedule.

  Refused, each with the fix in the message:

  - a spec string of a mapping with trainable params (`"learnable_free=100"`): a string cannot
    hold them, the loss would rebuild them at their initial values on every call;
  - a built mapping with trainable params that are not the caller's (`Mapping.params_given`):
    never bound (`mapping=m` rather than `m.bind(params=p["loss"])`) nor rebuilt by JAX from
    the leaves of an argument (`jax.grad(lambda m: loss(..., mapping=m))(m)` trains it). Built
    inside the loss function (`mappings.from_spec(...)` in a Flax module's call) or closed over,
    its params are constants there, under `jit` or not, and their gradient is 0: they would
    never train. `m.bind(params=m.params)` holds them fixed on purpose. A mapping rebuilt from
    leaves is refused too where the loss is differentiated with respect to its `inputs` and not
    to the mapping's params (`_checks.is_differentiated`: a mapping held as data of a model's
    state, `nnx.data`, while `jax.grad` takes the model's params only);
  - params of another shape than the mapping's as built (a `t` made a vector by a tree map);
  - a spec string of a scheduled mapping (`"anneal=log:0.5"`), or a built one without a bound
    step: it would run at step 0 on every call. `m.bind(step=step)` gives it the step.

  Raises:
    ValueError: one of the above, naming the mapping and the fix.
  """
  built = mappings.as_mapping(mapping, num_candidates=num_candidates)
  spec = built.spec
  if isinstance(mapping, str) and built.learnable:
    names = sorted(built.params)
    raise ValueError(
        f"mapping={mapping!r} has trainable params {names}, which a spec string cannot hold: "
        f"the loss would use their initial values on every call and never train them. Build "
        f"the mapping once, m = mappings.from_spec({spec!r}), keep m.params with the trainable "
        f"params (e.g. params['loss']) and pass mapping=m.bind(params=params['loss']) (the "
        f"README's quickstart), or name the loss by its loss spec, losses.from_spec({spec!r}), "
        f"whose params go into the train state; to evaluate at the initial values on purpose, "
        f"pass mapping=m.bind(params=m.params).")
  if built.learnable and not built.params_given:
    raise ValueError(
        f"mapping {spec!r} has trainable params {sorted(built.params)} but was passed unbound: "
        f"the loss would use the values it was built with, and the gradient on them would be 0 "
        f"(they would never train), inside jit or not. Keep m.params with the trainable params "
        f"(e.g. params['loss']; in a Flax module, an nnx.Param or self.param) and pass "
        f"mapping=m.bind(params=params['loss']) inside the loss function (the README's "
        f"quickstart, NNX and Linen examples); to hold them fixed on purpose (evaluation, a "
        f"frozen scale), pass mapping=m.bind(params=m.params).")
  if built.learnable and not built.bound and _params_left_out(built, inputs):
    raise ValueError(
        f"mapping {spec!r} has trainable params {sorted(built.params)} that the loss's "
        f"gradient leaves out: the embeddings are differentiated (jax.grad, jax.vjp) and the "
        f"mapping's params are not, so they would never train. Differentiate them with the "
        f"model: pass the mapping as an argument of jax.grad, or keep its params with the "
        f"model's (an nnx.Param, self.param, params['loss']) and pass "
        f"mapping=m.bind(params=params['loss']); to hold them fixed on purpose, pass "
        f"mapping=m.bind(params=m.params).")
  if built.learnable:
    built.check_shapes(built.params)
  if built.scheduled and built.step is None:
    where = (f"mapping={mapping!r} is a spec string, which cannot carry the training step"
             if isinstance(mapping, str) else f"mapping {spec!r} was passed without a step")
    raise ValueError(
        f"{where}: the schedule would stay at step 0 on every call and never anneal. Build it "
        f"once, m = mappings.from_spec({spec!r}), and pass mapping=m.bind(step=step) with the "
        f"train state's step (losses.from_spec({spec!r}) takes step= when called); to evaluate "
        f"at step 0 on purpose, pass mapping=m.bind(step=0).")
  return built


#: What works where forward mode does not: the losses' derivatives are custom VJPs.
FORWARD_MODE_HELP = (
    "What works: reverse mode (jax.grad, jax.vjp, jax.jacrev); Hessians: jax.hessian "
    "(forward-over-reverse) or jax.jacrev(jax.jacrev(f)); Hessian-vector products: "
    "jax.jvp(jax.grad(f), (x,), (v,)) or jax.grad(lambda x: jnp.vdot(jax.grad(f)(x), v))(x).")


def _top_trace():
  """The trace the loss is called under (`jax.extend.core.find_top_trace`, public from jax 0.9;
  jax 0.8 has it in its core only)."""
  find = getattr(jax.extend.core, "find_top_trace", None)
  if find is None:
    from jax._src import core  # noqa: PLC0415 - jax < 0.9: not exported yet

    find = core.find_top_trace
  return find(())


def refuse_forward_mode(*values, loss: str) -> None:
  """Refuses forward-mode differentiation of `loss` (`jax.jvp`, `jax.jacfwd`) by name.

  The losses' derivatives are custom VJPs that recompute the tiles (memory O(N * block)); JAX
  runs a custom VJP in reverse mode only, and forward mode through one fails deep inside with a
  generic error. Forward-over-reverse (`jax.hessian`, `jax.jvp` of `jax.grad`) works: the
  backward pass is plain JAX. `values` are the loss's arguments: where the loss is traced in
  forward mode at this level (the current trace is a `JVPTrace`, and some argument its tracer),
  the loss raises this error instead; under `jax.grad` inside `jax.jvp` the current trace is the
  gradient's, and the loss runs. A loss jitted before the forward-mode transformation
  (`jax.jvp(jax.jit(loss))`) is traced before the tangents exist: there JAX's own error, "can't
  apply forward-mode autodiff (jvp) to a custom_vjp function", is the one (docs/losses.md).

  Raises:
    TypeError: an argument is a forward-mode tracer (naming the loss and what works).
  """
  forward = isinstance(_top_trace(), ad.JVPTrace)
  if forward and any(isinstance(leaf, ad.JVPTracer) for leaf in jax.tree.leaves(values)):
    raise TypeError(
        f"{loss} cannot be differentiated in forward mode (jax.jvp, jax.jacfwd, jax.linearize, or "
        f"reverse-over-forward): its gradient is a custom VJP that recomputes the tiles, which "
        f"JAX runs in reverse mode only. {FORWARD_MODE_HELP}")


def refuse_second_order(*values, loss: str) -> None:
  """Refuses a derivative of a first-order-only gradient (the fused kernels') by name.

  Called in the forward rule of a custom VJP whose forward and backward computations have no
  derivative rules (Pallas kernels): a second derivative differentiates both, and JAX would fail
  inside the kernels' tracing. Where `values` (the rule's inputs) are differentiated at this
  level (`_checks.is_differentiated`: `jax.hessian`, `jax.jvp` or `jax.grad` of `jax.grad`),
  this raises instead.

  Raises:
    TypeError: naming the loss and what to use.
  """
  if any(map(_checks.is_differentiated, jax.tree.leaves(values))):
    raise TypeError(
        f"{loss} has first derivatives only (jax.grad, jax.vjp, jax.jacrev): its kernels have "
        f"no derivative rules of their own, so Hessians and Hessian-vector products (jax.hessian, "
        f"jax.jvp or jax.grad of jax.grad) fail there. Use implementation='xla' for them, the "
        f"same loss on the XLA engine.")


def _params_left_out(mapping: mappings.Mapping, inputs: tuple) -> bool:
  """Whether some of `inputs` are differentiated at this level and none of the mapping's params
  are."""
  return (any(map(_checks.is_differentiated, jax.tree.leaves(inputs)))
          and not any(map(_checks.is_differentiated, jax.tree.leaves(mapping.params))))


def check_mode(negatives: str, symmetric: bool, reduction: str) -> None:
  _checks.one_of(negatives, NEGATIVES, name="negatives")
  _checks.one_of(reduction, REDUCTIONS, name="reduction")
  if not isinstance(symmetric, (bool, np.bool_)):
    raise TypeError(f"symmetric must be a bool, got {symmetric!r}.")
  if symmetric and negatives == "all":
    raise ValueError(
        'symmetric=True is for negatives="cross" (CLIP\'s two-tower loss); negatives="all" '
        "already scores every row of both views as an anchor.")


def check_extra(extra_negatives, extra_where, dim: int):
  """Checks a bank of extra negatives `[K, D]` and its optional mask `[K]`: `(bank, mask)`,
  `(None, None)` for no bank, or an empty one (`K = 0` adds no candidate)."""
  if extra_negatives is None:
    if extra_where is not None:
      raise ValueError("extra_where was given without extra_negatives.")
    return None, None
  bank = _checks.float_matrix(extra_negatives, name="extra_negatives")
  if bank.shape[1] != dim:
    raise ValueError(f"extra_negatives must have shape [K, {dim}] (the embeddings' D), got "
                     f"{bank.shape}.")
  where = check_where(extra_where, bank.shape[0], name="extra_where")
  if bank.shape[0] == 0:  # no extra candidate: the loss without a bank, by definition
    return None, None
  return bank, where
