"""On-device image augmentations for contrastive learning: two random views per image (SimCLR).

`two_views` and `center_view` are the batched entry points; the per-image building blocks live
in `geometry`, `colour` and `blur`.
"""

from tfcl_jax.augment import blur, colour, geometry, recipes
from tfcl_jax.augment.recipes import RECIPES, Recipe, center_view, two_views

__all__ = [
    "RECIPES",
    "Recipe",
    "blur",
    "center_view",
    "colour",
    "geometry",
    "recipes",
    "two_views",
]
