"""Throughput of the SimCLR train step (digits CNN, CIFAR-size ResNet-18) and the loss's share.

  python -m benchmarks.train_step_bench [--cases digits,cifar_resnet18] [--repeats 5]
    [--cifar-batch 64] [--imagenette-batch 0]

Per case, measured interleaved in one process (median of `--repeats` timings of `--steps`
steps): the full step with `free` and with `tau=0.1` (ratio free/tau), the same step with a
trivial loss instead of InfoNCE (the rest of the step), and InfoNCE alone (forward + backward on
`[B, D]` projections). Share of the loss = loss alone / full step.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from tfcl_jax import augment, losses, mappings, models
from tfcl_jax.objectives import simclr
from tfcl_jax.training import optim, sharding, state, step

CASES = {
    # name: (backbone, width, image size, channels, recipe, projection hidden dim,
    #        projection dim, batch)
    "digits": ("small_cnn", 16, 8, 1, "digits", 64, 32, 256),
    "cifar_resnet18": ("resnet18_cifar", 0, 32, 3, "simclr_cifar", 512, 128, 64),
    "imagenette_resnet18": ("resnet18_imagenet", 0, 160, 3, "simclr", 512, 128, 64),
}


def _trivial_loss(model, augment_fn):
  """The SimCLR step without InfoNCE: same views, forward, backward; loss = mean square."""

  def loss_fn(params, model_state, batch, key, step_index):
    view1, view2 = augment_fn(key, batch["image"])
    (_, projections), new_state = model.apply(
        {"params": params["model"], **model_state}, jnp.concatenate([view1, view2]), train=True,
        mutable=list(model_state))
    return jnp.mean(projections ** 2), (new_state, {})

  return loss_fn


def _time(fn, steps):
  start = time.perf_counter()
  out = None
  for _ in range(steps):
    out = fn()
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / steps


def bench_case(name, *, batch, repeats, steps, mesh):
  backbone, width, size, channels, recipe, projection_hidden_dim, projection_dim, _ = CASES[name]
  view_size = 128 if name == "imagenette_resnet18" else size
  model = models.make_contrastive_model(backbone, width=width or None,
                                        projection_hidden_dim=projection_hidden_dim,
                                        projection_dim=projection_dim)
  augment_fn = functools.partial(augment.two_views, recipe=recipe, out_size=view_size)
  variables = jax.jit(lambda: model.init(
      jax.random.key(0), jnp.zeros((2, view_size, view_size, channels)), train=False))()
  tx = optim.make_optimizer(name="sgd", learning_rate=0.06, total_steps=1000, weight_decay=5e-4)
  images = np.random.default_rng(0).integers(0, 256, (batch, size, size, channels), np.uint8)
  placed = sharding.shard_batch({"image": images}, mesh)
  key = jax.random.key(1)
  runners = {}
  for label, loss_fn in (
      ("step free", simclr.make_simclr_loss(model, loss=mappings.temperature_free(),
                                            augment=augment_fn)),
      ("step tau=0.1", simclr.make_simclr_loss(model, loss=mappings.temperature(0.1),
                                               augment=augment_fn)),
      ("step without loss", _trivial_loss(model, augment_fn))):
    train_step = step.make_train_step(loss_fn, mesh=mesh, donate=False)
    s = state.create_train_state(model_params=variables["params"],
                                 model_state={"batch_stats": variables["batch_stats"]}, tx=tx)
    s = jax.device_put(s, sharding.replicated(mesh))  # placed once, not on every timed call
    jax.block_until_ready(train_step(s, placed, key))  # compile
    runners[label] = functools.partial(train_step, s, placed, key)
  z = jax.random.normal(jax.random.key(2), (2, batch, projection_dim))
  loss_grad = jax.jit(jax.value_and_grad(
      lambda z1, z2: losses.info_nce(z1, z2, mapping=mappings.temperature_free(),
                                     negatives="all"), argnums=(0, 1)))
  jax.block_until_ready(loss_grad(z[0], z[1]))
  runners["InfoNCE fwd+bwd"] = functools.partial(loss_grad, z[0], z[1])
  timings = {label: [] for label in runners}
  for _ in range(repeats):  # interleaved, so load changes hit every variant alike
    for label, fn in runners.items():
      timings[label].append(_time(fn, steps))
  return {label: float(np.median(values)) for label, values in timings.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", default="digits,cifar_resnet18")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--digits-batch", type=int, default=256)
  parser.add_argument("--cifar-batch", type=int, default=64)
  parser.add_argument("--imagenette-batch", type=int, default=64)
  args = parser.parse_args()
  mesh = sharding.make_mesh()
  print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}")
  batches = {"digits": args.digits_batch, "cifar_resnet18": args.cifar_batch,
             "imagenette_resnet18": args.imagenette_batch}
  for name in args.cases.split(","):
    batch = batches[name]
    t = bench_case(name, batch=batch, repeats=args.repeats, steps=args.steps, mesh=mesh)
    full = t["step free"]
    print(f"\n{name}: batch {batch} images ({2 * batch} views), median of {args.repeats} x "
          f"{args.steps} steps")
    for label, seconds in t.items():
      print(f"  {label:18s} {1e3 * seconds:9.2f} ms  ratio to step free {seconds / full:6.3f}")
    print(f"  steps/s {1 / full:.2f}, examples/s {batch / full:.0f} (images; x2 views)")
    print(f"  share of the step in InfoNCE: {t['InfoNCE fwd+bwd'] / full:.1%} (loss alone), "
          f"{1 - t['step without loss'] / full:.1%} (step minus step without loss)")
    print(f"  free / tau=0.1 step time: {full / t['step tau=0.1']:.3f}")


if __name__ == "__main__":
  main()
