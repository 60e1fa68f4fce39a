"""Parameters of the widest sweeps: a quick few in the default run, the rest marked heavy (CI's
second step, `-m heavy`, runs them)."""

from __future__ import annotations

import pytest


def _check_quick(values, quick):
  missing = [value for value in quick if value not in values]
  if missing:
    raise ValueError(f"quick values {missing!r} are not among the values {list(values)!r}")


def widest(*values, quick):
  """`values` as pytest parameters, those not in `quick` marked heavy.

  Raises:
    ValueError: a value of `quick` is not one of `values` (it would run nowhere quick).
  """
  _check_quick(values, quick)
  return [value if value in quick else pytest.param(value, marks=pytest.mark.heavy)
          for value in values]


def widest_cases(*cases, quick):
  """`cases`, tuples of the arguments of `parametrize("a, b, ...")`, those not in `quick` marked
  heavy.

  Raises:
    ValueError: a case of `quick` is not one of `cases`.
  """
  _check_quick(cases, quick)
  return [case if case in quick else pytest.param(*case, marks=pytest.mark.heavy)
          for case in cases]
