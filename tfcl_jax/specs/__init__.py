"""Spec registries: each form of a spec string declared once, beside the code that builds it.

A spec names an object by a short string for configs and command lines (`tau=0.25`,
`sigmoid/free/learn_b=prior`). A `Registry` holds the forms of one kind of spec, each declared by
one `Registry.register` call in the module of what it builds: its pattern, the typed arguments of
its metavariables, its builder and one help line. The parser, the forms that errors list, the
names suggested for a misspelt one and the tables of docs/specs.md are all read from there
(`tfcl_jax.mappings.SPECS`, `tfcl_jax.losses.SPECS`).
"""

from tfcl_jax.specs._args import CANDIDATES, NUMBER, Arg, Choice, Count, Deferred, Positive
from tfcl_jax.specs._forms import Form, ParsedSpec
from tfcl_jax.specs._registry import FormLines, Nested, Registry, SpecError

__all__ = ["CANDIDATES", "NUMBER", "Arg", "Choice", "Count", "Deferred", "Form", "FormLines",
           "Nested", "ParsedSpec", "Positive", "Registry", "SpecError"]
