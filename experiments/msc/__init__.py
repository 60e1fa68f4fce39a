"""Mean-Shifted Contrastive anomaly detection with fixed or temperature-free InfoNCE: Table 4.

  python -m experiments.msc --config=experiments/configs/msc_digits.py --workdir=DIR \
    [--config.losses=tau=0.25,free --config.seeds=3 --config.classes=0,1,2]

One normal class at a time (MSC's protocol; the others are the anomalies). Without
`--config.init_checkpoint`, first pretrains the encoder without labels with SimCLR (in
`DIR/pretrain`). Then per (loss, seed, normal class) (`config.losses`: InfoNCE loss specs)
MSC fine-tuning and the ROC-AUC of the kNN score (`train`). Writes `DIR/results.csv`,
`DIR/results.md` (the command and Table 4; `results_markdown`, which `experiments.regenerate`
also calls) and `DIR/roc_auc.png` (`report`). Every check that can fail runs before the first
step.
"""

from experiments.framework.experiment import Experiment
from experiments.msc.report import results_markdown
from experiments.msc.train import abstract_step, check_config, train_and_evaluate

__all__ = ["EXPERIMENT", "check_config", "results_markdown", "train_and_evaluate"]

EXPERIMENT = Experiment(
    name="msc", kind="sweep", train_and_evaluate=train_and_evaluate,
    check_config=check_config, results_markdown=results_markdown, abstract_step=abstract_step,
    configs=("experiments/configs/msc_digits.py", "experiments/configs/msc_cifar10.py"))
