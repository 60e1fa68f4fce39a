"""`python -m experiments.grace`: GRACE's sweep on the shared command line."""

from experiments.framework import cli
from experiments.grace import train

if __name__ == "__main__":
  cli.run_main(train.train_and_evaluate, check_config=train.check_config,
               usage="pass --config=experiments/configs/grace_citeseer.py --workdir=DIR")
