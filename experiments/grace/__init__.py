r"""GRACE on CiteSeer / Cora under each similarity-to-logit mapping: Table 3 (Section 5.2).

Run: python -m experiments.grace --config=experiments/configs/grace_citeseer.py --workdir=DIR
  [--config.losses=free,tau=0.5 --config.seeds=20 --config.epochs=1000]

`config.losses` lists loss specs (`tfcl_jax.losses.from_spec`): a mapping spec trains with
InfoNCE, `sigmoid/<mapping>[/b=<init> | /learn_b=<init>]` with the sigmoid loss (SigLIP:
`sigmoid/learnable=0.1/learn_b=siglip`).

Writes DIR/results.csv (one row per (loss, seed)), DIR/results.md (Table 3 beside the paper,
and free minus each loss paired by seed) and DIR/f1_micro.png, rewritten as each run ends.
Rerunning the command continues the workdir (`experiments.framework`); more seeds or losses
may be added, other fields are refused. `train`: the runs and the sweep; `report`: the tables;
`probe`: a finished sweep's encoders under other probe splits
(`python -m experiments.grace.probe --workdir=DIR`).
"""

from experiments.framework.experiment import Experiment
from experiments.grace.report import probe_committed_markdown, results_markdown
from experiments.grace.train import abstract_step, check_config, train_and_evaluate

__all__ = ["EXPERIMENT", "check_config", "results_markdown", "train_and_evaluate"]

EXPERIMENT = Experiment(
    name="grace", kind="sweep", train_and_evaluate=train_and_evaluate,
    check_config=check_config, results_markdown=results_markdown, abstract_step=abstract_step,
    configs=("experiments/configs/grace_citeseer.py", "experiments/configs/grace_cora.py"),
    reads_files=True,
    command_tables={"experiments.grace.probe": probe_committed_markdown})
