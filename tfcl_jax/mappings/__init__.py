r"""Similarity-to-logit mappings: fixed, free, learnable, dynamic and annealed temperature.

Section 2 of Kim & Kim (arXiv 2501.17683) feeds `cos / tau` to the softmax
(Eq. 1); Section 4 replaces it with the scaled log-odds `2 artanh(cos)` (Eq. 11).

Every mapping is a `Mapping` (a pytree: learnable scalars are its leaves) around a
`MappingFunction`, the pure mapping with the closed forms, checks and logit scale it declares to the
losses:

- `temperature(tau)`: `cos / tau` (Eq. 1);
- `temperature_free()`: `2 artanh(cos)` (Eq. 11), the default of every loss;
- `learnable_temperature(tau=...)`: CLIP's `exp(t) cos` (Eq. 8);
- `learnable_free()`: `exp(t) 2 artanh(cos)`, free (Eq. 11) at the start `t = 0`;
- `n_aware_free(num_candidates=N)`: `s(N) 2 artanh(cos)`, `s(N) = 1 + log(N - 1) / log 9`;
- `dynamic_temperature(tau_min, tau_max)`: DySTreSS's per-pair `cos / tau(cos)`;
- `annealed_temperature(schedule)`: `cos / schedule(step)`;
- `calibrated_free()`, `perplexity_free()`, `accuracy_free()`: `s 2 artanh(cos)` with `s` solved
  by the loss from its own batch (the maximum-likelihood scale; per anchor, perplexity
  `sqrt(N)`; the entropy the batch's top-1 accuracy earns), bounded to `[S_MIN, S_MAX]`;
- `from_spec("tau=0.25")`: any of them from its mapping spec (the grammar: docs/specs.md); the
  losses also take the spec itself (`mapping="free"`); each module registers the forms of its
  mappings in `SPECS`, from which the parser, the errors and the docs' table are read;
- `logit_scale(mapping)`: the factor `1 / tau` or `min(exp(t), max_scale)` of a temperature mapping,
  `s` of a scaled free mapping (None for an unbound batch-scaled one); `max_logit_scale(mapping)`
  its cap.
"""

import importlib
import pkgutil

from tfcl_jax.mappings._base import (
    ExpForm,
    LogSigmoidForm,
    Mapping,
    MappingFunction,
    MappingLike,
    ParameterCheck,
)
from tfcl_jax.mappings._batch_scaled import (
    GRID_EXPONENTS,
    S_MAX,
    S_MIN,
    accuracy_free,
    calibrated_free,
    perplexity_free,
)
from tfcl_jax.mappings._dynamic import dynamic_tau, dynamic_temperature
from tfcl_jax.mappings._free import max_free_logit, temperature_free
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
    "GRID_EXPONENTS",
    "SPECS",
    "SPEC_FORMS",
    "S_MAX",
    "S_MIN",
    "ExpForm",
    "LogSigmoidForm",
    "MappingFunction",
    "Mapping",
    "MappingLike",
    "ParameterCheck",
    "accuracy_free",
    "annealed_temperature",
    "as_mapping",
    "calibrated_free",
    "dynamic_tau",
    "dynamic_temperature",
    "free_scale",
    "from_spec",
    "learnable_free",
    "learnable_temperature",
    "logit_scale",
    "max_free_logit",
    "max_logit_scale",
    "n_aware_free",
    "perplexity_free",
    "temperature",
    "temperature_free",
]

# A mapping's module registers its spec forms when it is imported: every module of the package
# is, so that a new mapping is its module (and its test) alone; exporting its constructor here
# is up to it.
for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f"{__name__}.{_module.name}")
