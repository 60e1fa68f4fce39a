"""The fused kernels of InfoNCE's logsumexp (`implementation="pallas"`), below the public face.

* `_pallas`: the Pallas plumbing: the mapping traced into the kernels, the padding, the plan and
  its custom VJP, which calls a backend through the protocol `_protocol.Kernels`;
* `_kernel_triton`, `_kernel_triton_pairs`, `_triton_blocks`, `_triton_tiles`: the Triton
  backend (GPUs; Pallas's interpreter on a CPU);
* `_kernel_tpu`: the Mosaic backend (TPUs);
* `_kernel_math`: the tile math both backends share.

The kernels take the engine's `Side`s and tile layout (`_engine`); they never import the public
face (`tfcl_jax.losses`).
"""
