"""`python -m experiments.grace`: GRACE's sweep on the shared command line."""

from experiments.grace import EXPERIMENT

if __name__ == "__main__":
  EXPERIMENT.main()
