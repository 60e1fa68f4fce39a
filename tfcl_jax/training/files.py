"""Whole-or-nothing file writes and the one error of a full disk, for every file a run writes:
`atomic_open` replaces a file only once its new text is on disk; `DiskFull` names what did not fit.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from typing import IO, Any

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  #: errnos of a full disk or an exhausted quota


class DiskFull(OSError):
  """A write found no space on its device (`ENOSPC`) or no quota left (`EDQUOT`).

  An `OSError` with the device's `errno` and `strerror`; `filename` (also `path`) is the file or
  folder being written, never a temporary one. The message names the path, says what stayed
  whole and says to free space and rerun. `DiskFull.of(error, path)` makes one from the error
  that `is_disk_full` recognised.

  Args:
    path: the file or folder being written.
    kept: what stayed whole, a clause of the message.
    code: `ENOSPC` (no space) or `EDQUOT` (no quota).

  Examples:
    >>> import errno
    >>> from tfcl_jax.training import files
    >>> error = files.DiskFull("run/metrics.csv", "the rows before are kept")
    >>> print(error)  # doctest: +NORMALIZE_WHITESPACE
    no space left to write run/metrics.csv (No space left on device); the rows before are kept.
    Free space and rerun to resume.
    >>> error.errno == errno.ENOSPC, error.filename
    (True, 'run/metrics.csv')
  """

  def __init__(self, path: str, kept: str = "the file is as it was",
               code: int = errno.ENOSPC):
    super().__init__(code, os.strerror(code), path)
    self.path, self.kept = path, kept

  @classmethod
  def of(cls, error: BaseException, path: str, kept: str = "the file is as it was") -> DiskFull:
    """The `DiskFull` of `error` (one that `is_disk_full`) met writing `path`, with the error's
    errno when it is one of `DISK_FULL`, else `ENOSPC`."""
    code = getattr(error, "errno", None)
    return cls(path, kept, code if code in DISK_FULL else errno.ENOSPC)

  def __str__(self) -> str:
    return (f"no space left to write {self.filename} ({self.strerror}); {self.kept}. "
            "Free space and rerun to resume.")

  def __reduce__(self):
    return type(self), (self.path, self.kept, self.errno)


def is_disk_full(error: BaseException | None) -> bool:
  """Whether `error`, or an exception it was raised from or during, is a full disk or quota.

  Orbax and tensorstore re-raise the `OSError` as another type that keeps only its text, so the
  text ("No space left on device", "Disk quota exceeded") counts too.

  Examples:
    >>> import errno
    >>> from tfcl_jax.training import files
    >>> files.is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    True
    >>> files.is_disk_full(ValueError("tensorstore: [Errno 28] No space left on device"))
    True
    >>> files.is_disk_full(OSError(errno.EACCES, "Permission denied"))
    False
  """
  while error is not None:
    if isinstance(error, OSError) and error.errno in DISK_FULL:
      return True
    if any(text in str(error) for text in ("No space left on device", "Disk quota exceeded")):
      return True
    error = error.__cause__ or error.__context__
  return False


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
  """`open(path, mode, **kwargs)` for a whole-file write that replaces `path` only once the new
  file is whole on disk.

  The file is written to a temporary file in the same folder (so that the rename stays on one
  device), with the permissions `open` gives a new file (0o666 less the umask), then flushed,
  `fsync`ed and `os.replace`d over `path`; the folder is synced after. A kill or an error at any
  point leaves `path` as it was (or absent), never cut short, and removes the temporary file.

  Raises:
    DiskFull: the disk or quota is full (`ENOSPC`, `EDQUOT`), naming `path`; `path` is as it was.
    ValueError: `mode` is not a write mode (`"w"`, `"wb"`, `"w+"`, ...).

  Examples:
    >>> import os, tempfile
    >>> from tfcl_jax.training import files
    >>> path = os.path.join(tempfile.mkdtemp(), "result.json")
    >>> with files.atomic_open(path) as f:
    ...   _ = f.write('{"top1": 0.9}')
    >>> try:
    ...   with files.atomic_open(path) as f:
    ...     _ = f.write('{"top1": ')
    ...     raise KeyboardInterrupt  # a kill mid-write
    ... except KeyboardInterrupt:
    ...   pass
    >>> open(path).read(), sorted(os.listdir(os.path.dirname(path)))
    ('{"top1": 0.9}', ['result.json'])
  """
  if not mode.startswith("w"):
    raise ValueError(f"atomic_open writes a whole file: mode must start with 'w', got {mode!r}.")
  folder, name = os.path.split(os.path.abspath(path))
  temporary = os.path.join(folder, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
  try:
    # Not tempfile.mkstemp: its 0o600 would outlive the rename; 0o666 less the umask is open()'s.
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
  except OSError as error:
    if is_disk_full(error):
      raise DiskFull.of(error, path) from error
    raise
  try:
    try:
      file = os.fdopen(handle, mode, **kwargs)
    except BaseException:
      os.close(handle)
      raise
    with file:
      yield file
      file.flush()
      os.fsync(file.fileno())
    os.replace(temporary, path)
  except BaseException as error:
    with contextlib.suppress(OSError):
      os.remove(temporary)
    if is_disk_full(error) and not isinstance(error, DiskFull):  # one raised inside names its file
      raise DiskFull.of(error, path) from error
    raise
  _sync_folder(folder)


def _sync_folder(folder: str) -> None:
  """Makes a rename in `folder` durable; a file system that cannot sync a folder is left be."""
  with contextlib.suppress(OSError):
    handle = os.open(folder, os.O_RDONLY)
    try:
      os.fsync(handle)
    finally:
      os.close(handle)
