"""`python -m experiments.simclr`: the SimCLR sweep on the shared command line."""

from experiments.framework import cli
from experiments.simclr import train

if __name__ == "__main__":
  cli.run_main(train.train_and_evaluate, check_config=train.check_config,
               usage="pass --config=experiments/configs/simclr_digits.py --workdir=DIR")
