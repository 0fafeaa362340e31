"""Writing files so that nothing is lost (introduced in 00_setup_and_data; every worker and script uses it).

One atomic writer for the whole series: ``atomic_write(path, bytes)`` (tmp file in the same folder,
fsync, rename, fsync of the folder), ``write_json(path, obj)`` for every results file and
``atomic_save(obj, path)`` for every ``torch.save`` snapshot. A run killed mid-write leaves the previous
file or none, never a truncated one that the next notebook cell fails to parse.
``check_writable(path, flag)`` is called by every command before it trains: a run never trains for an
hour and then fails to write its results. ``sync_generated(files, check=..., remake=...)`` is the one ending of every
generator (`make claims`, `make tables`, `make saved`, `make exercises`): write what changed, or with ``--check`` write
nothing, show the difference and exit 1.
"""
from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

from mnist_helpers.errors import PathError

MiB = 2**20


@contextlib.contextmanager
def file_lock(fd: int):
    """Hold an exclusive lock on an open file (its descriptor) for the ``with`` block: ``fcntl.flock`` on Linux and
    macOS, ``msvcrt.locking`` of the first byte on Windows (which has no ``fcntl``)."""
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_LOCK, 1)  # retries for ~10 s, then raises OSError
        try:
            yield
        finally:
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        return
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable (a crash right after it must not undo it). Not every OS can open a folder."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path, data: bytes) -> Path:
    """tmp + fsync + rename: a reader never sees a half-written file, a crash never leaves one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; data and results are for every user of the machine
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def write_json(path, obj, indent: int | None = 1) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically, creating its folder; returns the path."""
    return atomic_write(path, json.dumps(obj, indent=indent, default=str).encode())


def atomic_save(obj, path) -> Path:
    """``torch.save(obj)`` to ``path`` atomically: a crash mid-write never leaves a torn snapshot."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return atomic_write(path, buf.getvalue())


def check_writable(path, flag: str = "--out") -> Path:
    """Raise PathError now, naming ``flag`` and the fix, if ``path`` could not be written later.

    ``path`` must name a file (not a folder) whose folder exists or can be created, and a file can be
    created in that folder (tried for real: permission bits do not stop root, ``/proc`` or a full disk
    do). The folder is created here, as the writer would; nothing else is left behind.
    """
    path = Path(path).expanduser()
    example = f"{flag} results/{path.name or 'out'}"
    if path.is_dir():
        raise PathError(f"{flag} {path} is a folder; it must name a file", f"name a file, e.g. {flag} {path / 'run.json'}")
    folder = path.absolute().parent
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise PathError(f"{flag} {path} cannot be created: {existing} is a file, not a folder",
                        f"point {flag} into a folder, e.g. {example}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix="." + path.name + ".", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise PathError(f"{flag} {path} cannot be written: {e.strerror or e} (in {folder})",
                        f"point {flag} at a folder you can write, e.g. {example}") from None
    return path


def sync_generated(files, *, check: bool, remake: str, root=None, out=None) -> int:
    """Bring generated files up to date, or (``check``) only say which are not.

    ``files``: ``(path, text)`` pairs, the text each file should hold. A file whose text differs is written
    atomically (``--check``: not written; its difference is shown and ``remake``, the command that regenerates it,
    is named). Paths are printed relative to ``root`` when under it. Returns the exit code: 1 if ``check`` found a
    stale file, else 0."""
    out = out or sys.stdout
    stale = 0
    for path, text in files:
        path = Path(path)
        old = path.read_text(encoding="utf-8") if path.is_file() else ""
        name = str(path.relative_to(root)) if root and path.is_relative_to(root) else path.name
        if old == text:
            print(f"{name}: already current", file=out)
        elif check:
            stale += 1
            out.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True), name,
                                                f"{name} (generated)", n=0))
            print(f"{name} is not current: run `{remake}`", file=out)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, text.encode("utf-8"))
            print(f"{name}: regenerated ({text.count(chr(10)) - old.count(chr(10)):+d} lines)", file=out)
    return 1 if stale else 0
