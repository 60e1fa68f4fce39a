"""On-device image augmentations for contrastive learning: two random views per image (SimCLR).

`two_views` and `center_view` are the batched entry points; the per-image building blocks live
in `geometry`, `colour` and `blur`; `signal` holds MNIST-1D's transforms for 1-D signals.
`graph`: GRACE's graph views (edge removing, feature masking).
"""

from tfcl_jax.augment import blur, colour, geometry, graph, recipes, signal
from tfcl_jax.augment.recipes import RECIPES, Recipe, center_view, two_views

__all__ = [
    "RECIPES",
    "Recipe",
    "blur",
    "center_view",
    "colour",
    "geometry",
    "graph",
    "recipes",
    "signal",
    "two_views",
]
