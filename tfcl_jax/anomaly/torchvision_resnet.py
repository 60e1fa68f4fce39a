"""torchvision ResNet weights as Flax variables of `tfcl_jax.models.ResNet` (no download here).

MSC fine-tunes an ImageNet-pretrained ResNet; this maps a torchvision `state_dict` (as NumPy arrays)
onto our `ResNet` so that `weights.save_variables` can store it for `--config.init_checkpoint`.

Recipe (on a machine with torch and the weights):

  import numpy as np, torchvision
  from tfcl_jax.anomaly import torchvision_resnet, weights
  state = torchvision.models.resnet18(weights="IMAGENET1K_V1").state_dict()
  variables = torchvision_resnet.convert({k: v.numpy() for k, v in state.items()})
  weights.save_variables("/path/resnet18_imagenet", variables)
  # then: --config.backbone=resnet18_imagenet --config.init_checkpoint=/path/resnet18_imagenet

Numerics: torchvision pads its stride-2 3x3 convolutions and the stem's max-pool by one pixel on
each side, while `models.ResNet` uses Flax's `"SAME"` padding, which pads (0, 1) at stride 2. The
weights load and fine-tune, but the features are not bit-for-bit torchvision's; exact parity needs
explicit `padding=((1, 1), (1, 1))` on those layers of `models.resnet`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# torchvision BatchNorm2d names -> Flax BatchNorm (params, batch_stats) names.
_BN_PARAMS = {"weight": "scale", "bias": "bias"}
_BN_STATS = {"running_mean": "mean", "running_var": "var"}
# Inside a torchvision BasicBlock -> our BasicBlock's submodules, in creation order.
_BLOCK_LAYERS = {"conv1": "Conv_0", "bn1": "BatchNorm_0", "conv2": "Conv_1", "bn2": "BatchNorm_1",
                 "downsample.0": "Conv_2", "downsample.1": "BatchNorm_2"}


def flax_name(
    torch_key: str, *, stage_sizes: Sequence[int] = (2, 2, 2, 2)
) -> tuple[str, ...] | None:
  """Where a torchvision ResNet key goes: `(collection, module..., variable)`, or None (dropped).

  Examples:
    >>> from tfcl_jax.anomaly import torchvision_resnet
    >>> torchvision_resnet.flax_name("layer2.0.downsample.1.running_var")
    ('batch_stats', 'BasicBlock_2', 'BatchNorm_2', 'var')
    >>> torchvision_resnet.flax_name("fc.weight") is None
    True
  """
  parts = torch_key.split(".")
  variable = parts[-1]
  if parts[0] == "fc" or variable == "num_batches_tracked":
    return None  # the classifier and BatchNorm's counter have no place in the encoder
  if parts[0] in ("conv1", "bn1"):
    modules = ["Conv_0" if parts[0] == "conv1" else "BatchNorm_0"]
    layer = parts[0]
  elif parts[0].startswith("layer") and len(parts) >= 4:
    stage, block = int(parts[0][len("layer"):]) - 1, int(parts[1])
    if not 0 <= stage < len(stage_sizes) or not 0 <= block < stage_sizes[stage]:
      raise ValueError(
          f"key {torch_key!r} is outside a ResNet with stage_sizes {tuple(stage_sizes)}.")
    layer = ".".join(parts[2:-1])
    if layer not in _BLOCK_LAYERS:
      raise ValueError(f"key {torch_key!r}: {layer!r} is not a BasicBlock layer (a Bottleneck "
                       "ResNet-50/101/152 needs a Bottleneck model, which models.ResNet is not).")
    modules = [f"BasicBlock_{sum(stage_sizes[:stage]) + block}", _BLOCK_LAYERS[layer]]
  else:
    raise ValueError(f"key {torch_key!r} is not a torchvision ResNet key.")
  if layer.startswith("conv") or layer == "downsample.0":
    if variable != "weight":
      raise ValueError(f"key {torch_key!r}: convolutions of a ResNet have no {variable!r}.")
    return ("params", *modules, "kernel")
  if variable in _BN_PARAMS:
    return ("params", *modules, _BN_PARAMS[variable])
  if variable in _BN_STATS:
    return ("batch_stats", *modules, _BN_STATS[variable])
  raise ValueError(f"key {torch_key!r}: unknown BatchNorm variable {variable!r}.")


def convert(
    state_dict: Mapping[str, np.ndarray], *, stage_sizes: Sequence[int] = (2, 2, 2, 2)
) -> dict:
  """Flax variables `{"params", "batch_stats"}` of `models.ResNet(stage_sizes=...)`: torchvision's.

  Convolution kernels go from PyTorch's `[out, in, kh, kw]` to Flax's `[kh, kw, in, out]`;
  BatchNorm `weight/bias/running_mean/running_var` become `scale/bias/mean/var` (both use
  epsilon 1e-5). `fc.*` and `num_batches_tracked` are dropped. BasicBlock ResNets only
  (ResNet-18: `stage_sizes=(2, 2, 2, 2)`, ResNet-34: `(3, 4, 6, 3)`); use the ImageNet stem.

  Examples:
    >>> import numpy as np
    >>> from tfcl_jax.anomaly import torchvision_resnet
    >>> variables = torchvision_resnet.convert({"conv1.weight": np.zeros((64, 3, 7, 7)),
    ...                                         "bn1.running_mean": np.zeros(64)})
    >>> kernel = variables["params"]["Conv_0"]["kernel"]
    >>> kernel.shape, sorted(variables["batch_stats"]["BatchNorm_0"])
    ((7, 7, 3, 64), ['mean'])

  Args:
    state_dict: torchvision ResNet `state_dict()` with values as NumPy arrays.
    stage_sizes: blocks per stage of the ResNet the weights come from.

  Returns:
    Nested dicts of float32 NumPy arrays; check them against the model with
    `weights.check_variables` (a wrong depth or width is reported key by key).

  Raises:
    ValueError: a key that no BasicBlock ResNet has, or a convolution weight that is not 4-D.
  """
  variables: dict = {"params": {}, "batch_stats": {}}
  for key, value in state_dict.items():
    name = flax_name(key, stage_sizes=stage_sizes)
    if name is None:
      continue
    value = np.asarray(value, dtype=np.float32)
    if name[-1] == "kernel":
      if value.ndim != 4:
        raise ValueError(f"{key} must be a 4-D [out, in, kh, kw] weight, got shape {value.shape}.")
      value = value.transpose(2, 3, 1, 0)
    node = variables
    for part in name[:-1]:
      node = node.setdefault(part, {})
    node[name[-1]] = value
  return variables
