"""`python -m experiments.msc`: MSC's sweep on the shared command line."""

from experiments.framework import cli
from experiments.msc import train

if __name__ == "__main__":
  cli.run_main(train.train_and_evaluate, check_config=train.check_config,
               usage="pass --config=experiments/configs/msc_digits.py --workdir=DIR")
