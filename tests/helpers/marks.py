"""Parameters of the widest sweeps: a quick few in the default run, the rest marked heavy (CI's
second step, `-m heavy`, runs them)."""

from __future__ import annotations

import pytest


def widest(*values, quick):
  """`values` as pytest parameters, those not in `quick` marked heavy."""
  return [value if value in quick else pytest.param(value, marks=pytest.mark.heavy)
          for value in values]
