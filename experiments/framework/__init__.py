"""The skeleton every experiment shares: what an experiment declares (`experiment`), the runs of a
config (`plan`), one sweep per workdir (`workdir`), training the runs not yet finished
(`sweep`), the label-free scores of each run on held-out data (`held_out`), the results files
(`tables`), the command line (`cli`) and the abstract inputs of a train step lowered without its
data (`lowering`). It imports no experiment:
`experiments.registry` lists them, and `experiments.regenerate` rebuilds the committed tables.
"""
