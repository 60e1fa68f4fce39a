"""`python -m experiments.simclr`: the SimCLR sweep on the shared command line."""

from experiments.simclr import EXPERIMENT

if __name__ == "__main__":
  EXPERIMENT.main()
