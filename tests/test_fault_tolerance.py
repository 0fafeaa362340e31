"""Fault tolerance: step snapshots, exact mid-epoch resume, kill -9 under torchrun --max-restarts."""

import pytest
import torch

from mnist_helpers.launch import build_command, torchrun
from mnist_helpers.train import TrainConfig
from mnist_helpers.workers.progression import ft_train

pytestmark = pytest.mark.timeout(240)

CFG = dict(model="fastnet", subset=512, batch_size=64, num_epochs=2, threads=1)  # 8 steps per epoch


class Crash(RuntimeError):
    pass


def test_resume_mid_epoch_is_bit_identical(tmp_path, mnist_root, monkeypatch):
    """A run that crashes after step 11 and resumes from the step-10 snapshot (2 steps into epoch 2)
    ends with exactly the weights of an uninterrupted run: model, optimizer, scheduler, RNG and the
    sampler position all came back."""
    cfg = TrainConfig(**CFG, scheduler="onecycle", optimizer="sgd", lr=0.05)
    full = ft_train.main(cfg, snapshot=str(tmp_path / "a.pt"), snapshot_every=5, test_subset=500)

    real_after_step = ft_train.FaultTolerantTrainer._after_step

    def crash_after_11(self, counted, loss):
        real_after_step(self, counted, loss)
        if self.steps_run == 11:
            raise Crash("simulated crash")

    snap = tmp_path / "b.pt"
    monkeypatch.setattr(ft_train.FaultTolerantTrainer, "_after_step", crash_after_11)
    with pytest.raises(Crash):
        ft_train.main(cfg, snapshot=str(snap), snapshot_every=5, test_subset=500)
    saved = torch.load(snap, weights_only=True)
    assert (saved["epoch"], saved["steps"], saved["step_in_epoch"]) == (1, 10, 2)
    assert not list(tmp_path.glob(".b.pt.tmp*")), "atomic_save left a temp file"
    monkeypatch.setattr(ft_train.FaultTolerantTrainer, "_after_step", real_after_step)
    resumed = ft_train.main(cfg, snapshot=str(snap), snapshot_every=5, test_subset=500)
    assert resumed["resumed_at_step"] == 10 and resumed["steps"] == full["steps"] == 16
    assert resumed["param_digests"] == full["param_digests"]
    assert resumed["history"][-1]["train_loss"] == pytest.approx(full["history"][-1]["train_loss"], rel=1e-6)
    assert resumed["final_test_acc"] == full["final_test_acc"]


def test_cli_rejects_kill_without_snapshot(capsys):
    with pytest.raises(SystemExit):
        ft_train.cli(["--die-at-step", "3"])
    assert "--die-at-step needs --snapshot" in capsys.readouterr().err


def test_launcher_sets_store_variable_only_for_restarts(monkeypatch):
    """torchrun(max_restarts>0) must add TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (restarts often fail without it on
    torch 2.14: tests/test_restarts.py measures how often); the command line itself is unchanged."""
    assert "--max-restarts" in build_command("m", max_restarts=2)
    seen = {}

    def fake_run(command, env, timeout, echo, cleanup=None):
        seen.update(env)
        return [], 0

    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    monkeypatch.setattr("mnist_helpers.launch._run", fake_run)
    torchrun("m", nproc=1, provision=False, device="cpu", echo=False, max_restarts=1)
    assert seen["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    seen.clear()
    torchrun("m", nproc=1, provision=False, device="cpu", echo=False)
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in seen
    seen.clear()
    torchrun("m", nproc=1, provision=False, device="cpu", echo=False, max_restarts=1,
             env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"})  # the caller's choice wins
    assert seen["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"


def test_kill_9_worker_restarts_and_matches_uninterrupted(tmp_path, mnist_root):
    """Rank 1 is SIGKILLed after step 5 of 8 (mid-epoch, snapshot at step 3); torchrun --max-restarts
    restarts the group, which resumes there and ends within 0.3 points of an uninterrupted run.
    (tests/test_multinode.py does the same with two agents at a c10d rendezvous.)"""
    args = ["--model", "fastnet", "--subset", "1024", "--batch-size", "64", "--epochs", "1",
            "--snapshot-every", "3", "--timeout", "60", "--test-subset", "1000"]  # 8 steps per rank
    kw = dict(nproc=2, threads_per_proc=1, device="cpu", timeout=150, echo=False)
    ref = torchrun("mnist_helpers.workers.progression.ft_train", args, **kw)
    killed = torchrun("mnist_helpers.workers.progression.ft_train", [*args, "--snapshot", tmp_path / "ft.pt", "--die-at-step", "5"],
                      max_restarts=2, **kw)
    assert ref["resumed_at_step"] is None
    assert killed["resumed_at_step"] == 3, killed  # the last snapshot before the kill
    assert killed["steps"] == ref["steps"] == 8
    assert abs(killed["final_test_acc"] - ref["final_test_acc"]) <= 0.003
    assert len(set(killed["param_digests"])) == 1  # the replicas still agree after the restart
