"""The regret study of `docs/regret.md`: each candidate default against every benchmark's best
fixed τ, from the committed per-seed CSVs.

`study`: the rows, the candidates, the pairing by seed and the rules of `docs/regret.md`;
`report`: `results/regret.md`, `.csv` and `.png`.

Run: python -m experiments.regret            (writes results/regret.md, .csv, .png)
     python -m experiments.regret --check    (exit 1 when regret.md or regret.csv differ)
`python -m experiments.regenerate` runs it after every other table.
"""
