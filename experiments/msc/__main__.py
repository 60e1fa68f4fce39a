"""`python -m experiments.msc`: MSC's sweep on the shared command line."""

from experiments.msc import EXPERIMENT

if __name__ == "__main__":
  EXPERIMENT.main()
