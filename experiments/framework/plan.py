"""The runs of a config: their loss specs, seeds and axes, each with its own folder, and the checks
of the fields that choose them.

A run is one loss spec × seed × value of each axis an experiment adds (`Run`); `plan` lists a
config's runs in the experiment's order and `Run.directory` gives each its folder,
`runs/<spec>[/<axis>_<value>...]/seed<seed>`. The config holds loss specs as strings; `plan`
reads each once (`parse_losses`), and its runs carry the parsed loss (`Run.loss`) to training.
`recorded` is the config as a workdir and each of its runs record it: without the fields that
only choose which runs exist (`PLAN_FIELDS`), so a sweep grows by rerunning it with more seeds
or losses, and without those that change nothing in a run (`NOT_RECORDED`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import numbers
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tfcl_jax import losses
from tfcl_jax.specs import ParsedSpec

RUNS_DIR = "runs"
MAX_RUNS = 100_000  # a plan larger than this is a typo (seeds=1e9), not a sweep
#: The fields `plan` reads: they choose which runs exist, and may change in a workdir.
PLAN_FIELDS = ("losses", "seeds", "seed_offset")
#: The fields that change nothing in a run: whether a rerun continues the workdir
#: (`resume`) and whether it shows progress bars (`progress`).
NOT_RECORDED = ("resume", "progress")


class ConfigError(ValueError):
  """A config, dataset, checkpoint or workdir problem found before training: the command line
  prints it as one line and exits 2."""


class ConfigTypeError(ConfigError, TypeError):
  """A config field of the wrong type (a `ConfigError` that is also a `TypeError`)."""


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of a sweep: its loss spec (canonical), its seed, and the axes an experiment adds,
  e.g. `(("batch_size", 256),)`; `loss`: the spec as `plan` parsed it, which builds the run's
  `Loss` given its candidates per anchor (None: a name the experiment runs itself, such as
  retrieval's `popularity`, or a run read back from its folder).

  Examples:
    >>> from experiments.framework.plan import Run
    >>> run = Run("sigmoid/tau=0.5/learn_b=prior", 3, (("batch_size", 256),))
    >>> run.directory("w"), run["batch_size"]
    ('w/runs/sigmoid_tau_0.5_learn_b_prior/batch_size_256/seed3', 256)
  """

  spec: str
  seed: int
  axes: tuple[tuple[str, Any], ...] = ()
  loss: ParsedSpec | None = dataclasses.field(default=None, compare=False, repr=False)

  def __post_init__(self):
    if self.loss is not None and self.loss.spec != self.spec:
      raise ValueError(f"run {self.spec!r} carries the loss of {self.loss.spec!r}.")

  def __getitem__(self, name: str):
    return dict(self.axes)[name]

  def record(self) -> dict[str, Any]:
    """The run's identity as its folder's `config.json` records it."""
    return {"spec": self.spec, "seed": self.seed, **dict(self.axes)}

  def directory(self, workdir: str) -> str:
    axes = [f"{name}_{_safe(value)}" for name, value in self.axes]
    return os.path.join(workdir, RUNS_DIR, _safe(self.spec), *axes, f"seed{self.seed}")

  def label(self) -> str:
    return " ".join([self.spec, f"seed {self.seed}"] + [f"{n}={v}" for n, v in self.axes])


def _safe(value) -> str:
  return re.sub(r"[^A-Za-z0-9.]+", "_", str(value))


# -- config fields ----------------------------------------------------------------------------


@contextlib.contextmanager
def config_errors(prefix: str = "") -> Iterator[None]:
  """Within it, a `ValueError`, `TypeError` or `FileNotFoundError` (a library's check of a
  value it was given from the config: a dataset or backbone name, a spec, a path) is a
  `ConfigError`, its message after `prefix`."""
  try:
    yield
  except (ValueError, TypeError, FileNotFoundError) as error:
    if isinstance(error, ConfigError) and not prefix:
      raise
    raise ConfigError(f"{prefix}{error}") from error


def split_list(text, *, name: str) -> list[str]:
  """The items of a comma list config field (`"tau=0.1, free"`), at least one.

  Raises:
    ConfigError: the list is empty; names `config.<name>`.
  """
  items = [item.strip() for item in str(text).split(",") if item.strip()]
  if not items:
    raise ConfigError(f"config.{name} must list at least one item, got {text!r}.")
  return items


def check_fields(config, *, positive: Sequence[str] = (), non_negative: Sequence[str] = (),
                 positive_numbers: Sequence[str] = (), non_negative_numbers: Sequence[str] = (),
                 fractions: Sequence[str] = (), choices: Mapping[str, Sequence] | None = None
                 ) -> None:
  """Checks the types and ranges of a config's fields, without reading data or a workdir.

  Every experiment's `check_config` calls this, so a bad field is named whatever the
  environment holds: before its data is opened, its workdir created or a device touched.
  A nested field is named dotted (`"stuck.steps"`).

  Args:
    config: the ConfigDict.
    positive: ints >= 1 (counts, sizes, periods).
    non_negative: ints >= 0 (offsets, minimums where 0 means none).
    positive_numbers: finite numbers > 0 (learning rates, ratios).
    non_negative_numbers: finite numbers >= 0 (loss weights, weight decay).
    fractions: numbers in [0, 1) (dropout and masking rates).
    choices: field -> the values it may take.

  Raises:
    ConfigTypeError: a field of the wrong type, naming it.
    ConfigError: a value out of its range or not among its choices, naming the field.

  Examples:
    >>> import ml_collections
    >>> from experiments.framework import plan
    >>> config = ml_collections.ConfigDict({"epochs": 0, "dropout": 0.1})
    >>> plan.check_fields(config, positive=("epochs",), fractions=("dropout",))
    Traceback (most recent call last):
    ...
    experiments.framework.plan.ConfigError: config.epochs must be an int >= 1, got 0.
  """
  for fields, text, low in ((positive, ">= 1", 1), (non_negative, ">= 0", 0)):
    for field in fields:
      value = config[field]
      if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigTypeError(f"config.{field} must be an int {text}, got {value!r}.")
      if value < low:
        raise ConfigError(f"config.{field} must be an int {text}, got {value!r}.")
  ranges = ([(field, "> 0", lambda v: v > 0) for field in positive_numbers]
            + [(field, ">= 0", lambda v: v >= 0) for field in non_negative_numbers]
            + [(field, "in [0, 1)", lambda v: 0 <= v < 1) for field in fractions])
  for field, text, ok in ranges:
    value = config[field]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      raise ConfigTypeError(f"config.{field} must be a number {text}, got {value!r}.")
    if not (math.isfinite(value) and ok(value)):
      raise ConfigError(f"config.{field} must be a number {text}, got {value!r}.")
  for field, allowed in (choices or {}).items():
    if config[field] not in allowed:
      raise ConfigError(f"config.{field} must be one of {', '.join(map(repr, allowed))}, got "
                        f"{config[field]!r}.")


def parse_losses(config, *, example: str, field: str = "losses",
                 others: Sequence[str] = ()) -> list[ParsedSpec | str]:
  """The loss specs of `config.<field>` read once, each once, in order: the one parser of
  every experiment's losses (`free`, `tau=0.5`, `clip:learnable=0.07:100`,
  `sigmoid/learnable=0.1/learn_b=siglip`, ...: `tfcl_jax.losses.spec.parse`). `others` are
  names an experiment runs beside its losses, kept as strings (retrieval's untrained
  `popularity`).

  Raises:
    ConfigError: an empty list or a malformed spec; the message names `config.<field>` and
      shows `example` (e.g. `"free,tau=0.5"`).

  Examples:
    >>> import ml_collections
    >>> from experiments.framework import plan
    >>> config = ml_collections.ConfigDict({"losses": " tau=0.50, free, tau=0.5"})
    >>> [parsed.spec for parsed in plan.parse_losses(config, example="free")]
    ['tau=0.5', 'free']
  """
  parsed = {}
  for text in split_list(config[field], name=field):
    try:
      spec = text if text in others else losses.spec.parse(text)
    except ValueError as error:
      raise ConfigError(f"config.{field}: {error} (e.g. --config.{field}={example})") from error
    parsed.setdefault(spec if isinstance(spec, str) else spec.spec, spec)
  return list(parsed.values())


def loss_specs(config, *, example: str, field: str = "losses",
               others: Sequence[str] = ()) -> list[str]:
  """The canonical loss specs of `config.<field>`, each once, in order (`parse_losses`): how
  the tables order their rows.

  Examples:
    >>> import ml_collections
    >>> from experiments.framework import plan
    >>> plan.loss_specs(ml_collections.ConfigDict({"losses": " tau=0.50, free"}), example="free")
    ['tau=0.5', 'free']
  """
  return [spec_of(parsed) for parsed in parse_losses(config, example=example, field=field,
                                                      others=others)]


def spec_of(loss: ParsedSpec | str) -> str:
  """The canonical spec of a parsed loss, or the name an experiment runs itself."""
  return loss if isinstance(loss, str) else loss.spec


def plan(config, *, order: Sequence[str] = ("seed", "spec"),
         axes: Mapping[str, Sequence] | None = None,
         specs: Sequence[ParsedSpec | str] | None = None,
         example: str = "free,tau=0.5") -> list[Run]:
  """The runs of `config`: every spec × seed × axis value, nested in `order` (the first name
  varies slowest; e.g. `("seed", "spec")`: seed-major, so an interrupted sweep has as many
  seeds of every spec). Each run carries its parsed loss (`Run.loss`).

  Args:
    config: with `losses` (or `specs` given), `seeds` and optionally `seed_offset`.
    order: `"spec"`, `"seed"` and the names of `axes`.
    axes: the experiment's own axes, name -> values.
    specs: the parsed losses (`parse_losses`), when the experiment reads them itself; a str
      is a name it runs itself (its runs carry no loss).
    example: shown in the error for a bad `config.losses`.

  Raises:
    ConfigError: a bad `config.losses`, `config.seeds` or `config.seed_offset`, naming it, or
      more than `MAX_RUNS` runs.
  """
  axes = dict(axes or {})
  if sorted(order) != sorted(["spec", "seed", *axes]):
    raise ValueError(f"order must name 'spec', 'seed' and the axes {sorted(axes)}, got {order}.")
  specs = parse_losses(config, example=example) if specs is None else list(specs)
  check_fields(config, positive=("seeds",),
               non_negative=("seed_offset",) if "seed_offset" in config else ())
  count = len(specs) * config.seeds * math.prod(len(values) for values in axes.values())
  if count > MAX_RUNS:
    raise ConfigError(f"config.seeds={config.seeds} plans {count} runs (losses x seeds x axes), "
                      f"more than {MAX_RUNS}.")
  first = config.get("seed_offset", 0)
  values = {"spec": specs, "seed": list(range(first, first + config.seeds)), **axes}
  runs = []
  for combination in itertools.product(*(values[name] for name in order)):
    named = dict(zip(order, combination, strict=True))
    loss = named["spec"]
    runs.append(Run(spec_of(loss), named["seed"], tuple((name, named[name]) for name in axes),
                    None if isinstance(loss, str) else loss))
  return runs


# -- what a workdir records -------------------------------------------------------------------


def recorded(config, *, plan_fields: Sequence[str] = ()) -> dict[str, Any]:
  """`config` as a workdir records it (its `config.json`, and each run's with the run's
  identity): without `PLAN_FIELDS`, the experiment's own `plan_fields` and `NOT_RECORDED`."""
  left_out = {*PLAN_FIELDS, *plan_fields, *NOT_RECORDED}
  return {k: v for k, v in config.to_dict().items() if k not in left_out}


def resume(config) -> bool:
  """Whether a rerun continues the workdir (`config.resume`, default True); False refuses a
  workdir that already holds results."""
  return bool(config.get("resume", True))


def progress(config) -> bool:
  """Whether the runs show progress bars (`config.progress`, default True)."""
  return bool(config.get("progress", True))
