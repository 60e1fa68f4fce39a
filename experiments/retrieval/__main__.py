"""`python -m experiments.retrieval`: the two-tower sweep on the shared command line."""

from experiments.retrieval import EXPERIMENT

if __name__ == "__main__":
  EXPERIMENT.main()
