"""The registry of mapping specs: each mapping's module registers its forms here (docs/specs.md)."""

from tfcl_jax import specs

#: The forms of a mapping spec (a `tfcl_jax.specs.Registry`), each registered by the module of
#: its mapping, e.g. `SPECS.register("tau=T", temperature, T=specs.Positive("tau"), help=...)`.
#: `/` separates a loss spec's parts: a mapping spec holds none.
SPECS = specs.Registry("mapping spec", "mapping", reserved="/")
#: The forms of a mapping spec, one a line (`from_spec`'s errors print them; docs/specs.md).
SPEC_FORMS = specs.FormLines(SPECS)
