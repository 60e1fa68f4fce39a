"""`XLA_FLAGS` for a process a test starts: its own host device count, other flags kept."""

from __future__ import annotations

import os


def with_host_devices(count: int) -> str:
  """`$XLA_FLAGS` with `--xla_force_host_platform_device_count=count` in place of any given."""
  flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
           if "xla_force_host_platform_device_count" not in flag]
  return " ".join([*flags, f"--xla_force_host_platform_device_count={count}"])
