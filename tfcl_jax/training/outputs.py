"""What a run writes besides its checkpoints: `metrics.csv`, `eval.csv`, TensorBoard scalars and a
progress bar; and `read_csv`, which reads the CSV files back.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from tfcl_jax.training.files import DiskFull, atomic_open, is_disk_full

METRICS_FILE = "metrics.csv"  #: the training metrics, one row per step, in the workdir
SECONDS = "seconds"  #: the metrics column of the training wall seconds from step 0, across resumes
EVAL_FILE = "eval.csv"  #: the evaluations, one row per evaluation, in the workdir
TENSORBOARD_DIR = "tensorboard"  #: TensorBoard's events files, in the workdir

_FLUSH_SECONDS = 120  # tensorboardX's own interval between two flushes of an events file


def read_csv(path: str) -> dict[str, np.ndarray]:
  """Columns of a metrics/eval CSV written by `train`, as float arrays (empty dict if absent).

  An empty cell (a column a resumed run no longer logs) reads as NaN.

  Examples:
    >>> import os, tempfile
    >>> from tfcl_jax.training import outputs
    >>> path = os.path.join(tempfile.mkdtemp(), outputs.METRICS_FILE)
    >>> with open(path, "w") as f:
    ...   _ = f.write("step,loss\\n1,0.5\\n2,\\n")
    >>> outputs.read_csv(path)
    {'step': array([1., 2.]), 'loss': array([0.5, nan])}
  """
  if not os.path.exists(path):
    return {}
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  if not rows:
    return {}
  return {key: np.asarray([float(row[key]) if row.get(key) not in ("", None) else np.nan
                           for row in rows]) for key in rows[0]}


def training_seconds(workdir: str) -> float:
  """A run's training wall seconds from step 0 to its last metrics row, summed over every
  process that trained it (a run resumed after a stop counts both parts): the `seconds` of the
  last row of `workdir/metrics.csv`; NaN without one.

  Examples:
    >>> import os, tempfile
    >>> from tfcl_jax.training import outputs
    >>> workdir = tempfile.mkdtemp()
    >>> with open(os.path.join(workdir, outputs.METRICS_FILE), "w") as f:
    ...   _ = f.write("step,loss,seconds\\n1,0.5,2.5\\n2,0.25,4.0\\n")
    >>> outputs.training_seconds(workdir)
    4.0
  """
  column = read_csv(os.path.join(workdir, METRICS_FILE)).get(SECONDS)
  return float(column[-1]) if column is not None and len(column) else float("nan")


class _CsvLog:
  """Appends rows to a CSV; on resume, drops rows past the restored step (they are redone)."""

  def __init__(self, path: str, *, keep_through_step: int):
    self.path = path
    self.fields: Sequence[str] | None = None
    self.enabled = jax.process_index() == 0
    self.last_kept: dict[str, str] | None = None  # the last row kept on resume
    if self.enabled and os.path.exists(path):
      with open(path, newline="") as f:
        reader = csv.DictReader(f)
        self.fields = reader.fieldnames
        rows = [row for row in reader if int(float(row["step"])) <= keep_through_step]
      self._rewrite(rows)
      self.last_kept = rows[-1] if rows else None

  def _text(self, rows, *, header: bool) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, self.fields or [], extrasaction="ignore")
    if header:
      writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()

  def _rewrite(self, rows):
    with atomic_open(self.path, "w", newline="") as f:  # a failure leaves the old file whole
      f.write(self._text(rows, header=bool(self.fields)))

  def write(self, rows: list[dict[str, float]]):
    if not self.enabled or not rows:
      return
    if self.fields is None:
      self.fields = list(rows[0])
      self._rewrite([])
    size = os.path.getsize(self.path)
    try:
      with open(self.path, "a", newline="") as f:
        f.write(self._text(rows, header=False))
    except OSError as error:
      # Cut a partial append back so that every row in the file is whole.
      with open(self.path, "r+b") as f:
        f.truncate(size)
      if is_disk_full(error):
        raise DiskFull.of(error, self.path, "the rows before are kept") from error
      raise


def _event_encoder() -> Callable[..., bytes] | None:
  """`encode(step=, tag=, value=, file_version=)`: one TFRecord of a TensorBoard event, built with
  `tensorboardX` when it is installed (optional, in no extra); else None."""
  try:
    # Generated protobuf classes are unknown to pyright even where tensorboardX is installed.
    from tensorboardX.proto.event_pb2 import Event  # noqa: PLC0415  # pyright: ignore[reportMissingImports, reportAttributeAccessIssue]
    from tensorboardX.record_writer import masked_crc32c  # noqa: PLC0415  # pyright: ignore[reportMissingImports]
    from tensorboardX.summary import scalar  # noqa: PLC0415  # pyright: ignore[reportMissingImports]
  except ImportError:
    return None

  def encode(*, step: int = 0, tag: str | None = None, value: float = 0.0,
             file_version: str | None = None) -> bytes:
    event = Event(wall_time=time.time(), step=step)
    if file_version is not None:
      event.file_version = file_version
    if tag is not None:
      event.summary.CopyFrom(scalar(tag, value))
    data = event.SerializeToString()
    length = struct.pack("<Q", len(data))
    return b"".join((length, struct.pack("<I", masked_crc32c(length)), data,
                     struct.pack("<I", masked_crc32c(data))))

  return encode


class _Summaries:
  """TensorBoard scalars in a new events file of `folder`, written on the calling thread.

  tensorboardX's `SummaryWriter` writes from a thread of its own, where a full disk ends the
  thread and the run then blocks on the writer's queue. Here a full disk raises `DiskFull`
  naming the events file, which is cut back to its last flush, as a CSV is to its last whole
  row. The file is flushed as tensorboardX flushes it: every two minutes and when it closes.
  """

  def __init__(self, folder: str, encode: Callable[..., bytes]):
    self.encode, self.flushed_at, self.size = encode, -float("inf"), 0
    stem = os.path.join(folder, f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}")
    self.path, copy = f"{stem}.{os.getpid()}", 0
    try:
      os.makedirs(folder, exist_ok=True)
      while os.path.exists(self.path):  # a resumed run in the same second: a file of its own
        copy += 1
        self.path = f"{stem}.{os.getpid()}.{copy}"
      self.file: io.BufferedWriter | None = open(self.path, "xb")
    except OSError as error:
      if is_disk_full(error):
        raise DiskFull.of(error, folder, "the files written before are whole") from error
      raise
    self._write([encode(file_version="brain.Event:2")])

  def scalars(self, prefix: str, rows: list[dict[str, float]]):
    """Each row's finite values; a NaN or infinite one (a value undefined for the run, e.g. a
    ratio over an empty set) is left to the CSV: TensorBoard draws no point for it and
    tensorboardX would warn at every row."""
    self._write([self.encode(step=int(row["step"]), tag=f"{prefix}/{name}", value=value)
                 for row in rows for name, value in row.items()
                 if math.isfinite(value)])

  def _write(self, records: list[bytes], *, flush: bool = False):
    if self.file is None:
      return
    try:
      for record in records:
        self.file.write(record)
      if flush or time.monotonic() - self.flushed_at >= _FLUSH_SECONDS:
        self.file.flush()
        self.flushed_at, self.size = time.monotonic(), self.file.tell()
    except OSError as error:
      self._cut_back()
      if is_disk_full(error):
        kept = "the summaries up to its last flush are kept"
        raise DiskFull.of(error, self.path, kept) from error
      raise

  def _cut_back(self):
    """Closes the file without what was not flushed, cut back to the last flushed event."""
    if self.file is not None:
      with contextlib.suppress(OSError):
        self.file.close()  # the unflushed part is dropped: the disk did not take it
      self.file = None
      with contextlib.suppress(OSError):
        os.truncate(self.path, self.size)

  def close(self):
    self._write([], flush=True)
    if self.file is not None:
      self.file.close()
      self.file = None


class _NoBar:
  """Stands in for a tqdm bar when progress is off (tqdm is an optional dependency)."""

  def update(self, n=1):
    del n

  def set_postfix(self, *args, **kwargs):
    del args, kwargs

  def close(self):
    pass


def _progress_bar(*, total: int, initial: int, desc: str, enabled: bool):
  if not enabled:
    return _NoBar()
  try:
    import tqdm.auto as tqdm  # noqa: PLC0415
  except ImportError as error:
    raise ImportError("progress=True needs tqdm: pip install 'tfcl_jax[experiments]' (or tqdm), "
                      "or pass progress=False.") from error
  return tqdm.tqdm(total=total, initial=initial, desc=desc, leave=True)  # a line per run


class Outputs:
  """A run's outputs: `metrics.csv`, `eval.csv`, TensorBoard scalars in `tensorboard/` (when
  `tensorboardX` is installed) and the progress bar. Only process 0 writes files.

  Rows past step `start` are dropped from the CSV files, so that a run resumed from the
  checkpoint of `start` writes them again. A full disk raises `DiskFull` naming the file; the
  rows and summaries written before stay whole. `metrics.write(rows)` and `evals.write(rows)`
  append rows (dicts with a `step`). Used as a context manager, it closes the files and the bar
  on exit; an error on the way out does not hide the one that ended the run.

  Args:
    workdir: the run's folder.
    start: the step the run starts from (0, or the restored checkpoint's).
    num_steps: the run's last step, for the progress bar.
    desc: the progress bar's label.
    progress: show a tqdm progress bar.
    files: other evaluation CSV files of the workdir (`evaluate(..., file=)`), kept as
      `eval.csv` is: rows past `start` dropped.

  Examples:
    >>> import os, tempfile
    >>> from tfcl_jax.training import outputs
    >>> workdir = tempfile.mkdtemp()
    >>> with outputs.Outputs(workdir, start=0, num_steps=2, desc="run", progress=False) as out:
    ...   out.metrics.write([{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}])
    ...   out.scalars("train", [{"step": 2, "loss": 0.25}])
    >>> outputs.read_csv(os.path.join(workdir, outputs.METRICS_FILE))["loss"]
    array([0.5 , 0.25])
  """

  def __init__(self, workdir: str, *, start: int, num_steps: int, desc: str, progress: bool,
               files: Sequence[str] = ()):
    self.metrics = _CsvLog(os.path.join(workdir, METRICS_FILE), keep_through_step=start)
    self.evals = _CsvLog(os.path.join(workdir, EVAL_FILE), keep_through_step=start)
    self.other_evals = {file: _CsvLog(os.path.join(workdir, file), keep_through_step=start)
                        for file in files}
    encode = _event_encoder() if jax.process_index() == 0 else None
    self.summaries = (None if encode is None else
                      _Summaries(os.path.join(workdir, TENSORBOARD_DIR), encode))
    self.bar = _progress_bar(total=num_steps, initial=start, desc=desc, enabled=progress)
    self.start = start

  def seconds_before(self) -> float:
    """Training seconds the run spent before `start` (the `seconds` of its `metrics.csv` row
    at `start`): 0 from step 0; NaN where that row or column is missing (a run begun before the
    column existed, or another process than 0, which keeps no files)."""
    if self.start == 0:
      return 0.0
    row = self.metrics.last_kept
    if row is None or int(float(row["step"])) != self.start or row.get(SECONDS) in ("", None):
      return float("nan")
    return float(row[SECONDS])

  def scalars(self, prefix: str, rows: list[dict[str, float]]):
    """Adds each row's finite values to TensorBoard as `<prefix>/<name>` at the row's `step`
    (a NaN or infinite value stays in the CSV only)."""
    if self.summaries is not None:
      self.summaries.scalars(prefix, rows)

  def evaluate(self, eval_fn: Callable[[Any], dict[str, float]] | None, state: Any,
               step_number: int, *, file: str = EVAL_FILE):
    """Writes `eval_fn(state)` (if given) as the row of `step_number` in `file` (`eval.csv`, or
    one of `files`) and as summaries `<file stem>/<name>`."""
    if eval_fn is None:
      return
    row = {"step": step_number, **{k: float(v) for k, v in eval_fn(state).items()}}
    (self.evals if file == EVAL_FILE else self.other_evals[file]).write([row])
    self.scalars(os.path.splitext(file)[0], [row])

  def __enter__(self) -> Outputs:
    return self

  def __exit__(self, exc_type, exc_value, traceback):
    self.bar.close()
    if self.summaries is not None:
      try:
        self.summaries.close()
      except OSError:
        if exc_type is None:  # else the error that ended the run is the one to report
          raise
