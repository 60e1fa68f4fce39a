"""The regret study of `docs/regret.md`: each candidate default of both rounds against every
benchmark's best fixed τ, from the committed per-seed CSVs.

`rows`: the candidates, rows, tables and sets of rows fixed before the runs; `runs`: a row's
runs, its grid and reference, and the pairing by seed; `study`: the summaries and the rules of
`docs/regret.md`; `fragility`: each decision's margin and the rule with each row left out;
`changes`: every change to a protocol after its first result, dated, with what it moved;
`predictions`: round 2's predictions as tests on the cells; `scales`: what each scale did over
training (`traces`: a solved scale's path, from a sweep's run logs); `selection` and
`selection_report`: round 3, τ chosen per seed by a score of the runs (its section of
`results/regret.md` and `regret_selection.csv`, once a round-3 table is committed); `report`
and `figures`: `results/regret.md`, `.csv`, `.png` and `regret_scales.png`; `quotes` and
`outcome`: what README.md and docs/ quote from the study, by block (`pages`), which
`python -m experiments.regenerate` writes.

Run: python -m experiments.regret            (writes results/regret.md, .csv and the figures)
     python -m experiments.regret --check    (exit 1 when regret.md or regret.csv differ)
`python -m experiments.regenerate` runs it after every other table.
"""
