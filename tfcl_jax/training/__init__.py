"""Training stack: Flax train state, optax optimisers, sharded jit step, orbax checkpoints, a loop.

The same pieces train SimCLR on images (`experiments/simclr/`) and GRACE on a graph.
"""

from tfcl_jax.training import (
    checkpoint,
    files,
    loop,
    lowering,
    optim,
    outputs,
    preemption,
    sharding,
    state,
    step,
)
from tfcl_jax.training.loop import StepEvaluation, train
from tfcl_jax.training.optim import make_optimizer
from tfcl_jax.training.sharding import make_mesh
from tfcl_jax.training.state import TrainState, create_train_state
from tfcl_jax.training.step import make_train_step

__all__ = [
    "StepEvaluation",
    "TrainState",
    "checkpoint",
    "create_train_state",
    "files",
    "loop",
    "lowering",
    "make_mesh",
    "make_optimizer",
    "make_train_step",
    "optim",
    "outputs",
    "preemption",
    "sharding",
    "state",
    "step",
    "train",
]
