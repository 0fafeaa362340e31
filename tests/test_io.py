"""The one atomic writer: results and snapshots survive a crash mid-write."""
import json

import pytest
import torch

from mnist_helpers import io


def test_write_json_is_atomic_and_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    out = io.write_json(tmp_path / "new" / "r.json", {"acc": 0.99, "path": tmp_path})
    assert json.loads(out.read_text()) == {"acc": 0.99, "path": str(tmp_path)}  # folder made, Paths as text

    def crash(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(io.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        io.write_json(out, {"acc": 0.5})
    assert json.loads(out.read_text())["acc"] == 0.99          # the previous result survives a failed write
    assert [p.name for p in out.parent.iterdir()] == ["r.json"]  # and no temporary file is left behind


def test_atomic_save_round_trips_and_never_leaves_a_torn_snapshot(tmp_path, monkeypatch):
    path = tmp_path / "snap.pt"
    io.atomic_save({"epoch": 1, "w": torch.arange(4.0)}, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded["epoch"] == 1 and torch.equal(loaded["w"], torch.arange(4.0))

    def crash(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(io.os, "replace", crash)
    with pytest.raises(OSError):
        io.atomic_save({"epoch": 2}, path)
    assert torch.load(path, weights_only=True)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["snap.pt"]
