"""Sections 3-4 of Kim & Kim (arXiv 2501.17683) as code: closed forms, autodiff gradient scales,
the hardness view, and the embedding geometry metrics used to read trained models."""

from tfcl_jax.analysis import closed_forms, geometry, gradients, pattern
from tfcl_jax.analysis.closed_forms import (
    eq3,
    eq4,
    eq6,
    eq7,
    eq9,
    eq10,
    eq12,
    eq13,
    learnable_free_t_gradient_scale,
    scaled_free_gradient_scale,
    softmax_ceiling,
)
from tfcl_jax.analysis.geometry import alignment, tolerance, uniformity
from tfcl_jax.analysis.gradients import (
    gradient_scale,
    negative_gradients,
    negative_weights,
    optimum_probability,
    temperature_gradient_scale,
)
from tfcl_jax.analysis.pattern import pattern_embeddings

__all__ = [
    "alignment",
    "closed_forms",
    "eq10",
    "eq12",
    "eq13",
    "eq3",
    "eq4",
    "eq6",
    "eq7",
    "eq9",
    "geometry",
    "gradient_scale",
    "gradients",
    "learnable_free_t_gradient_scale",
    "negative_gradients",
    "negative_weights",
    "optimum_probability",
    "pattern",
    "pattern_embeddings",
    "scaled_free_gradient_scale",
    "softmax_ceiling",
    "temperature_gradient_scale",
    "tolerance",
    "uniformity",
]
