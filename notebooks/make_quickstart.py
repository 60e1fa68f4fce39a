# ruff: noqa: E501  (the markdown cells keep their prose lines)
"""Writes notebooks/quickstart.ipynb without outputs.

Run from the repository root: python -m notebooks.make_quickstart
"""

from __future__ import annotations

import os

from notebooks import nbtools

CELLS = [
    ("md", r"""# tfcl_jax quickstart: temperature-free InfoNCE in a Flax training loop

Kim & Kim, *Temperature-Free Loss Function for Contrastive Learning* (arXiv 2501.17683) replace
`cos / tau` in InfoNCE (Eq. 1) by `2 artanh(cos) = log((1 + cos) / (1 - cos))` (Eq. 11): no
temperature to tune. This notebook

1. drops `tfcl_jax.losses.info_nce` into a plain Flax/optax loop you might already have,
2. trains SimCLR on scikit-learn's 8x8 digits with the temperature-free mapping against two fixed
   temperatures, using `tfcl_jax.training`, and plots kNN accuracy and the gradient norm.

Runs on a CPU in a couple of minutes.

""" + nbtools.COLAB_NOTE),
    ("code", nbtools.colab_install_cell("[experiments,data]")),
    ("code", r"""import functools
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

from tfcl_jax import augment, data, losses, mappings, models
from tfcl_jax.evaluation import knn
from tfcl_jax.objectives import simclr
from tfcl_jax.training import optim, sharding, state, step

# TFCL_QUICKSTART_EPOCHS shrinks the run (the test suite executes this notebook with 1).
EPOCHS = int(os.environ.get("TFCL_QUICKSTART_EPOCHS", "15"))
BATCH_SIZE = 256
print(jax.devices())"""),
    ("md", r"""## 1. `info_nce` in an existing pipeline

Any encoder, any optimiser: compute the two views' embeddings and call `info_nce`. The only
choice is the `mapping`: `mappings.temperature(0.1)` is SimCLR's NT-Xent, `temperature_free()`
is Eq. 11 (the default)."""),
    ("code", r"""import flax.linen as nn


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(32)(nn.relu(nn.Dense(64)(x.reshape(len(x), -1))))

images, _ = data.load_arrays("digits", "train")
mlp = MLP()
params = mlp.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
tx = optax.adam(1e-3)
opt_state = tx.init(params)

@jax.jit
def my_step(params, opt_state, batch, key):
  view1, view2 = augment.two_views(key, batch, recipe="digits")
  def loss_fn(params):
    return losses.info_nce(mlp.apply(params, view1), mlp.apply(params, view2),
                           mapping=mappings.temperature_free(), negatives="all")
  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = tx.update(grads, opt_state)
  return optax.apply_updates(params, updates), opt_state, loss

for i in range(10):
  batch = images[(i * BATCH_SIZE) % 1024:][:BATCH_SIZE]
  params, opt_state, loss = my_step(params, opt_state, batch, jax.random.key(i))
print(f"loss after 10 steps: {float(loss):.3f}")"""),
    ("md", r"""## 2. SimCLR on digits: temperature-free against fixed temperatures

`simclr.make_simclr_loss` is a `loss_fn(params, model_state, batch, key, step)`;
`step.make_train_step` compiles it into a sharded `jit` step (the batch split over the devices'
`data` axis, parameters replicated) that also reports the gradient norm `||dL/dW||` and the mean
positive and negative cosines. `python -m experiments.simclr` runs the full sweep with checkpoints
and result files; here we write the epoch loop by hand."""),
    ("code", r"""info = data.get_info("digits")
train_images, train_labels = data.load_arrays("digits", info.train_split)
test_images, test_labels = data.load_arrays("digits", info.test_split)
mesh = sharding.make_mesh()
model = models.make_contrastive_model("small_cnn", width=16, projection_hidden_dim=64,
                                      projection_dim=32)
features = simclr.make_feature_fn(model)
center = jax.jit(functools.partial(augment.center_view, recipe="digits"))
two_views = functools.partial(augment.two_views, recipe="digits")
steps_per_epoch = data.steps_per_epoch("digits", info.pretrain_split, batch_size=BATCH_SIZE)
init = jax.jit(lambda key: model.init(key, jnp.zeros((2, 8, 8, 1)), train=False))

def knn_accuracy(s):
  embed = lambda x: simclr.embed(features, s.params["model"], s.model_state, x,
                                 preprocess=center)
  return knn.knn_top1(embed(train_images), train_labels, embed(test_images), test_labels,
                      num_classes=10)

def train(spec, seed=0):
  loss = losses.from_spec(spec)
  variables = init(jax.random.key(seed))
  tx = optim.make_optimizer(name="sgd", learning_rate=0.06, weight_decay=5e-4,
                            total_steps=EPOCHS * steps_per_epoch)
  s = state.create_train_state(model_params=variables["params"], tx=tx,
                               model_state={"batch_stats": variables["batch_stats"]},
                               loss_params=loss.params)
  train_step = step.make_train_step(
      simclr.make_simclr_loss(model, loss=loss, augment=two_views), mesh=mesh)
  loader = data.make_loader("digits", info.pretrain_split, batch_size=BATCH_SIZE, seed=seed,
                            num_epochs=EPOCHS)
  history = {"grad_norm": [], "loss": [], "knn": []}
  for index, batch in enumerate(loader):
    s, metrics = train_step(s, sharding.shard_batch(batch, mesh), jax.random.key(seed))
    history["grad_norm"].append(float(metrics["grad_norm"]))
    history["loss"].append(float(metrics["loss"]))
    if (index + 1) % steps_per_epoch == 0:
      history["knn"].append(knn_accuracy(s))
  return history

histories = {spec: train(spec) for spec in ("tau=0.1", "tau=1", "free")}
for spec, history in histories.items():
  print(f"{spec:8s} kNN top-1 after {EPOCHS} epochs: {100 * history['knn'][-1]:.1f}%")"""),
    ("code", r"""fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
for spec, history in histories.items():
  ax1.plot(range(1, EPOCHS + 1), 100 * np.array(history["knn"]), marker="o", label=spec)
  ax2.plot(history["grad_norm"], label=spec)
ax1.set(xlabel="epoch", ylabel="kNN top-1 (%)", title="kNN accuracy (k = 200)")
ax2.set(xlabel="step", ylabel="||dL/dW||", title="gradient norm", yscale="log")
ax1.legend()
plt.tight_layout()
plt.show()"""),
    ("md", r"""With `tau = 1` the logits live in `[-1, 1]` (Example 3.1's representational limit) and the
gradient shrinks as training goes; the temperature-free mapping needs no `tau` and keeps a gradient
until positives align (Eq. 13). For the full sweep (5 losses x 3 seeds, tables and plots):

```
python -m experiments.simclr --config=experiments/configs/simclr_digits.py --workdir=/tmp/digits
```"""),
]


if __name__ == "__main__":
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.ipynb")
  nbtools.write(CELLS, path)
  print(f"wrote {path}")
