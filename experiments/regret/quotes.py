"""What the project's front pages quote from the regret study, written from the study itself:
the headline and each round's pick, free against each row's best τ, the summary and the table
of what to pick by setting, and each candidate's profile. `experiments.regenerate` writes each
into its block of README.md and docs/ (`report.page_blocks`), so no figure there is typed by
hand.

Values are in the study's units (one metric point; 0.005 of NDCG@10) unless a table says
"metric × 100". A row is named by its key in tables and by its title (`title`) in prose.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from experiments.regret.report import summary_table
from experiments.regret.rows import CANDIDATES, Row
from experiments.regret.runs import RowRuns
from experiments.regret.study import (
  ALPHA,
  GOALS,
  TIE,
  SetSummary,
  Study,
  finalists,
  pick,
  summary,
  within_noise,
)


def title(row: Row) -> str:
  """A row's title without its metric: `GRACE, CiteSeer`.

  Examples:
    >>> from experiments.regret import quotes, rows
    >>> quotes.title(rows.ROWS[0]), quotes.title(rows.ROWS[-1])
    ('GRACE, CiteSeer', "two-tower, feature towers, CLIP's loss, logQ")
  """
  return row.title.rsplit(" (", 1)[0]


def metric(row: Row) -> str:
  """A row's metric as its title names it: `F1-micro`, `top-100`."""
  return row.title.rsplit(" (", 1)[1].rstrip(")")


def signed(value: float) -> str:
  """`+0.32`, `−1.14` (a minus sign, not a hyphen)."""
  return f"{value:+.2f}".replace("-", "−")


def ahead(cell: dict) -> bool:
  """The candidate is ahead of the reference beyond seed noise."""
  return cell["regret"] < 0 and cell["p_value"] <= ALPHA


def behind(cell: dict) -> bool:
  """The candidate is behind the reference beyond seed noise."""
  return not within_noise(cell)


def by_key(result: Study, key: str) -> SetSummary:
  return next(s for s in result.sets if s.rows.key == key)


def deciding(result: Study) -> list[SetSummary]:
  """The sets a round's rule decides over, latest round first."""
  return sorted((s for s in result.sets if s.rows.decides), key=lambda s: -s.rows.decides)


def _line(over: SetSummary, candidate: str) -> dict:
  return next(s for s in over.summary if s["candidate"] == candidate)


def _rows(over: SetSummary, *, short: bool = False) -> str:
  n = len(over.rows.rows)
  if short:
    return {"round_1": f"round 1's {n} benchmarks", "advised": f"the {n} advised benchmarks",
            "all": f"all {n} benchmarks"}.get(over.rows.key, over.rows.title)
  return {"round_1": f"round 1's {n} benchmarks (retrieval without the logQ correction)",
          "advised": f"the {n} benchmarks run as this library advises (retrieval with the "
                     "logQ correction)"}.get(over.rows.key, over.rows.title)


def winner(result: Study, over: SetSummary) -> str:
  return pick(over.summary, finalists(over.rows.decides, result.screenings) or [])


def within(result: Study, bound: float) -> list[tuple[SetSummary, list[str]]]:
  """Per set of rows, the candidates with every row and a worst case ≤ `bound`."""
  return [(over, [s["candidate"] for s in over.summary
                  if s["rows"] == s["of_rows"] and s["worst"] <= bound]) for over in result.sets]


def _reached(result: Study, bound: float) -> str:
  found = [(over, names) for over, names in within(result, bound) if names]
  if not found:
    return (f"no candidate stays within {bound:g} points of the best fixed τ on every "
            "benchmark of any set the study summarises")
  return "; ".join(f"within {bound:g} points on every benchmark of {_rows(over, short=True)}: "
                   + ", ".join(f"`{n}`" for n in names) for over, names in found)


def goals(result: Study) -> str:
  """Whether any candidate reached the goal (a worst case ≤ 1 on every row) or ≤ 3, on any
  set."""
  text = (f"The goal, fixed before the runs, was a worst case of at most {GOALS[0]:g} point on "
          "every row: ")
  if not any(names for _, names in within(result, GOALS[-1])):
    return text + (f"no candidate reaches it, nor {GOALS[-1]:g}, over any set of rows the study "
                   "summarises.")
  return text + "; ".join(_reached(result, bound) for bound in GOALS) + "."


def headline(result: Study) -> str:
  """The front page's sentences on tuning: what the goal came to and each round's pick."""
  latest, *earlier = deciding(result)
  top = _line(latest, winner(result, latest))
  text = (f"The regret study ran {len(CANDIDATES)} candidate defaults, left untuned, on "
          f"{len(result.rows)} benchmarks against each one's best fixed τ: "
          f"{_reached(result, GOALS[-1])}, so tune τ where you can. Where you cannot, round "
          f"{latest.rows.decides}'s rule, fixed before its runs, picks `{top['candidate']}`: "
          f"at worst {top['worst']:.2f} points behind, {top['mean']:.2f} on average, over "
          f"{_rows(latest)}")
  for over in earlier:
    mine = _line(over, winner(result, over))
    text += (f"; round {over.rows.decides}'s rule, over {_rows(over)}, picked "
             f"`{mine['candidate']}` ({mine['worst']:.2f} at worst)")
  return text + ".\n"


def _picks(result: Study) -> str:
  parts = []
  for over in deciding(result):
    mine = _line(over, winner(result, over))
    parts.append(f"round {over.rows.decides}'s rule picks `{mine['candidate']}`, "
                 f"{mine['worst']:.2f} points behind the best fixed τ at worst over {_rows(over)}")
  return "; ".join(parts)


def picks(result: Study) -> str:
  """One sentence: each round's pick, its worst case and where."""
  return f"Of the regret study's pre-registered rules, {_picks(result)}.\n"


def _mean(runs: RowRuns, cell: dict, candidate: str) -> float:
  """The candidate's mean over the seeds its cell pairs."""
  values = runs.by_table[cell["table"]][candidate]
  return float(np.mean([values[s] for s in sorted(values)[:cell["seeds"]]]))


def _metric(value: float) -> str:
  return f"{100 * value:.2f}"


def _free(result: Study) -> list[tuple[RowRuns, dict]]:
  cell = {c["row"]: c for c in result.full if c["candidate"] == "free"}
  return [(runs, cell[runs.row.key]) for runs in result.runs if runs.row.key in cell]


def _difference(runs: RowRuns, cell: dict) -> str:
  scale = 100 * runs.row.unit  # regret units -> metric × 100
  return (f"{signed(-cell['regret'] * scale)} ({cell['sem'] * scale:.2f}), "
          f"p = {cell['p_value']:.2g}, {cell['seeds_won']}/{cell['seeds']}")


def _tau(spec: str) -> str:
  return "τ " + spec[len("tau="):]


def evidence(result: Study, *, detail: bool = False) -> str:
  """Free against each row's best fixed τ (metric × 100): best (and with `detail` worst) τ of
  the grid, free's mean, free − best paired by seed; with `detail` the candidates within
  noise of the best τ there."""
  head = ("| benchmark (metric, seeds) | " + ("worst → best" if detail else "best")
          + " fixed τ | free | free − best fixed τ: mean (s.e.), p, seeds free is level or "
          "ahead |" + (" within seed noise of the best τ (or ahead) |" if detail else ""))
  lines = [head, "|---|---|---|---|" + ("---|" if detail else "")]
  for runs, cell in _free(result):
    row, best = runs.row, runs.reference
    text = f"{_metric(runs.grid[best])} ({_tau(best)})"
    worst = min(runs.grid, key=runs.grid.get)
    if detail:
      text = (f"{_metric(runs.grid[worst])} ({_tau(worst)}) → " if worst != best
              else "one τ: ") + text
    line = (f"| {title(row)} ({metric(row)}, {row.seeds}) | {text} | "
            f"{_metric(_mean(runs, cell, 'free'))} | {_difference(runs, cell)} |")
    if detail:
      level = [c["candidate"] for c in result.full if c["row"] == row.key and within_noise(c)]
      line += " " + (", ".join(f"`{c}`" for c in level) or "none") + " |"
    lines.append(line)
  return "\n".join(lines) + "\n"


def _span(names: Sequence[str]) -> str:
  return ", ".join(names) if names else "none"


def in_short(result: Study) -> str:
  """Bullets: free against the best τ, and what an untuned fixed τ costs."""
  free = _free(result)
  up = [title(r.row) for r, c in free if ahead(c)]
  level = [title(r.row) for r, c in free if c["p_value"] > ALPHA]
  down = [(r, c) for r, c in free if behind(c)]
  spans = [100 * (max(r.grid.values()) - min(r.grid.values())) for r, _ in free
           if len(r.grid) > 1]
  every = by_key(result, "all")
  counts = ", ".join(f"`{s['candidate']}` on {s['within_noise']}" for s in every.summary
                     if s["candidate"].startswith("tau="))
  most = max(down, key=lambda rc: rc[1]["regret"])
  return (
      f"- **Free against each benchmark's best fixed τ** (the table below), of "
      f"{len(free)}: ahead of it beyond seed noise on {len(up)} ({_span(up)}), level with it "
      f"(paired p > {ALPHA:g}) on {len(level)}, behind it beyond noise on {len(down)}, by "
      f"{min(c['regret'] for _, c in down):.2f} to {most[1]['regret']:.2f} points (the most "
      f"on {title(most[0].row)}).\n"
      f"- **An untuned fixed τ**: from its worst to its best τ, a benchmark's grid spans "
      f"{min(spans):.2f} to {max(spans):.2f} points (metric × 100). No fixed τ is level with "
      f"or ahead of the best on every benchmark: of {len(every.rows.rows)}, {counts}.\n")


def summary_lines(result: Study) -> str:
  """The summary the latest round decides over, with each round's pick under it."""
  latest = deciding(result)[0]
  lines = [f"Over {latest.rows.title}:", "", *summary_table(latest.summary), ""]
  for over in deciding(result):
    m = _margin(result, over)
    gap = round(m[3], 2) - round(m[1], 2)  # as the two shown values give it
    lines.append(f"- Round {over.rows.decides}'s rule over {_rows(over)}: `{m[0]}`, "
                 f"{m[1]:.2f} at worst, {gap:.2f} below the next, `{m[2]}` "
                 f"({m[3]:.2f}; a difference under {TIE:g} would be a tie).")
  lines += ["", goals(result)]
  return "\n".join(lines) + "\n"


def _margin(result: Study, over: SetSummary) -> tuple[str, float, str, float]:
  chosen = finalists(over.rows.decides, result.screenings) or []
  won = pick(over.summary, chosen)
  by = {s["candidate"]: s for s in over.summary}
  other = min((by[c] for c in chosen if c != won), key=lambda s: s["worst"])
  return won, by[won]["worst"], other["candidate"], other["worst"]


@dataclasses.dataclass(frozen=True)
class Setting:
  """A setting of "What to pick": its label and the rows that measure it."""
  label: str
  rows: tuple[str, ...]


SETTINGS = (
    Setting("graph contrastive learning (GRACE)", ("grace_citeseer", "grace_cora")),
    Setting("SimCLR (kNN and linear probe; MNIST-1D and digits)",
            ("simclr_mnist1d_knn", "simclr_mnist1d_linear", "simclr_digits_e20",
             "simclr_digits_e100")),
    Setting("supervised, Khosla et al.'s `L_out` (`form=\"supcon\"`)",
            ("supcon_mnist1d", "supcon_digits")),
    Setting("supervised NT-Xent (`form=\"ntxent\"`)", ("ntxent_mnist1d", "ntxent_digits")),
    Setting("sequential recommendation, one epoch (DCRec)", ("dcrec_ml100k",)),
    Setting("anomaly detection (MSC, at the ceiling)", ("msc_digits",)),
    Setting("two-tower retrieval with the logQ correction",
            ("retrieval_tutorial_logq", "retrieval_tutorial_clip_logq",
             "retrieval_features_logq", "retrieval_features_clip_logq")),
    Setting("two-tower retrieval without it",
            ("retrieval_tutorial", "retrieval_tutorial_clip", "retrieval_features",
             "retrieval_features_clip")),
    Setting("short runs: digits for 20 epochs, one DCRec epoch, the TFRS tutorial's 30 steps "
            "(with logQ)",
            ("simclr_digits_e20", "dcrec_ml100k", "retrieval_tutorial_logq",
             "retrieval_tutorial_clip_logq")),
)


def points(value: float) -> str:
  """Points behind the best τ, a minus sign where ahead: `4.07`, `−0.78`."""
  return f"{value:.2f}".replace("-", "−")


def _worst(s: dict) -> str:
  return f"`{s['candidate']}` {points(s['worst'])}"


def setting_line(result: Study, label: str, rows: Sequence[str]) -> str:
  """One line of "What to pick": over the rows, the three smallest worst cases of the
  candidates that ran every row (less those a screening stopped), free's worst case, and the
  candidates level with or ahead of the best τ on every row."""
  by_candidate = summary(result.full, rows, CANDIDATES)
  kept = set(finalists(len(result.screenings), result.screenings) or CANDIDATES)
  complete = [s for s in by_candidate if s["rows"] == len(rows) and s["candidate"] in kept]
  ranked = sorted(complete, key=lambda s: s["worst"])
  free = next(s for s in complete if s["candidate"] == "free")
  level = [s["candidate"] for s in complete if s["within_noise"] == len(rows)]
  return (f"| {label} ({len(rows)}) | {', '.join(map(_worst, ranked[:3]))} | "
          f"{points(free['worst'])} | {', '.join(f'`{c}`' for c in level) or 'none'} |")


def settings(result: Study) -> str:
  """The "What to pick" table: the latest decision's set first, then each setting."""
  latest = deciding(result)[0]
  lines = ["| your setting (benchmarks) | the three smallest worst cases (points behind the best "
           "τ; − ahead) | free's worst case | level with or ahead of the best τ on each "
           "benchmark |", "|---|---|---|---|",
           setting_line(result, f"no time to tune, round {latest.rows.decides}'s pick: "
                        f"{latest.rows.short.removeprefix('the ').split(' ', 1)[1]}",
                        latest.rows.rows)]
  lines += [setting_line(result, s.label, s.rows) for s in SETTINGS]
  return "\n".join(lines) + "\n"


def _range(values: Sequence[float]) -> str:
  low, high = min(values), max(values)
  return points(low) if f"{low:.2f}" == f"{high:.2f}" else f"{points(low)} to {points(high)}"


def fixed_taus(result: Study) -> str:
  """Per setting: each benchmark's best fixed τ, and each fixed-τ candidate's regret there
  (its smallest to its largest over the setting's benchmarks)."""
  taus = [c for c in CANDIDATES if c.startswith("tau=")]
  runs = {r.row.key: r for r in result.runs}
  by_cell = {(c["row"], c["candidate"]): c for c in result.full}
  lines = ["| setting (benchmarks) | best fixed τ of each | "
           + " | ".join(f"`{t}` behind it" for t in taus) + " |",
           "|---|---|" + "---|" * len(taus)]
  for setting in SETTINGS:
    best = ", ".join(runs[k].reference[len("tau="):] for k in setting.rows)
    ranges = [_range([by_cell[(k, t)]["regret"] for k in setting.rows if (k, t) in by_cell])
              for t in taus]
    lines.append(f"| {setting.label} ({len(setting.rows)}) | {best} | " + " | ".join(ranges)
                 + " |")
  return "\n".join(lines) + "\n"


def logq_gain(result: Study) -> str:
  """How much the logQ correction raised each retrieval row's best fixed τ and free."""
  runs = {r.row.key: r for r in result.runs}
  best, free = [], []
  for logq in (r for r in result.runs if r.row.stands_for):
    plain = runs[logq.row.stands_for]
    best.append(100 * (logq.grid[logq.reference] - plain.grid[plain.reference]))
    mine = {c["row"]: c for c in result.full if c["candidate"] == "free"}
    free.append(100 * (_mean(logq, mine[logq.row.key], "free")
                       - _mean(plain, mine[plain.row.key], "free")))
  return (f"On the {len(best)} retrieval benchmarks the logQ correction raised the best fixed "
          f"τ's top-100 by {min(best):.2f} to {max(best):.2f} points and free's by "
          f"{min(free):.2f} to {max(free):.2f}.\n")


def profile(result: Study, candidate: str) -> str:
  """A candidate's worst case, mean and rows within noise over the advised rows and all rows,
  and the rows where it is ahead beyond noise and where it is more than 3 points behind."""
  parts = []
  for over in (by_key(result, "advised"), by_key(result, "all")):
    s = _line(over, candidate)
    if s["rows"]:
      parts.append(f"over {_rows(over, short=True)} {s['worst']:.2f} at worst "
                   f"({s['worst_row']}), mean {s['mean']:.2f}, level or ahead on "
                   f"{s['within_noise']} of {s['rows']}"
                   + ("" if s["rows"] == s["of_rows"] else " run"))
  mine = [c for c in result.full if c["candidate"] == candidate]
  up = [f"{c['row']} ({-c['regret']:.2f})" for c in mine if ahead(c)]
  far = [f"{c['row']} ({c['regret']:.2f})" for c in mine if c["regret"] > GOALS[-1]]
  return (f"`{candidate}`: " + "; ".join(parts) + f". Ahead of the best τ beyond noise on "
          f"{_span(up)}; more than {GOALS[-1]:g} points behind on {_span(far)}.\n")
