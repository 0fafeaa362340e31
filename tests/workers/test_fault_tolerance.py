"""Fault tolerance: step snapshots, exact mid-epoch resume, kill -9 under torchrun --max-restarts."""

import pytest
import torch

from mnist_helpers.launch import LaunchOptions, build_command, torchrun
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


@pytest.mark.parametrize("check_every", [5, 8])  # mid-epoch; the last step of epoch 1
def test_stop_file_snapshots_that_step_and_the_resume_loses_nothing(tmp_path, mnist_root, check_every):
    """A stop file (what scripts/slurm/train.sbatch creates on the scheduler's signal) ends the run after the first
    check that sees it, with a snapshot of that very step although no periodic one is due; once the file is gone the
    same call resumes there and ends with exactly the weights of an uninterrupted run."""
    cfg = TrainConfig(**CFG, scheduler="onecycle", optimizer="sgd", lr=0.05)
    full = ft_train.main(cfg, test_subset=500)
    snap, stop = tmp_path / "ft.pt", tmp_path / "ft.stop"
    stop.touch()
    kw = dict(snapshot=str(snap), snapshot_every=100, test_subset=500, stop_file=str(stop), stop_check_every=check_every)
    stopped = ft_train.main(cfg, **kw)
    assert stopped["stopped_at_step"] == stopped["steps"] == check_every and stopped["history"] == []
    saved = torch.load(snap, weights_only=True)
    assert (saved["epoch"], saved["steps"], saved["step_in_epoch"]) == (0, check_every, check_every)
    stop.unlink()
    resumed = ft_train.main(cfg, **kw)
    assert resumed["resumed_at_step"] == check_every and resumed["stopped_at_step"] is None
    assert resumed["steps"] == full["steps"] == 16 and resumed["param_digests"] == full["param_digests"]
    assert resumed["final_test_acc"] == full["final_test_acc"]


@pytest.mark.process
def test_stop_file_stops_every_rank_at_the_same_step_under_torchrun(tmp_path, mnist_root):
    """Two workers under torchrun: the all-reduce makes both stop after step 2, torchrun ends with 0 and the
    snapshot holds step 2; the resubmitted command, the file gone, trains on from there with the replicas equal."""
    stop, snap = tmp_path / "ft.stop", tmp_path / "ft.pt"
    args = ["--model", "fastnet", "--subset", "1024", "--batch-size", "64", "--epochs", "1", "--timeout", "60",
            "--test-subset", "500", "--snapshot", snap, "--snapshot-every", "100", "--stop-file", stop,
            "--stop-check-every", "2"]  # 8 steps per rank
    kw = dict(nproc=2, threads_per_proc=1, device="cpu", timeout=150, echo=False)
    stop.touch()
    stopped = torchrun("mnist_helpers.workers.progression.ft_train", args, **kw)
    assert stopped["stopped_at_step"] == stopped["steps"] == 2 and len(set(stopped["param_digests"])) == 1
    assert torch.load(snap, weights_only=True)["steps"] == 2
    stop.unlink()
    resumed = torchrun("mnist_helpers.workers.progression.ft_train", args, **kw)
    assert resumed["resumed_at_step"] == 2 and resumed["steps"] == 8 and resumed["stopped_at_step"] is None
    assert len(set(resumed["param_digests"])) == 1


def test_cli_rejects_kill_without_snapshot(capsys):
    with pytest.raises(SystemExit):
        ft_train.cli(["--die-at-step", "3"])
    assert "--die-at-step needs --snapshot" in capsys.readouterr().err


def test_launcher_sets_store_variable_only_for_restarts(monkeypatch):
    """torchrun(options=LaunchOptions(max_restarts>0)) must add TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (restarts
    often fail without it on torch 2.14: tests/workers/test_bugs_restart_kill.py measures how often); the command line itself is
    unchanged."""
    assert "--max-restarts" in build_command("m", max_restarts=2)
    seen = {}

    def fake_run(command, env, timeout, echo, cleanup=None):
        seen.update(env)
        return [], 0

    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    monkeypatch.setattr("mnist_helpers.launch._run", fake_run)
    torchrun("m", nproc=1, provision=False, device="cpu", echo=False, options=LaunchOptions(max_restarts=1))
    assert seen["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    seen.clear()
    torchrun("m", nproc=1, provision=False, device="cpu", echo=False)
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in seen
    seen.clear()
    torchrun("m", nproc=1, provision=False, device="cpu", echo=False, options=LaunchOptions(max_restarts=1),
             env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"})  # the caller's choice wins
    assert seen["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"


@pytest.mark.process
def test_kill_9_worker_restarts_and_matches_uninterrupted(tmp_path, mnist_root):
    """Rank 1 is SIGKILLed after step 5 of 8 (mid-epoch, snapshot at step 3); torchrun --max-restarts
    restarts the group, which resumes there and ends within 0.3 points of an uninterrupted run.
    (tests/system/test_multinode.py does the same with two agents at a c10d rendezvous.)"""
    args = ["--model", "fastnet", "--subset", "1024", "--batch-size", "64", "--epochs", "1",
            "--snapshot-every", "3", "--timeout", "60", "--test-subset", "1000"]  # 8 steps per rank
    kw = dict(nproc=2, threads_per_proc=1, device="cpu", timeout=150, echo=False)
    ref = torchrun("mnist_helpers.workers.progression.ft_train", args, **kw)
    killed = torchrun("mnist_helpers.workers.progression.ft_train", [*args, "--snapshot", tmp_path / "ft.pt", "--die-at-step", "5"],
                      options=LaunchOptions(max_restarts=2), **kw)
    assert ref["resumed_at_step"] is None
    assert killed["resumed_at_step"] == 3, killed  # the last snapshot before the kill
    assert killed["steps"] == ref["steps"] == 8
    assert abs(killed["final_test_acc"] - ref["final_test_acc"]) <= 0.003
    assert len(set(killed["param_digests"])) == 1  # the replicas still agree after the restart
