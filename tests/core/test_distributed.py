"""The foundation's distributed guarantees, with real torchrun launches (gloo on CPU)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mnist_helpers.launch import LaunchError, torchrun

HERE = Path(__file__).resolve().parents[1]  # tests/
pytestmark = pytest.mark.process


def test_two_process_ddp_leaves_identical_parameters(mnist_root, tmp_path):
    res = torchrun("mnist_helpers.workers.progression.ddp_train",
                   ["--model", "fastnet", "--subset", "2048", "--batch-size", "64", "--max-steps", "12"],
                   nproc=2, timeout=180, echo=False)
    assert res["world_size"] == 2 and res["backend"] == "gloo"
    digests = res["param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    (row,) = res["history"]
    assert row["steps"] == 12 and row["images"] == 2 * 12 * 64 and row["test_count"] == 10000


def test_exact_evaluation_world_size_3_counts_every_image_once(mnist_root, tmp_path):
    res = torchrun(str(HERE / "dist_workers" / "eval_exact.py"), [], nproc=3, timeout=180, echo=False)
    assert res["world_size"] == 3
    assert res["exact"]["count"] == 10000
    assert res["exact"]["correct"] == res["single"]["correct"]  # equals the one-process accuracy exactly
    assert res["exact"]["acc"] == res["single"]["acc"]
    assert res["padded_count"] == 10002  # DistributedSampler pads 10,000 up to 3 x 3,334


def test_worker_runs_alone_without_torchrun(mnist_root, tmp_path):
    out = tmp_path / "alone.json"
    proc = subprocess.run([sys.executable, "-m", "mnist_helpers.workers.progression.ddp_train", "--model", "fastnet",
                           "--subset", "1024", "--max-steps", "4", "--out", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    assert res["world_size"] == 1 and res["backend"] is None and res["history"][0]["steps"] == 4


def test_snapshot_is_atomic_and_resumes(mnist_root, tmp_path):
    snap = tmp_path / "snap.pt"
    args = ["--model", "fastnet", "--subset", "1024", "--snapshot", str(snap)]
    first = torchrun("mnist_helpers.workers.progression.ddp_train", args + ["--epochs", "1"], nproc=2, timeout=180, echo=False)
    assert snap.exists() and not list(tmp_path.glob(".*.tmp*"))
    second = torchrun("mnist_helpers.workers.progression.ddp_train", args + ["--epochs", "2"], nproc=2, timeout=180, echo=False)
    assert [h["epoch"] for h in second["history"]] == [1, 2]
    assert second["history"][0] == first["history"][0]  # epoch 1 came from the snapshot, not re-run


def test_bad_flag_is_a_clear_launch_error(mnist_root):
    with pytest.raises(LaunchError) as err:
        torchrun("mnist_helpers.workers.progression.ddp_train", ["--batch-size", "0"], nproc=1, timeout=120, echo=False)
    assert "batch_size must be a positive integer, got 0" in str(err.value)
