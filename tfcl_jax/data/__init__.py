"""Datasets for contrastive pretraining and evaluation: TFDS (ArrayRecord) through grain, no TF.

`make_loader` yields per-host numpy batches; `load_arrays` gives a whole split in memory.
"""

from tfcl_jax.data.loader import Loader, load_arrays, make_loader, steps_per_epoch
from tfcl_jax.data.registry import DATASETS, DatasetInfo, get_info
from tfcl_jax.data.tfds_source import DatasetNotPreparedError

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "DatasetNotPreparedError",
    "Loader",
    "get_info",
    "load_arrays",
    "make_loader",
    "steps_per_epoch",
]
