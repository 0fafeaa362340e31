"""Resuming from a snapshot (issue 38): loaded onto the CPU whatever the device, OneCycle's horizon checked, and
the ranks of a multi-node run agreeing on the file before any of them loads it.

The single-process tests run ``ddp_train`` in this process (a world of one); the two-process ones launch
``ddp_train`` and ``ft_train`` under torchrun (gloo), each rank with a snapshot folder of its own
(``tests/dist_workers/own_disk.py``), as on nodes that share no filesystem.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from mnist_helpers.distributed import DistContext
from mnist_helpers.errors import SnapshotError
from mnist_helpers.launch import LaunchError, torchrun
from mnist_helpers.train import TrainConfig, check_run, load_snapshot
from mnist_helpers.workers.progression import ddp_train

HERE = Path(__file__).resolve().parents[1]  # tests/
pytestmark = pytest.mark.timeout(300)

CFG = dict(model="fastnet", subset=256, batch_size=64, threads=1)  # 4 steps per epoch


def _cfg(mnist_root, **changes) -> TrainConfig:
    return TrainConfig(**CFG, data_root=str(mnist_root)).replace(**changes)


def _losses(run: dict) -> list:
    return [(h["epoch"], h["steps"], h["train_loss"], h["test_loss"], h["test_acc"]) for h in run["history"]]


def test_resume_with_more_epochs_equals_an_uninterrupted_run(tmp_path, mnist_root):
    """Constant learning rate: 1 epoch, then the same command with --epochs 2 resumes there, and ends bit for bit
    where an uninterrupted 2-epoch run ends (model, optimizer and RNG states came back)."""
    full = ddp_train.main(_cfg(mnist_root, num_epochs=2))
    snap = tmp_path / "s.pt"
    first = ddp_train.main(_cfg(mnist_root, num_epochs=1), snapshot=str(snap))
    resumed = ddp_train.main(_cfg(mnist_root, num_epochs=2), snapshot=str(snap))
    assert _losses(resumed)[0] == _losses(first)[0]  # epoch 1 came from the snapshot
    assert _losses(resumed) == _losses(full)
    assert resumed["param_digests"] == full["param_digests"]


def test_a_snapshot_loads_onto_the_cpu_whatever_the_device(tmp_path, mnist_root):
    """The RNG state must come back as a CPU ByteTensor (torch.set_rng_state takes nothing else), and the model and
    optimizer state end on the parameters' device. Loading onto the training device broke every resume on a GPU.
    Without a GPU the trainer is told its device is cuda (the model stays on the CPU): the old code then asked
    torch.load for cuda and failed; with a GPU this is the real thing."""
    snap = tmp_path / "s.pt"
    ddp_train.main(_cfg(mnist_root, num_epochs=1), snapshot=str(snap))
    saved = torch.load(snap, weights_only=True)
    cfg = _cfg(mnist_root, num_epochs=2)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batches = ddp_train.prepare_batches(cfg, device, 0, 1)
    tr, test_set = ddp_train.load_train_objs(cfg, device, steps_per_epoch=len(batches))
    if device.type == "cpu":
        tr = dataclasses.replace(tr, device=torch.device("cuda"))
    torch.manual_seed(12345)  # a state the resume must replace

    trainer = ddp_train.Trainer(cfg, tr, batches, test_set, snap, DistContext(0, 0, 1, None, device))

    assert trainer.epochs_run == 1 and trainer.steps_run == 4
    state = torch.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    assert torch.equal(state, saved["rng"]["torch"])
    for name, p in trainer.module.named_parameters():
        assert torch.equal(p.detach().cpu(), saved["model"][name])
        for key, value in tr.optimizer.state[p].items():
            if torch.is_tensor(value) and key != "step":  # Adam keeps its step count on the CPU by design
                assert value.device == p.device, (name, key)
    loaded = load_snapshot(snap, cfg, 1)
    assert all(t.device.type == "cpu" for t in loaded["model"].values())
    assert loaded["rng"]["torch"].device.type == "cpu" and loaded["rng"]["torch"].dtype == torch.uint8


@pytest.mark.parametrize("changes, needles", [
    ({"num_epochs": 2}, ["num_epochs: snapshot 1, this run 2", "--epochs 1"]),
    ({"max_steps": 12}, ["max_steps: snapshot 6, this run 12", "--max-steps 6"]),
], ids=["more_epochs", "more_steps"])
def test_onecycle_refuses_a_longer_horizon_with_the_fix(tmp_path, mnist_root, changes, needles):
    """OneCycle's schedule is fixed at the start (total_steps) and its saved state keeps it: resuming with a longer
    horizon used to crash deep in torch ("Tried to step 9 times..."). Now the check before training (check_run) and
    the worker itself refuse, naming the setting, the schedule and what to do."""
    saved = dict(num_epochs=1, max_steps=6) if "max_steps" in changes else dict(num_epochs=1)
    # 512 images: 8 steps per epoch (OneCycleLR divides by zero at total_steps=4 with pct_start=0.25)
    cfg = _cfg(mnist_root, subset=512, scheduler="onecycle", optimizer="sgd", lr=0.05, **saved)
    snap = tmp_path / "one.pt"
    first = ddp_train.main(cfg, snapshot=str(snap))
    longer = cfg.replace(**{**changes, "num_epochs": 2})
    for attempt in (lambda: check_run(longer, 1, snapshot=str(snap)), lambda: ddp_train.main(longer, snapshot=str(snap))):
        with pytest.raises(SnapshotError) as err:
            attempt()
        text = str(err.value)
        for needle in [*needles, "other settings", "onecycle learning-rate schedule spans the whole run",
                       "point --snapshot at another file", f"rm {snap}", "--scheduler none"]:
            assert needle in text, (needle, text)
    # the same horizon still resumes (at its end here: nothing left to train); a constant learning rate may train
    # on with more epochs (test_resume_with_more_epochs_equals_an_uninterrupted_run)
    assert ddp_train.main(cfg, snapshot=str(snap))["history"] == first["history"]


def test_a_scheduler_change_is_named_once(tmp_path, mnist_root):
    """A snapshot without a schedule, resumed with onecycle: the scheduler differs, which says it all (no horizon)."""
    cfg = _cfg(mnist_root, num_epochs=1)
    snap = tmp_path / "s.pt"
    ddp_train.main(cfg, snapshot=str(snap))
    with pytest.raises(SnapshotError) as err:
        load_snapshot(snap, cfg.replace(scheduler="onecycle", num_epochs=3))
    assert "scheduler: snapshot 'none', this run 'onecycle'" in str(err.value)
    assert "num_epochs" not in str(err.value)


def test_agreement_alone_and_the_message_for_ranks_that_disagree(tmp_path, mnist_root):
    """A world of one agrees with itself; ranks that see different files get one message naming who sees what."""
    from mnist_helpers.distributed import agree_on_snapshot, snapshot_disagreement
    from mnist_helpers.train import snapshot_seen

    snap = tmp_path / "s.pt"
    assert agree_on_snapshot(snap) is False
    ddp_train.main(_cfg(mnist_root, num_epochs=1), snapshot=str(snap))
    assert agree_on_snapshot(snap) is True
    seen = snapshot_seen(snap)
    assert seen[0] == 4
    (tmp_path / "junk.pt").write_bytes(b"junk")
    assert snapshot_seen(tmp_path / "junk.pt")[0] == -1
    err = snapshot_disagreement(snap, [seen, None, None, (2, "0123456789abcdef")])
    text = str(err)
    assert isinstance(err, SnapshotError)
    assert f"rank 0: a snapshot of step 4 (sha256 {seen[1]})" in text
    assert "ranks 1, 2: no file" in text and "rank 3: a snapshot of step 2" in text
    assert "put --snapshot on a filesystem every node shares" in text


def test_ranks_resume_only_when_every_rank_sees_the_same_snapshot(monkeypatch, tmp_path):
    """agree_on_snapshot decides from every rank's view, not rank 0's: all see the same file -> resume; none sees one
    -> start afresh; anything else (one rank sees no file, or another file) -> the same SnapshotError on every rank.
    The views come from all_gather_object; here they are given, as a world of four would gather them."""
    from mnist_helpers import distributed

    snap = tmp_path / "s.pt"
    same, other = (4, "0123456789abcdef"), (2, "fedcba9876543210")
    cases = [([same] * 4, True), ([None] * 4, False), ([same, None, same, same], None), ([None, same, None, None], None),
             ([same, same, other, same], None)]
    for views, expected in cases:
        monkeypatch.setattr(distributed, "gather_objects", lambda obj, views=views: list(views))
        if expected is None:
            with pytest.raises(SnapshotError, match="not the same file on every rank"):
                distributed.agree_on_snapshot(snap)
        else:
            assert distributed.agree_on_snapshot(snap) is expected, views


@pytest.mark.process
@pytest.mark.parametrize("module", ["ddp_train", "ft_train"])
def test_nodes_without_a_shared_filesystem_stop_with_the_fix(tmp_path, mnist_root, module):
    """Two ranks, each with a snapshot folder of its own: rank 0 saves where rank 1 cannot see. Resumed, the ranks
    used to split (rank 0 resuming at epoch 2, rank 1 starting afresh: mismatched collectives, a hang or wrong
    training); now every rank stops with the same SnapshotError, naming who sees what and the fix."""
    worker = str(HERE / "dist_workers" / "own_disk.py")
    snap = str(tmp_path / "node{rank}" / "snap.pt")
    args = ["mnist_helpers.workers.progression." + module, "--model", "fastnet", "--subset", "256",
            "--batch-size", "64", "--snapshot", snap, "--timeout", "30"]
    if module == "ft_train":
        args += ["--test-subset", "500"]
    kw = dict(nproc=2, timeout=150, echo=False, device="cpu")
    first = torchrun(worker, [*args, "--epochs", "1"], **kw)
    assert first["history"][0]["epoch"] == 1
    assert (tmp_path / "node0" / "snap.pt").exists() and not (tmp_path / "node1" / "snap.pt").exists()
    with pytest.raises(LaunchError) as err:
        torchrun(worker, [*args, "--epochs", "2"], **kw)
    text = str(err.value)
    for needle in ["is not the same file on every rank", "rank 0: a snapshot of step 2", "rank 1: no file",
                   "put --snapshot on a filesystem every node shares"]:
        assert needle in text, (needle, text[-3000:])
