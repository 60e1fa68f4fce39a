"""Sections 3-4 of Kim & Kim (arXiv 2501.17683) as code: closed forms, autodiff gradient scales,
and the embedding geometry metrics used to read trained models."""

from tfcl_jax.analysis import geometry
from tfcl_jax.analysis.geometry import alignment, tolerance, uniformity

__all__ = [
    "alignment",
    "geometry",
    "tolerance",
    "uniformity",
]
