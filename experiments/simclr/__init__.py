"""SimCLR with fixed, learnable or temperature-free InfoNCE: Section 5.1, Table 2 of the paper.

  python -m experiments.simclr --config=experiments/configs/simclr_digits.py --workdir=DIR \
    [--config.losses=tau=0.1,free --config.seeds=3 --config.epochs=20 --config.batch_size=256]

Trains one run per (loss spec, seed) (or per (batch size, loss spec, seed) with
`--config.mode=n_sensitivity`) with `tfcl_jax.training`, each in `DIR/runs/...`, and writes
`DIR/results.csv`, `DIR/results.md` and PNG plots. A run is one run of
`experiments.framework.pretraining` (MSC pretrains its encoder with one too); `train`: the
sweep and the train step to lower; `report`: the tables and plots. Everything a run
needs is checked before the first step; rerunning the command continues the workdir
(`experiments.framework`: finished runs kept, an interrupted one resumed from its last
checkpoint, a workdir made with another config refused; more seeds or losses may be added).
"""

from experiments.framework.experiment import Experiment
from experiments.framework.pretraining import check_config
from experiments.simclr.report import results_markdown
from experiments.simclr.train import abstract_step, train_and_evaluate

__all__ = ["EXPERIMENT", "check_config", "results_markdown", "train_and_evaluate"]

EXPERIMENT = Experiment(
    name="simclr", kind="sweep", train_and_evaluate=train_and_evaluate,
    check_config=check_config, results_markdown=results_markdown, abstract_step=abstract_step,
    configs=tuple(f"experiments/configs/{name}.py" for name in (
        "simclr_digits", "simclr_mnist1d", "simclr_cifar10", "simclr_imagenette",
        "supcon_digits", "supcon_mnist1d")))
