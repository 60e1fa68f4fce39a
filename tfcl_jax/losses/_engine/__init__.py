"""The losses' engine: the tiled computation every cosine loss runs, below the public face.

* `_tiles`: one tile (its products in the rows' dtype), `TileReduction`, the contract a loss
  family declares (what a tile folds into per-row and per-column statistics, and its
  backward), and InfoNCE's `LogSumExp`; `_sums`: SigLIP's and SupCon's sums;
* `_tiled`: the schedule of tiles and the one custom VJP (`tile_reduce`); `_pure`: a mapping
  made pure for it, and arguments cast to vary inside `shard_map`;
* `_blocks`: tile sizes per platform; `_layout`: the loss's rows and candidates as `Side`s
  (normalised, masked, with extra negatives);
* `_devices`: the same reductions across devices (all-gather or a ring);
* `_calibration`, `_moments`: the pre-pass that solves a batch-scaled mapping's scale.

It imports neither the public face (`tfcl_jax.losses`) nor the kernels (`_kernels`).
"""
