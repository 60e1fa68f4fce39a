r"""Similarity-to-logit mappings: fixed, free, learnable, dynamic and annealed temperature.

Section 2 of Kim & Kim (arXiv 2501.17683) feeds `cos / tau` to the softmax
(Eq. 1); Section 4 replaces it with the scaled log-odds `2 artanh(cos)` (Eq. 11).

Every mapping is a `Mapping` (a pytree: learnable scalars are its leaves) around a
`MappingFunction`, the pure mapping with the closed forms, checks, logit scale and kernel form it
declares to the losses. Each mapping's module registers its constructor in `SPECS` with its spec
form (`@SPECS.register("tau=T", ...)`): the parser (`from_spec`, and the losses' `mapping="free"`),
the errors' list of forms, the table of docs/specs.md and this package's exports are read from
there, so a new mapping is its module (and its test). `temperature_free()` (Eq. 11) is the
default of every loss; `calibrated_free()`, `perplexity_free()` and `accuracy_free()` have a
scale the loss solves from its own batch (`BatchScaled`, bounded to `[S_MIN, S_MAX]`);
`logit_scale(mapping)` gives the factor `1 / tau`, `min(exp(t), max_scale)` or `s` of a mapping
that has one, `max_logit_scale(mapping)` its cap.
"""

import importlib
import pkgutil

from tfcl_jax.mappings._base import Mapping, MappingLike
from tfcl_jax.mappings._batch_scaled import (
    S_MAX,
    S_MIN,
    BatchScaled,
    accuracy_free,
    batch_scaled,
    calibrated_free,
    perplexity_free,
)
from tfcl_jax.mappings._dynamic import dynamic_tau, dynamic_temperature
from tfcl_jax.mappings._free import max_free_logit, temperature_free
from tfcl_jax.mappings._function import (
    ExpForm,
    LogSigmoidForm,
    MappingFunction,
    ParameterCheck,
    finite_check,
    positive_check,
)
from tfcl_jax.mappings._registry import SPEC_FORMS, SPECS
from tfcl_jax.mappings._scaled_free import free_scale, learnable_free, n_aware_free
from tfcl_jax.mappings._spec import as_mapping, from_spec
from tfcl_jax.mappings._temperature import (
    annealed_temperature,
    learnable_temperature,
    logit_scale,
    max_logit_scale,
    temperature,
)

__all__ = [
    "SPECS",
    "SPEC_FORMS",
    "S_MAX",
    "S_MIN",
    "BatchScaled",
    "ExpForm",
    "LogSigmoidForm",
    "MappingFunction",
    "Mapping",
    "MappingLike",
    "ParameterCheck",
    "accuracy_free",
    "annealed_temperature",
    "as_mapping",
    "batch_scaled",
    "calibrated_free",
    "dynamic_tau",
    "dynamic_temperature",
    "finite_check",
    "free_scale",
    "from_spec",
    "learnable_free",
    "learnable_temperature",
    "logit_scale",
    "max_free_logit",
    "max_logit_scale",
    "n_aware_free",
    "perplexity_free",
    "positive_check",
    "temperature",
    "temperature_free",
]

# A mapping's module registers its constructor and spec form when it is imported: every module
# of the package is, and every public constructor registered is exported, so that a new mapping
# is its module (and its test) alone.
for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f"{__name__}.{_module.name}")
for _name, _builder in SPECS.builders().items():
  globals().setdefault(_name, _builder)
  if _name not in __all__:
    __all__.append(_name)
