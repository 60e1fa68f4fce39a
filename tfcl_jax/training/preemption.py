"""Stopping a run at a step boundary: SIGTERM (a preempted job) and Ctrl-C are held until the
step ends, so that the loop can checkpoint that step before it stops; several hosts agree on it.
"""

from __future__ import annotations

import signal
import threading

import jax


class Preempted(Exception):  # noqa: N818  # names the event, as KeyboardInterrupt does
  """SIGTERM reached a run: `train` saved a checkpoint at step `step` and stopped.

  The run continues with `resume=True`. A command line exits with status 143 (128 + SIGTERM),
  which schedulers read as "terminated, may be requeued".

  Examples:
    >>> from tfcl_jax.training import preemption
    >>> error = preemption.Preempted(3, "/tmp/run")
    >>> error.step, str(error)
    (3, 'preempted (SIGTERM): checkpoint saved at step 3 in /tmp/run; resume to continue.')
  """

  def __init__(self, step: int, workdir: str):
    super().__init__(f"preempted (SIGTERM): checkpoint saved at step {step} in {workdir}; "
                     f"resume to continue.")
    self.step, self.workdir = step, workdir


class Preemption:
  """Notices SIGTERM and Ctrl-C during a run; `reached(step)` says when to checkpoint and stop.

  One process: a SIGTERM handler sets a flag (the previous handler is restored on exit; outside
  the main thread no handler can be installed and SIGTERM keeps its meaning). Several
  processes: JAX's preemption sync manager (`jax.distributed.initialize` installs it) agrees on
  one step for all of them, so that they save the same checkpoint.

  Ctrl-C (SIGINT, one process, where Python's own handler is in place) is held to the next step
  boundary the same way, so that it never lands inside a checkpoint write and the step it
  stops at is saved; a second Ctrl-C interrupts at once.

  Examples:
    >>> import os, signal
    >>> from tfcl_jax.training import preemption
    >>> with preemption.Preemption() as stops:
    ...   before = stops.reached(1)
    ...   os.kill(os.getpid(), signal.SIGTERM)  # held: the run goes on to the step's end
    ...   after = stops.reached(2)
    >>> before, after, type(stops.stop(2, "/tmp/run")).__name__
    (False, True, 'Preempted')
  """

  def __init__(self):
    self.requested = self.interrupted = self.installed = self.installed_int = False
    self.previous = self.previous_int = None
    self.distributed = jax.process_count() > 1

  def __enter__(self) -> Preemption:
    if not self.distributed and threading.current_thread() is threading.main_thread():
      self.previous = signal.signal(signal.SIGTERM, self._handle)
      self.installed = True
      if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        self.previous_int = signal.signal(signal.SIGINT, self._handle_int)
        self.installed_int = True
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def _handle_int(self, signum, frame):
    del signum, frame
    if self.interrupted:  # the second Ctrl-C does not wait for the step
      raise KeyboardInterrupt
    self.interrupted = True

  def __exit__(self, *exc_info):
    if self.installed:  # None: a handler set outside Python, which Python cannot reinstall
      signal.signal(signal.SIGTERM,
                    signal.SIG_DFL if self.previous is None else self.previous)
    if self.installed_int:
      signal.signal(signal.SIGINT, self.previous_int)

  def reached(self, step_number: int) -> bool:
    """Whether the run should checkpoint `step_number` and stop (the same answer on every host)."""
    if not self.distributed:
      return self.requested or self.interrupted
    from jax.experimental import multihost_utils  # noqa: PLC0415

    try:
      return multihost_utils.reached_preemption_sync_point(step_number)
    except RuntimeError:  # the preemption service is off (jax_enable_preemption_service)
      return False

  def stop(self, step_number: int, workdir: str) -> BaseException:
    """What to raise after the checkpoint of `step_number`: Ctrl-C, else `Preempted`."""
    if self.interrupted and not self.requested:
      return KeyboardInterrupt(f"checkpoint saved at step {step_number} in {workdir}")
    return Preempted(step_number, workdir)
