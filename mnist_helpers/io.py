"""Writing files so that nothing is lost (introduced in 00_setup_and_data; every worker and script uses it).

One atomic writer for the whole series: ``atomic_write(path, bytes)`` (tmp file in the same folder,
fsync, rename, fsync of the folder), ``write_json(path, obj)`` for every results file and
``atomic_save(obj, path)`` for every ``torch.save`` snapshot. A run killed mid-write leaves the previous
file or none, never a truncated one that the next notebook cell fails to parse.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

MiB = 2**20


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
