"""`python -m experiments.regret`: see `experiments.regret.report`."""

from experiments.regret import report

if __name__ == "__main__":
  report.main()
