"""`python -m experiments.retrieval`: the two-tower sweep on the shared command line."""

from experiments.framework import cli
from experiments.retrieval import train

if __name__ == "__main__":
  cli.run_main(train.train_and_evaluate, check_config=train.check_config,
               usage="pass --config=experiments/configs/retrieval_ml100k.py --workdir=DIR")
