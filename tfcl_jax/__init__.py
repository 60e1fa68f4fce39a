"""tfcl_jax: contrastive learning without temperature tuning, in JAX.

Kim & Kim, "Temperature-Free Loss Function for Contrastive Learning" (arXiv 2501.17683).
"""

from tfcl_jax import analysis, losses, mappings, schedules
from tfcl_jax.losses import info_nce, supervised_info_nce
from tfcl_jax.mappings import temperature, temperature_free

__version__ = "0.1.0"

__all__ = [
    "analysis",
    "info_nce",
    "losses",
    "mappings",
    "schedules",
    "supervised_info_nce",
    "temperature",
    "temperature_free",
]
