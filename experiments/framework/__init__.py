"""The skeleton every experiment shares: what an experiment declares (`experiment`), the runs of a
config (`plan`), one sweep per workdir (`workdir`), training the runs not yet finished
(`sweep`), the label-free scores of each run on held-out data (`held_out`), the results files
(`tables`), the command line (`cli`) and the abstract inputs of a train step lowered without its
data (`lowering`); and what several experiments share, so that none imports another: a
config's images (`images`), contrastive pretraining of an image encoder (`pretraining`, which
SimCLR sweeps and MSC pretrains with), the studies' InfoNCE and step on the sphere
(`sphere_study`). It imports no experiment: `experiments.registry` finds them, and
`experiments.regenerate` rebuilds the committed tables.
"""
