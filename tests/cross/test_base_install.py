"""The base install (`pip install tfcl_jax`, no extras): every library module imports, training
runs without the experiments' extras (tqdm, matplotlib, scikit-learn, ...), and what needs an
extra says which."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The `experiments`, `data` and `bench` extras; scipy comes with jax itself.
EXTRAS = ("tqdm", "matplotlib", "sklearn", "ml_collections", "tensorflow_datasets", "grain",
          "tensorflow", "torch", "mnist1d")

SCRIPT = r"""
import sys
for name in sys.argv[1:]:
  sys.modules[name] = None  # `import name` now raises ImportError
import importlib, pkgutil, tempfile
import jax, jax.numpy as jnp, numpy as np, optax
import tfcl_jax
failed = []
for module in pkgutil.walk_packages(tfcl_jax.__path__, "tfcl_jax."):
  try:
    importlib.import_module(module.name)
  except ImportError as error:
    failed.append(f"{module.name}: {error}")
assert not failed, failed
from tfcl_jax.training import loop, sharding, state, step
def loss_fn(params, model_state, batch, key, step_index):
  z = batch["x"] @ params["model"]["w"]
  return tfcl_jax.info_nce(z[:4], z[4:]), (model_state, {})
mesh = sharding.make_mesh(jax.devices()[:1])
s = state.create_train_state(model_params={"w": jnp.eye(3)}, tx=optax.sgd(0.1))
batches = lambda start: ({"x": np.random.default_rng(i).normal(size=(8, 3)).astype(np.float32)}
                         for i in range(start, 3))
kwargs = dict(train_step=step.make_train_step(loss_fn, mesh=mesh), batches=batches,
              num_steps=3, key=jax.random.key(0), mesh=mesh)
s = loop.train(s, workdir=tempfile.mkdtemp(), progress=False, **kwargs)
assert int(s.step) == 3
try:
  loop.train(s, workdir=tempfile.mkdtemp(), progress=True, **kwargs)
except ImportError as error:
  assert "progress=False" in str(error), error
else:
  raise AssertionError("progress=True without tqdm must say how to fix it")
from tfcl_jax import data
try:
  data.load_arrays("digits", "train")
except ImportError as error:
  assert "tfcl_jax[experiments]" in str(error), error
else:
  raise AssertionError("digits without scikit-learn must name the extra")
print("ok")
"""


def test_library_imports_and_trains_without_the_extras():
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  env.pop("XLA_FLAGS", None)
  result = subprocess.run([sys.executable, "-c", SCRIPT, *EXTRAS], env=env, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def _in_a_fresh_environment() -> None:
  """The same checks with the project installed alone (`pip install .`, no extras) in a new
  virtual environment: `.ci/run` runs `python tests/cross/test_base_install.py` there, outside the
  repository, so that `tfcl_jax` is the installed package and the extras are truly absent."""
  import importlib.util  # noqa: PLC0415

  present = [name for name in EXTRAS if importlib.util.find_spec(name) is not None]
  if present:
    raise SystemExit(f"not a base install: {present} are importable.")
  exec(compile(SCRIPT, "<base install>", "exec"), {"__name__": "__main__"})  # noqa: S102


if __name__ == "__main__":
  _in_a_fresh_environment()
