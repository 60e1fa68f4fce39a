"""The skeleton every experiment shares: the runs of a config (`plan`), one sweep per workdir
(`workdir`), training the runs not yet finished (`sweep`), the results files (`tables`), the
command line (`cli`) and each experiment's train step lowered without its data (`lowering`).
The committed tables are rebuilt from their CSVs by `experiments.regenerate`.

An experiment is a module (or a package) with `check_config(config)` and
`train_and_evaluate(config, workdir)`; `python -m experiments.NAME` runs it through `cli`.
"""
