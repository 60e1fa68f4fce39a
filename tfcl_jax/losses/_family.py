r"""A loss family declared once: its function, written against the devices it runs on, from which
its one-device, sharded and mesh forms are derived with one signature; `Evaluation`, what a loss
reports of a batch.

A family's module writes its loss once, `f(z1, z2, *, devices, **options) -> Evaluation`, on the
engine's `Devices` (its checks, its layout, its tile reductions over every device's candidates
and the reduction of its row losses), and declares it with `@family(...)`: the name `f` is then
the one-device loss, and `f.family` derives `sharded_f` (inside `jax.shard_map`) and `f_on_mesh`
(global arrays on a mesh) from the same declaration, each with the declared keywords (less those
only one device takes) and a docstring of its own.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, cast

import jax
import jax.numpy as jnp

from tfcl_jax.losses._engine import _arguments
from tfcl_jax.losses._engine._devices import ONE_DEVICE, STRATEGIES, Sharded, on_mesh


class Evaluation(NamedTuple):
  """A loss's value on a batch and the scale its batch-scaled mapping solved there.

  Examples:
    >>> import jax
    >>> from tfcl_jax import losses
    >>> z = jax.random.normal(jax.random.key(0), (8, 4))
    >>> value, scale = losses.from_spec("calibrated_free").evaluate(z, z + 0.1)
    >>> value.shape, bool(0.01 <= scale <= 100)
    ((), True)
    >>> losses.from_spec("free").evaluate(z, z + 0.1).metrics
    {}

  Attributes:
    value: the loss, as the loss function returns it.
    scale: the scale a batch-scaled mapping (`mappings.calibrated_free`, `perplexity_free`,
      `accuracy_free`) solved on this batch, or was bound to: a scalar, or `[M]` per anchor in
      the loss's order (`perplexity_free`); None for every other mapping. It takes no gradient.
  """

  value: jax.Array
  scale: jax.Array | None = None

  @property
  def metrics(self) -> dict[str, jax.Array]:
    """What a train step logs of it, the mean solved scale under the key `"loss/scale"`, or an
    empty dict where no scale was solved."""
    return {} if self.scale is None else {"loss/scale": jnp.mean(self.scale)}


class Reported(Protocol):
  """A loss function that returns its value, with `evaluate`, the same call returning its
  `Evaluation` (`reported`)."""

  evaluate: Callable[..., Evaluation]

  def __call__(self, *args: Any, **kwargs: Any) -> jax.Array: ...


class Declared(Protocol):
  """A family's one-device loss function, with its `family` (`family`)."""

  family: Family

  def __call__(self, *args: Any, **kwargs: Any) -> jax.Array: ...


def _function(name: str, module: str, doc: str | None, signature: inspect.Signature,
              body: Callable[..., Evaluation], core: Callable[..., Evaluation]) -> Callable:
  """A public function `name` of `module` with `signature`: its arguments bound and defaulted,
  then `body(**arguments)`, whose `Evaluation`'s value it returns. It wraps `core`, the declared
  function (`inspect.getsource` shows it)."""

  def function(*args, **kwargs):
    try:
      bound = signature.bind(*args, **kwargs)
    except TypeError as error:
      raise TypeError(f"{name}() {error}") from None
    bound.apply_defaults()
    return body(**bound.arguments).value

  function.__name__ = function.__qualname__ = name
  function.__module__ = module
  function.__doc__ = doc
  function.__signature__ = signature  # pyright: ignore[reportFunctionMemberAccess]
  function.__wrapped__ = core  # pyright: ignore[reportFunctionMemberAccess]
  return function


def _returning(signature: inspect.Signature, annotation: str) -> inspect.Signature:
  return signature.replace(return_annotation=annotation)


def reported(core: Callable[..., Evaluation]) -> Reported:
  """`core`, which returns an `Evaluation`, as the public function of its name that returns the
  loss's value; its `evaluate` attribute is `core` (what a `Loss` calls)."""
  signature = _returning(inspect.signature(core), "jax.Array")
  public = _function(core.__name__, core.__module__, core.__doc__, signature, core, core)
  public.evaluate = core  # pyright: ignore[reportFunctionMemberAccess]
  return cast(Reported, public)


@dataclasses.dataclass(frozen=True, eq=False)
class Family:
  """A loss family: its function on `Devices` and the forms derived from it.

  Attributes:
    name: the one-device loss's name (`info_nce`).
    core: `core(z1, z2, *, devices, **options) -> Evaluation`, the family's loss.
    strategy: the sharded form's default strategy (`STRATEGIES`).
    one_device: the options only the one-device loss takes (`check_finite`, ...).
    example: keyword arguments of the derived forms' examples (`"symmetric=True"`).
    note: what the sharded form's docstring adds about its strategies.
    function, sharded, on_mesh: the derived loss functions (`f`, `sharded_f`, `f_on_mesh`).
  """

  name: str
  core: Callable[..., Evaluation]
  strategy: str
  one_device: tuple[str, ...] = ()
  example: str = ""
  note: str = ""
  function: Declared = dataclasses.field(init=False, repr=False)
  sharded: Callable[..., jax.Array] = dataclasses.field(init=False, repr=False)
  on_mesh: Callable[..., jax.Array] = dataclasses.field(init=False, repr=False)

  def __post_init__(self):
    if self.strategy not in STRATEGIES:
      raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}.")
    signature = inspect.signature(self.core)
    keywords = [p for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY]
    unknown = set(self.one_device) - {p.name for p in keywords}
    if "devices" not in signature.parameters or unknown:
      raise ValueError(f"{self.name} must take the keyword devices and the one-device options "
                       f"{sorted(self.one_device)}; got {signature}.")
    pair = [p for p in signature.parameters.values() if p.kind is not p.KEYWORD_ONLY]
    options = [p for p in keywords if p.name != "devices"]
    shared = [p for p in options if p.name not in self.one_device]
    devices = [inspect.Parameter("axis_name", inspect.Parameter.KEYWORD_ONLY, default="data",
                                 annotation="str"),
               inspect.Parameter("strategy", inspect.Parameter.KEYWORD_ONLY,
                                 default=self.strategy, annotation="str")]
    mesh = inspect.Parameter("mesh", inspect.Parameter.KEYWORD_ONLY,
                             annotation="jax.sharding.Mesh")
    module = self.core.__module__
    one = _returning(signature.replace(parameters=pair + options), "jax.Array")
    sharded = one.replace(parameters=pair + shared + devices)
    meshed = one.replace(parameters=pair + [mesh] + shared + devices)
    names = ", ".join(p.name for p in shared if p.name not in ("where", "reduction"))
    derived = {
        "function": _function(self.name, module, self.core.__doc__, one, self._one_device,
                              self.core),
        "sharded": _function(f"sharded_{self.name}", module, self._sharded_doc(names), sharded,
                             self._sharded, self.core),
        "on_mesh": _function(f"{self.name}_on_mesh", module, self._mesh_doc(names), meshed,
                             self._meshed, self.core)}
    for field, function in derived.items():
      object.__setattr__(self, field, function)  # frozen: the derived fields, set once here
    self.function.family = self  # pyright: ignore[reportFunctionMemberAccess]

  def evaluate(self, z1, z2, *, devices=ONE_DEVICE, **options) -> Evaluation:
    """The loss and what it solved, on `devices` (one, or each device's share inside
    `jax.shard_map`: `_devices.Sharded`)."""
    return self.core(z1, z2, devices=devices, **options)

  def _one_device(self, z1, z2, **options) -> Evaluation:
    return self.core(z1, z2, devices=ONE_DEVICE, **options)

  def _sharded(self, z1, z2, *, axis_name, strategy, **options) -> Evaluation:
    return self.core(z1, z2, devices=Sharded(axis_name, strategy), **options)

  def _meshed(self, z1, z2, *, mesh, axis_name, **options) -> Evaluation:
    _arguments.refuse_forward_mode(z1, z2, options, loss=f"{self.name}_on_mesh")
    return Evaluation(on_mesh(self.sharded, z1, z2, mesh=mesh, axis_name=axis_name, **options))

  def _sharded_doc(self, names: str) -> str:
    other = next(s for s in STRATEGIES if s != self.strategy)
    example = f", {self.example}" if self.example else ""
    note = "\n\n  " + _wrap(self.note, "  ") if self.note else ""
    same = _wrap(f"{names}: as in `losses.{self.name}`, over the global batch: a mapping spec "
                 "`\"free_n\"` counts the global batch's candidates, and a batch-scaled mapping's "
                 "global scale is solved over the global batch (its sums `psum`-ed), a per-anchor "
                 "one for this device's anchors, each through the same `strategy`.", "    ",
                 "      ")
    return SHARDED_DOC.format(name=self.name, note=note, other=other, example=example,
                              same=same, strategy=self.strategy)

  def _mesh_doc(self, names: str) -> str:
    same = _wrap(f"strategy, {names}: as in `sharded_{self.name}` (the same on every device).",
                 "    ", "      ")
    return MESH_DOC.format(name=self.name, same=same)


def _wrap(text: str, first: str, later: str | None = None) -> str:
  """`text` in lines of at most 100 characters, the first indented by `first`, the others by
  `later` (default `first`); the first line's indent left out (the template holds it)."""
  lines = textwrap.wrap(text, 96, initial_indent=first, subsequent_indent=later or first)
  return "\n".join(lines).removeprefix(first)


def family(*, strategy: str, one_device: tuple[str, ...] = (), example: str = "",
           note: str = "") -> Callable[[Callable[..., Evaluation]], Declared]:
  """Declares a loss family (`Family`) by its function on `Devices`, which returns an
  `Evaluation`: the decorated name becomes the one-device loss (returning the value), and its
  `family` attribute holds the family, whose `sharded` and `on_mesh` are the derived forms."""

  def declare(core: Callable[..., Evaluation]) -> Declared:
    return Family(core.__name__, core, strategy, tuple(one_device), example, note).function

  return declare


SHARDED_DOC = r"""`{name}` over the global batch, inside `jax.shard_map` on each device's pairs.

  Device `p` holds rows `z1_p, z2_p` (`[n, D]`, `n = N / P`); anchors are its own rows,
  candidates the rows of every device, so the result equals the one-device loss on the
  concatenated batch, and the gradient of each device's embeddings equals its slice of the
  single-device gradient.

  * `strategy="all_gather"`: gather all candidates (`[N or 2N, D]` per device), then the tiles;
    the gather's transpose (a reduce-scatter) returns the candidates' gradients to their owners.
  * `strategy="ring"`: candidate blocks travel round the ring with `lax.ppermute`, `P` hops; the
    tiles fold each in, and the custom backward sends each block's gradient round with it.
    Memory O(n D) per device plus one tile, never the gathered batch.{note}

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from tfcl_jax import losses
    >>> mesh = jax.sharding.Mesh(jax.devices(), ("data",))  # 1, 2, 4 or 8 devices
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 4))
    >>> z2 = jax.random.normal(jax.random.key(1), (8, 4))
    >>> loss_fn = jax.jit(jax.shard_map(
    ...     lambda a, b: losses.sharded_{name}(a, b, strategy="{other}"{example}),
    ...     mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P()))
    >>> expected = losses.{name}(z1, z2{example})
    >>> bool(jnp.allclose(loss_fn(z1, z2), expected, atol=1e-5))
    True

  Args:
    z1: `[n, D]` float, this device's first-view embeddings.
    z2: `[n, D]` float, this device's second-view embeddings (row i the positive of `z1[i]`).
    where: optional `[n]` bool mask of this device's valid pairs.
    reduction: `"mean"` (global mean over valid anchors, the same on every device), `"sum"`
      (global sum), or `"none"` (this device's per-row losses, ordered as `losses.{name}`
      orders a batch of `n` pairs).
    axis_name: the mesh axis the batch is split over; must be bound by `shard_map`.
    strategy: `"all_gather"` or `"ring"` (default `"{strategy}"`).
    {same}

  Returns:
    A scalar (mean, sum) or this device's per-row losses.
  """

MESH_DOC = r"""`sharded_{name}` on global `[N, D]` arrays: splits the batch over `mesh[axis_name]`.

  Builds the `jax.shard_map` for you; differentiate through it as through `losses.{name}` (no
  `jax.set_mesh` needed). `reduction="none"` returns the global per-row losses in the order of
  `losses.{name}`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax import losses
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))  # 1, 2, 4 or 8 devices
    >>> z1 = jax.random.normal(jax.random.key(0), (8, 4))
    >>> z2 = jax.random.normal(jax.random.key(1), (8, 4))
    >>> grad = jax.jit(jax.grad(
    ...     lambda a: losses.{name}_on_mesh(a, z2, mesh=mesh, negatives="all")))
    >>> expected = jax.jit(jax.grad(lambda a: losses.{name}(a, z2, negatives="all")))(z1)
    >>> bool(jnp.allclose(grad(z1), expected, atol=1e-5))
    True

  Args:
    z1: `[N, D]` float, first view; `N` divisible by the number of devices on `axis_name`.
    z2: `[N, D]` float, second view.
    mesh: a `jax.sharding.Mesh` with an axis `axis_name`.
    where: optional `[N]` bool mask of valid pairs.
    reduction: `"mean"`, `"sum"` or `"none"`.
    axis_name: the mesh axis to split the batch over.
    {same}

  Returns:
    The loss (scalar) or the global per-row losses.
  """
