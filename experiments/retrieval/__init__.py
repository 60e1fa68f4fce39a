r"""Two-tower retrieval on MovieLens with each loss: fixed τ, learnable scale, free, sigmoid.

The towers (`tfcl_jax.models.towers`) embed users and movies; each batch of (user, movie)
interactions is scored with in-batch negatives by the loss its spec names
(`tfcl_jax.objectives.retrieval`: one-directional InfoNCE, CLIP's symmetric loss, SigLIP's
sigmoid loss, the tutorial's raw dot-product softmax, with or without the logQ correction).
After every epoch each test interaction's movie is ranked against every movie (exact;
`tfcl_jax.evaluation.ranking.rank_all`): top-k accuracy (TensorFlow Recommenders'
`FactorizedTopK`; Recall@k with one relevant item) and NDCG@10 of the last epoch are reported.

Run: python -m experiments.retrieval --config=experiments/configs/retrieval_ml100k.py \
  --workdir=DIR [--config.losses=free,clip:learnable=0.07:100 --config.seeds=3]

Writes DIR/results.csv (one row per (loss, seed)), DIR/results.md (metrics per loss, free
minus each loss paired by seed, the learnable scale's end values) and DIR/retrieval.png
(top-100 accuracy per loss; the learnable scale over training), rewritten as each run ends.
Rerunning continues the workdir (`experiments.framework`). `train`: the data, the towers, one
run and the sweep; `report`: the tables and the figure.
"""


from experiments.framework.experiment import Experiment
from experiments.retrieval.report import results_markdown
from experiments.retrieval.train import abstract_step, check_config, train_and_evaluate

__all__ = ["EXPERIMENT", "check_config", "results_markdown", "train_and_evaluate"]

EXPERIMENT = Experiment(
    name="retrieval", kind="sweep", train_and_evaluate=train_and_evaluate,
    check_config=check_config, results_markdown=results_markdown, abstract_step=abstract_step,
    configs=("experiments/configs/retrieval_ml100k.py",), reads_files=True)
