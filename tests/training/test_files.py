"""`tfcl_jax.training.files`: a whole-file write replaces its file whole or not at all, a full
disk is one error naming the file, and the file gets the permissions `open` would give it."""

from __future__ import annotations

import errno
import os
import pickle
import re
import stat

import pytest

from tfcl_jax.training import files


def _write(path, text):
  with open(path, "w") as f:
    f.write(text)


def _read(path):
  with open(path) as f:
    return f.read()


def test_a_whole_write_replaces_the_file(tmp_path):
  path = tmp_path / "result.json"
  _write(path, "old")
  with files.atomic_open(str(path)) as f:
    f.write("new")
    assert _read(path) == "old"  # nothing shows before the write is whole
  assert _read(path) == "new"
  assert os.listdir(tmp_path) == ["result.json"]


@pytest.mark.parametrize("error", [RuntimeError("bug"), KeyboardInterrupt()])
def test_an_error_mid_write_leaves_the_old_file_and_no_temporary(tmp_path, error):
  path = tmp_path / "result.json"
  _write(path, "old")
  with pytest.raises(type(error)), files.atomic_open(str(path)) as f:
    f.write("half of the new")
    raise error
  assert _read(path) == "old"
  assert os.listdir(tmp_path) == ["result.json"]


def test_an_error_mid_write_of_a_new_file_leaves_nothing(tmp_path):
  with pytest.raises(RuntimeError), files.atomic_open(str(tmp_path / "new.csv")) as f:
    f.write("a,b\n")
    raise RuntimeError
  assert os.listdir(tmp_path) == []


def test_open_arguments_pass_through(tmp_path):
  path = tmp_path / "rows.csv"
  with files.atomic_open(str(path), "w", newline="") as f:
    f.write("a\r\nb\n")  # newline="": written as given
  assert path.read_bytes() == b"a\r\nb\n"
  with files.atomic_open(str(path), "wb") as f:
    f.write(b"\x00\x01")
  assert path.read_bytes() == b"\x00\x01"


@pytest.mark.parametrize("mode", ["a", "r", "x", "r+"])
def test_a_mode_that_does_not_write_a_whole_file_is_refused(tmp_path, mode):
  with pytest.raises(ValueError, match=re.escape(f"mode must start with 'w', got '{mode}'")):
    with files.atomic_open(str(tmp_path / "f"), mode):
      pass
  assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_raises_disk_full_naming_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
  path = tmp_path / "results.csv"
  _write(path, "old")
  real_open = os.open

  def open_on_a_full_disk(name, flags, mode=0o777):
    os.close(real_open(name, flags, mode))  # the temporary file exists, as on a real disk
    return real_open("/dev/full", os.O_WRONLY)  # every write: ENOSPC from the kernel

  monkeypatch.setattr(os, "open", open_on_a_full_disk)
  with pytest.raises(files.DiskFull) as raised, files.atomic_open(str(path)) as f:
    f.write("new rows\n" * 10_000)  # more than a buffer: the kernel refuses it
  monkeypatch.undo()
  assert raised.value.filename == str(path) and raised.value.errno == errno.ENOSPC
  assert isinstance(raised.value.__cause__, OSError)
  assert raised.value.__cause__.errno == errno.ENOSPC
  assert str(raised.value) == (f"no space left to write {path} (No space left on device); the "
                               f"file is as it was. Free space and rerun to resume.")
  assert _read(path) == "old"
  assert os.listdir(tmp_path) == ["results.csv"]


def test_a_full_quota_on_the_sync_raises_disk_full_with_its_errno(tmp_path, monkeypatch):
  path = tmp_path / "result.json"
  _write(path, "old")

  def fsync_over_quota(handle):
    del handle
    raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

  monkeypatch.setattr(os, "fsync", fsync_over_quota)
  with pytest.raises(files.DiskFull, match="Disk quota exceeded") as raised:
    with files.atomic_open(str(path)) as f:
      f.write("new")
  monkeypatch.undo()
  assert raised.value.errno == errno.EDQUOT and raised.value.filename == str(path)
  assert _read(path) == "old"
  assert os.listdir(tmp_path) == ["result.json"]


def test_a_full_disk_on_the_file_object_write_keeps_the_old_file(tmp_path, monkeypatch):
  path = tmp_path / "result.json"
  _write(path, "old")
  real_fdopen = os.fdopen

  class FullDisk:
    def __init__(self, file):
      self.file = file

    def write(self, text):
      self.file.write(text[:len(text) // 2])
      self.file.flush()
      raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
      return getattr(self.file, name)

    def __enter__(self):
      return self

    def __exit__(self, *exc_info):
      self.file.close()

  monkeypatch.setattr(os, "fdopen", lambda *args, **kwargs: FullDisk(real_fdopen(*args, **kwargs)))
  with pytest.raises(files.DiskFull) as raised, files.atomic_open(str(path)) as f:
    f.write('{"top1": 0.9}')
  assert raised.value.filename == str(path)
  assert _read(path) == "old"
  assert os.listdir(tmp_path) == ["result.json"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_permissions_are_those_open_gives_a_new_file(tmp_path, umask):
  previous = os.umask(umask)
  try:
    with open(tmp_path / "by_open", "w") as f:
      f.write("x")
    with files.atomic_open(str(tmp_path / "by_atomic_open")) as f:
      f.write("x")
  finally:
    os.umask(previous)
  modes = [stat.S_IMODE(os.stat(tmp_path / name).st_mode) for name in ("by_open", "by_atomic_open")]
  assert modes[0] == 0o666 & ~umask
  assert modes[1] == modes[0]


def test_disk_full_is_an_os_error_naming_the_path():
  error = files.DiskFull("w/results.csv")
  assert isinstance(error, OSError) and error.errno == errno.ENOSPC
  assert error.filename == error.path == "w/results.csv"
  assert str(error).startswith("no space left to write w/results.csv (")
  copy = pickle.loads(pickle.dumps(files.DiskFull("m.csv", "the rows before are kept",
                                                  errno.EDQUOT)))
  assert (copy.path, copy.kept, copy.errno, str(copy)) == (
      "m.csv", "the rows before are kept", errno.EDQUOT,
      "no space left to write m.csv (Disk quota exceeded); the rows before are kept. Free space "
      "and rerun to resume.")


def test_disk_full_of_an_error_keeps_its_errno_or_reads_enospc():
  assert files.DiskFull.of(OSError(errno.EDQUOT, "quota"), "f").errno == errno.EDQUOT
  assert files.DiskFull.of(ValueError("No space left on device"), "f").errno == errno.ENOSPC


def test_is_disk_full_follows_the_errors_an_error_was_raised_from():
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device")
    except OSError as error:
      raise ValueError("tensorstore: write failed") from error
  except ValueError as error:
    assert files.is_disk_full(error)
  assert files.is_disk_full(RuntimeError("Disk quota exceeded"))
  assert not files.is_disk_full(OSError(errno.EACCES, "Permission denied"))
  assert not files.is_disk_full(None)
