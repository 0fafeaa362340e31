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


def test_sync_generated_writes_what_changed_or_only_reports_it(tmp_path):
    """The generators' one ending: without --check a stale or missing file is written and a current one left alone;
    with --check nothing is written, the difference is shown, the command is named and the exit code is 1."""
    import io as stdio

    from mnist_helpers.io import sync_generated

    current, stale, missing = tmp_path / "a.md", tmp_path / "b.md", tmp_path / "sub" / "c.md"
    current.write_text("same\n")
    stale.write_text("old\n")
    files = [(current, "same\n"), (stale, "new\n"), (missing, "made\n")]
    out = stdio.StringIO()
    assert sync_generated(files, check=True, remake="make things", root=tmp_path, out=out) == 1
    report = out.getvalue()
    assert stale.read_text() == "old\n" and not missing.exists(), "--check writes nothing"
    assert "-old" in report and "+new" in report and report.count("run `make things`") == 2
    assert "a.md: already current" in report
    out = stdio.StringIO()
    assert sync_generated(files, check=False, remake="make things", root=tmp_path, out=out) == 0
    assert (stale.read_text(), missing.read_text(), current.read_text()) == ("new\n", "made\n", "same\n")
    assert "sub/c.md: regenerated" in out.getvalue()
    assert sync_generated(files, check=True, remake="make things", out=stdio.StringIO()) == 0
