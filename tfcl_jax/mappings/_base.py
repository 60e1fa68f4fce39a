"""The `Mapping` type: a similarity-to-logit mapping as a pytree, with its closed forms."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from tfcl_jax import _checks
from tfcl_jax.mappings._function import (
  ExpForm,
  LogSigmoidForm,
  MappingFunction,
  ParameterCheck,
  Params,
  _Plain,
)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class Mapping:
  """A similarity-to-logit mapping, applied elementwise to cosine similarities.

  Call it on cosines: `mapping(cos) -> logits`. Learnable mappings carry their
  trainable scalars in `params` (a dict, empty for the others); scheduled mappings
  read the training `step`. Both can be overridden per call,
  `mapping(cos, params=..., step=...)`, or fixed with `mapping.bind(params=..., step=...)`,
  which is how a train step hands the current ones to a loss inside `jit`.

  A `Mapping` is a pytree: its leaves are `params` (and a bound `step`), the rest is static.
  It passes through `jax.jit`, `vmap` and `grad` as an argument; the gradient with respect to
  a `Mapping` is a `Mapping` whose `params` hold the gradients, and `optax` updates it.

  The pure mapping `fn` may declare cheaper closed forms that the losses ask for (`exp_form`):
  Eq. 11's `exp(2 artanh c) = (1 + c) / (1 - c)` is one division per logit.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import mappings
    >>> m = mappings.learnable_temperature(tau=0.5)
    >>> grad = jax.grad(lambda m: m(jnp.array(0.25)))(m)   # d(exp(t) c)/dt = exp(t) c
    >>> round(float(grad.params["t"]), 4), type(grad).__name__
    (0.5, 'Mapping')

  Attributes:
    spec: its canonical mapping spec (`from_spec(mapping.spec)` rebuilds it; docs/specs.md).
    fn: the pure mapping, a `MappingFunction` (`fn(cos, params, step) -> logits` and its declared
      forms); a plain function `fn(cos, params, step)` is wrapped in one that declares none.
    params: trainable scalars, `{}` for non-learnable mappings.
    scheduled: whether the mapping depends on `step`.
    step: the step fixed by `bind` (None: 0).
    bound: whether `bind(params=...)` fixed its `params` (see `params_given`).
    shapes: `((name, shape), ...)` of its params as built: what `bind` and the losses hold the
      params to (a mapping holds one `t` per loss; vmap the loss to train several).
  """

  spec: str
  fn: MappingFunction = dataclasses.field(repr=False)
  params: dict[str, Any] = dataclasses.field(default_factory=dict)
  scheduled: bool = False
  step: Any = dataclasses.field(default=None, repr=False)
  bound: bool = dataclasses.field(default=False, repr=False)
  shapes: tuple[tuple[str, tuple[int, ...]], ...] | None = dataclasses.field(default=None,
                                                                             repr=False)
  # Set by `tree_unflatten`, outside the static data (a mapping and the one JAX rebuilds from its
  # leaves keep one tree structure): its params are leaves a transformation was given.
  _from_leaves: ClassVar[bool] = False

  def __post_init__(self):
    if not isinstance(self.fn, MappingFunction):
      if not callable(self.fn):
        raise TypeError(f"fn must be a MappingFunction or a callable fn(cos, params, step), got "
                        f"{type(self.fn).__name__}.")
      object.__setattr__(self, "fn", _Plain(self.fn))
    if self.shapes is None:
      object.__setattr__(self, "shapes", tuple(
          (name, tuple(jnp.shape(value))) for name, value in sorted(self.params.items())))

  def tree_flatten(self) -> tuple[tuple[dict[str, Any], Any], tuple[Any, ...]]:
    return (self.params, self.step), (self.spec, self.fn, self.scheduled, self.bound,
                                      self.shapes)

  @classmethod
  def tree_unflatten(cls, aux, children):
    spec, fn, scheduled, bound, shapes = aux
    params, step = children
    mapping = cls(spec, fn, params, scheduled, step, bound, shapes)
    object.__setattr__(mapping, "_from_leaves", True)
    return mapping

  @property
  def params_given(self) -> bool:
    """True where its params are the caller's and not the values it was built with, that is
    bound (`bind(params=...)`) or rebuilt by JAX from leaves it was given (the mapping is an
    argument of `jax.grad`, `jit`, `vmap`, or the result of a tree map or an optax update).

    The losses take a learnable mapping only then: a learnable mapping built inside the loss
    function (`mappings.from_spec(...)` in a Flax module's call, under `jit` or not) or closed
    over holds its initial params as constants, whose gradient is 0 (they would never train).

    Examples:
      >>> import jax
      >>> from tfcl_jax import mappings
      >>> m = mappings.learnable_free()
      >>> m.params_given, m.bind(params=m.params).params_given
      (False, True)
      >>> jax.tree.map(lambda leaf: leaf, m).params_given   # rebuilt from leaves
      True
    """
    return self.bound or self._from_leaves

  def check_shapes(self, params: Params) -> None:
    """Checks that `params` have the keys and shapes of the mapping's params as built (`shapes`).

    Raises:
      ValueError: another key, or a value of another shape (naming it and the mapping).
    """
    shapes = dict(self.shapes or ())
    if set(params) != set(shapes):
      raise ValueError(f"params must have the keys {sorted(shapes)} of mapping {self.spec!r}, "
                       f"got {sorted(params)}.")
    for name, value in params.items():
      got = tuple(jnp.shape(value))
      if got != shapes[name]:
        raise ValueError(
            f"params[{name!r}] of mapping {self.spec!r} must have shape {shapes[name]} (the shape "
            f"of its initial value, mapping.params[{name!r}]), got shape {got}; a mapping "
            f"holds one {name!r} for every pair (vmap the loss to train several, or bind one "
            f"value: m.bind(params=...) rather than a jax.tree.map over the mapping).")

  def __call__(self, cos: jax.typing.ArrayLike, *, params: Params | None = None,
               step: jax.typing.ArrayLike | None = None) -> jax.Array:
    cos = jnp.asarray(cos)
    if not jnp.issubdtype(cos.dtype, jnp.floating):
      raise TypeError(f"cos must have a floating dtype, got {cos.dtype}.")
    cos = cos.astype(_checks.compute_dtype(cos.dtype))
    params = self.params if params is None else params
    step = self.bound_step() if step is None else jnp.asarray(
        _checks.training_step(step, name=f"step of mapping {self.spec!r}"))
    return self.fn(cos, params, step)

  def bound_step(self) -> jax.Array:
    """The step fixed by `bind`, else 0."""
    return jnp.zeros((), jnp.int32) if self.step is None else jnp.asarray(self.step)

  def bind(self, *, params: Params | None = None,
           step: jax.typing.ArrayLike | None = None,
           scale: jax.typing.ArrayLike | None = None) -> Mapping:
    """This mapping with its trainable `params` and training `step` fixed, as a `Mapping`.

    What a train step hands to a loss: unlike `lambda cos: m(cos, params=p, step=s)`, the
    result is still this `Mapping` (same `spec`), so the losses keep its fast forms and take
    gradients with respect to `params` and `step`-dependent values.

    Examples:
      >>> import jax.numpy as jnp
      >>> from tfcl_jax import mappings
      >>> m = mappings.learnable_temperature(tau=1.0).bind(params={"t": jnp.log(2.0)})
      >>> round(m(0.25).item(), 4), m.spec
      (0.5, 'learnable=1')

    `m.bind(params=m.params)` holds a learnable mapping at its current values on purpose (to
    evaluate it, or to keep `t` fixed): the losses refuse a learnable mapping that was never
    bound, whose `t` would silently never train.

    Args:
      params: replaces `self.params` (same keys, each of the same shape as the value it
        replaces: a scalar `t` stays a scalar); None keeps them.
      step: the training step a scheduled mapping reads, an integer scalar >= 0; None keeps
        the bound one (else 0). A mapping without a schedule (`scheduled` False) ignores it,
        on purpose: a train step binds every loss's mapping to its step alike.
      scale: for the batch-scaled mappings (`calibrated_free`, `accuracy_free`: a float
        scalar; `perplexity_free`: `[M]` floats, one per anchor of the loss in its order), the
        scale the loss would otherwise solve from its batch (`losses.batch_scale` returns it):
        the loss then uses it as it is, without a gradient. None keeps the bound one (unbound:
        the loss solves it).

    Raises:
      ValueError: `params` has other keys, or a value of another shape (naming it and the
        mapping); `step` is not a scalar, or (when concrete) negative; `scale` given to a
        mapping without a batch scale, or of the wrong shape, or (when concrete) not finite
        and > 0.
      TypeError: `step` is not an integer (a float step, traced or not).
    """
    if params is not None:
      self.check_shapes(params)
    if step is not None:
      step = _checks.training_step(step, name=f"step of mapping {self.spec!r}")
    fn = self.fn
    if scale is not None:
      scaled = self.fn.with_batch_scale(jnp.asarray(scale))
      if scaled is None:
        raise ValueError(
            f"bind(scale=...) fixes the scale of a batch-scaled mapping (calibrated_free, "
            f"perplexity_free, accuracy_free), which a loss otherwise solves from its batch; "
            f"mapping {self.spec!r} has none. Pass its own parameters with bind(params=...), or "
            f"use mappings.temperature(1 / scale) or learnable_free for a scale of your own.")
      fn = scaled
    mapping = dataclasses.replace(self, fn=fn,
                                  params=self.params if params is None else dict(params),
                                  step=self.step if step is None else step,
                                  bound=self.bound or params is not None)
    if self._from_leaves:  # still the caller's params
      object.__setattr__(mapping, "_from_leaves", True)
    return mapping

  @property
  def learnable(self) -> bool:
    return bool(self.params)

  def exp_form(self, dtype: jax.typing.DTypeLike) -> ExpForm | None:
    """The mapping's closed form of `exp(f(c) - shift)` for cosines of `dtype`, if it has one.

    Losses that sum `exp(logits)` (InfoNCE's logsumexp) use it instead of `exp(fn(c))`:
    a constant `shift` replaces the running maximum, and the weight and its derivative come
    from the mapping's own formula. None when the mapping declares no such form, has learnable
    parameters (their gradient goes through `fn`), or its logits span more than the dtype can
    hold under one shift (e.g. `tau < 1/30` in float32).
    """
    return None if self.params else self.fn.exp_form(jnp.dtype(dtype))

  def log_sigmoid_form(self, dtype: jax.typing.DTypeLike) -> LogSigmoidForm | None:
    """The mapping's closed form of `-log sigmoid(s f(c))`, `s = +-1`, if it has one.

    The sigmoid (SigLIP) loss uses it instead of `softplus(-s f(c))`. Eq. 11 has one:
    `sigmoid(2 artanh c) = (1 + c) / 2`. None as for `exp_form`.
    """
    return None if self.params else self.fn.log_sigmoid_form(jnp.dtype(dtype))

  def kernel_form(self) -> Mapping:
    """This mapping as the fused kernels trace it (`MappingFunction.kernel_form`): the same
    spec, params and step; the free mappings take Eq. 11 as `log((1 + c) / (1 - c))` there.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from tfcl_jax import mappings
      >>> m = mappings.learnable_free().bind(params={"t": jnp.log(3.0)})
      >>> cos = jnp.array([-0.5, 0.0, 0.5])
      >>> bool(jnp.allclose(m.kernel_form()(cos), m(cos), atol=1e-6))
      True
    """
    return dataclasses.replace(self, fn=self.fn.kernel_form())

  def parameter_checks(self) -> tuple[ParameterCheck, ...]:
    """The conditions the mapping's parameters must meet, at its `params` and bound `step`.

    A mapping built from traced values (`temperature(tau)` inside `jit`, a learnable `t`, a
    scheduled `tau` at a traced step) cannot check them when it is built: `cos / 0` gives
    infinite logits and a non-finite loss, and `tau < 0` finite logits of the wrong sign,
    hence a finite but meaningless loss. The mapping's `fn` declares its checks
    (`MappingFunction.parameter_checks`, as it declares `exp_form`); the losses run them under
    `check_finite` (under `jit`, `check_finite="checkify"`: a `jax.experimental.checkify`
    check). Mappings whose parameters are concrete and checked when built (free, fixed `tau`,
    DySTreSS) and plain callables declare none: `()`.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from tfcl_jax import mappings
      >>> def valid(tau):
      ...   return [check.valid for check in mappings.temperature(tau).parameter_checks()]
      >>> [bool(ok) for ok in jax.jit(valid)(0.0)], [bool(ok) for ok in jax.jit(valid)(0.5)]
      ([False], [True])
      >>> m = mappings.learnable_temperature(tau=0.5).bind(params={"t": jnp.nan})
      >>> [(check.name, check.requirement, bool(check.valid)) for check in m.parameter_checks()]
      [('t', 'finite', False)]
      >>> mappings.temperature_free().parameter_checks()
      ()

    Returns:
      One `ParameterCheck` per condition; `valid` is a traced bool scalar where the
      parameter is traced.
    """
    return tuple(self.fn.parameter_checks(self.params, self.bound_step()))


MappingLike = Mapping | str | Callable[[jax.Array], jax.Array]
"""What the losses and the analysis accept as `mapping`: a `Mapping`, a mapping spec
(`from_spec`), or a callable `cos -> logits` (`as_mapping` turns each into a `Mapping`)."""


def format_number(x) -> str:
  """A number as it appears in a spec (`0.25`, `1`, `1e-05`)."""
  return f"{float(x):g}"
