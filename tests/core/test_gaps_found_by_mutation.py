"""Fast tests that start no process (no subprocess, torchrun, fork or DataLoader workers), for two gaps a mutation
test found:

1. ``distributed.evaluate_exact`` broadcasts every module buffer from rank 0 before the ranks score their shards.
   Two ranks run as threads of this process on torch's threaded process group
   (``torch.testing._internal.distributed.multi_threaded_pg``), their BatchNorm running statistics made to differ.
2. ``claims.Contention`` subtracts this process's own CPU time from the machine's busy time, so our own work does
   not read as "the machine is busy". Deterministic with ``_busy_seconds``, ``_own_seconds`` and the clock faked,
   plus one real measurement that compares against what the machine-wide busy time alone would report.
"""
from __future__ import annotations

import copy
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from mnist_helpers.course import claims
from mnist_helpers.distributed import DistContext, evaluate_exact, shard
from mnist_helpers.train import evaluate

# --------------------------------------------------------------------------- gap 1: evaluate_exact's broadcast

WORLD = 2
N_IMAGES = 101          # odd: the two shards differ in size (51 and 50)
BATCH = 16              # several batches per shard


def _run_ranks_in_threads(world_size: int, fn, timeout_s: float = 60) -> list:
    """``fn(rank)`` in ``world_size`` threads of this process, each joined to torch's threaded process group
    (backend "threaded"); returns the results in rank order and re-raises the first rank's error. The process
    group state is torn down afterwards (each rank destroys its group; the thread-local world is uninstalled)."""
    from torch.testing._internal.distributed import multi_threaded_pg as mtpg

    assert not dist.is_initialized(), "a process group is already initialised in this process"
    multithreading_before = torch._C._is_multithreading_enabled()
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    world = mtpg._install_threaded_pg()
    store = dist.HashStore()
    results: list = [None] * world_size
    errors: list = []

    def worker(rank: int) -> None:
        dist.init_process_group(backend="threaded", rank=rank, world_size=world_size, store=store)
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # wake the other ranks, waiting in a collective, so they end too
            errors.append((rank, e))
            mtpg.ProcessLocalGroup.exception_handle(e)
        finally:
            if dist.distributed_c10d._world is world:
                dist.destroy_process_group()

    threads = [threading.Thread(target=worker, args=(r,), name=f"rank{r}", daemon=True) for r in range(world_size)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hung = [t.name for t in threads if t.is_alive()]
        if hung:
            mtpg.ProcessLocalGroup.exception_handle(TimeoutError())
            for t in threads:
                t.join(5)
    finally:
        mtpg.ProcessLocalGroup.reset()
        mtpg._uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        # ProcessLocalGroup() turns autograd's multithreading off and never back on: leave it as found
        torch.autograd.set_multithreading_enabled(multithreading_before)
    assert not hung, f"ranks {hung} still running after {timeout_s} s"
    if errors:  # a SystemExit is a rank the threaded group ended because a peer failed: report the peer's error
        rank, e = min(errors, key=lambda x: (isinstance(x[1], SystemExit), x[0]))
        raise AssertionError(f"rank {rank} failed: {e!r}") from e
    return results


def _tiny_bn_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, stride=2), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 13 * 13, 10), nn.LogSoftmax(dim=1))


def _rank_replicas() -> list[nn.Module]:
    """Two replicas as DDP leaves them: identical parameters, but BatchNorm running statistics each rank updated
    with its own batches (rank 1's batches have another mean and scale, so its statistics differ clearly)."""
    torch.manual_seed(0)
    base = _tiny_bn_model()
    replicas = []
    for rank in range(WORLD):
        m = copy.deepcopy(base).train()
        g = torch.Generator().manual_seed(100 + rank)
        with torch.no_grad():
            for _ in range(3 + rank):  # num_batches_tracked differs too
                m(torch.randn(32, 1, 28, 28, generator=g) * (1 + 2 * rank) + 2 * rank)
        replicas.append(m.eval())
    return replicas


def _summed(*parts: dict) -> dict:
    loss_sum, correct, count = (sum(p[k] for p in parts) for k in ("loss_sum", "correct", "count"))
    return {"loss": loss_sum / count, "acc": correct / count, "correct": correct, "count": count}


def test_evaluate_exact_scores_every_shard_with_rank0_batchnorm_buffers():
    """Catches: deleting evaluate_exact's ``for buf in module.buffers(): dist.broadcast(buf, src=0)`` loop (each
    rank would then score its shard with its own BatchNorm statistics). Two ranks in threads, buffers differing."""
    g = torch.Generator().manual_seed(1)
    X = torch.randn(N_IMAGES, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (N_IMAGES,), generator=g)
    replicas = _rank_replicas()
    bn0, bn1 = replicas[0][1], replicas[1][1]
    assert not torch.allclose(bn0.running_mean, bn1.running_mean)
    assert not torch.allclose(bn0.running_var, bn1.running_var)
    assert int(bn0.num_batches_tracked) != int(bn1.num_batches_tracked)
    rank0_buffers = [b.clone() for b in replicas[0].buffers()]

    # what one process gets evaluating rank 0's model on all of X (a copy: the ranks' models are touched below)
    want = evaluate(copy.deepcopy(replicas[0]), X, y, BATCH)
    # the test can fail: rank 1's statistics, alone or on its own shard (the mutant), give another result
    rank1_alone = evaluate(copy.deepcopy(replicas[1]), X, y, BATCH)
    parts = [shard(N_IMAGES, r, WORLD) for r in range(WORLD)]
    mutant = _summed(evaluate(copy.deepcopy(replicas[0]), X[parts[0]], y[parts[0]], BATCH),
                     evaluate(copy.deepcopy(replicas[1]), X[parts[1]], y[parts[1]], BATCH))
    assert abs(rank1_alone["loss"] - want["loss"]) > 1e-3
    assert abs(mutant["loss"] - want["loss"]) > 1e-3

    def rank_fn(rank: int) -> dict:
        ctx = DistContext(rank=rank, local_rank=rank, world_size=WORLD, backend="threaded",
                          device=torch.device("cpu"))
        assert ctx.distributed and dist.get_rank() == rank
        return evaluate_exact(replicas[rank], X, y, ctx, batch_size=BATCH)

    got = _run_ranks_in_threads(WORLD, rank_fn)
    assert not dist.is_initialized()  # torn down: nothing left for the next test
    for rank, res in enumerate(got):
        assert res["count"] == want["count"] == N_IMAGES, rank
        assert res["correct"] == want["correct"], (rank, res, want)
        assert res["loss"] == pytest.approx(want["loss"], abs=1e-6), (rank, res, want)
        assert res["acc"] == pytest.approx(want["acc"], abs=1e-6), (rank, res, want)
    # every rank now holds rank 0's buffers, and rank 0's own are unchanged
    for b0, b1, before in zip(replicas[0].buffers(), replicas[1].buffers(), rank0_buffers):
        assert torch.equal(b0, before)
        assert torch.equal(b1, before)


# --------------------------------------------------------------------------- gap 2: Contention's own-time subtraction

class _FakeMachine:
    """The clocks Contention reads, set by hand: wall time, machine-wide busy CPU-seconds, our own CPU-seconds."""

    def __init__(self, monkeypatch, cores: int = 2, busy: float | None = 1000.0, load: float = 0.5):
        self.t, self.busy, self.own, self.load = 50.0, busy, 10.0, load
        monkeypatch.setattr(claims.os, "cpu_count", lambda: cores)
        monkeypatch.setattr(claims.os, "getloadavg", lambda: (self.load, self.load, self.load), raising=False)
        # claims does `import time`: give it a clock of its own, leaving time.monotonic alone for everyone else
        monkeypatch.setattr(claims, "time", SimpleNamespace(monotonic=lambda: self.t))
        monkeypatch.setattr(claims, "_busy_seconds", lambda: self.busy)
        monkeypatch.setattr(claims, "_own_seconds", lambda: self.own)

    def advance(self, wall: float, busy: float, own: float) -> None:
        self.t += wall
        self.own += own
        if self.busy is not None:
            self.busy += busy


def test_contention_our_own_busy_time_is_not_busy(monkeypatch):
    """Catches: ``others = busy1 - busy0`` without subtracting ``_own_seconds() - own0``. Both cores busy for 1 s,
    all of it this process's: others_share 0, not busy (the mutant reads 100%, busy)."""
    fake = _FakeMachine(monkeypatch, cores=2)
    with claims.Contention() as c:
        fake.advance(wall=1.0, busy=2.0, own=2.0)
    assert c.cores == 2 and c.wall_s == pytest.approx(1.0)
    assert c.others_share == pytest.approx(0.0, abs=1e-9)
    assert not c.busy
    assert claims.busy_verdict(c) is None
    assert c.to_dict()["busy"] is False and c.to_dict()["others_cpu_share"] == 0.0


def test_contention_others_using_most_of_the_cpu_is_busy(monkeypatch):
    """Catches: a Contention that never reads busy, or subtracts the wrong way (e.g. ``own - busy``, clamped to 0).
    Over 2 s on 2 cores the machine was busy 3.5 CPU-s, ours 0.5: others took 3.0 / 4.0 = 75%."""
    fake = _FakeMachine(monkeypatch, cores=2)
    with claims.Contention() as c:
        fake.advance(wall=2.0, busy=3.5, own=0.5)
    assert c.others_share == pytest.approx(0.75)
    assert c.busy
    assert claims.busy_verdict(c) == claims.BUSY


@pytest.mark.parametrize("others_share, busy", [(claims.BUSY_SHARE - 0.01, False), (claims.BUSY_SHARE, False),
                                                (claims.BUSY_SHARE + 0.01, True)])
def test_contention_busy_share_boundary(monkeypatch, others_share, busy):
    """Catches: ``>`` turned into ``>=`` at BUSY_SHARE, a threshold other than BUSY_SHARE in ``busy``, and (our own
    time being 50% of the machine here) the own-time subtraction dropped: the mutant reads others_share + 0.5."""
    fake = _FakeMachine(monkeypatch, cores=4)
    wall, ours = 10.0, 0.5 * 4 * 10.0  # we used half the machine ourselves
    with claims.Contention() as c:
        fake.advance(wall=wall, busy=ours + others_share * 4 * wall, own=ours)
    assert c.others_share == pytest.approx(others_share, abs=1e-9)
    assert c.busy is busy
    assert (claims.busy_verdict(c) == claims.BUSY) is busy


@pytest.mark.parametrize("load, busy", [(1.5, False), (2.0, False), (2.5, True)])
def test_contention_off_linux_the_load_average_decides(monkeypatch, load, busy):
    """Catches: off Linux (``_busy_seconds`` None) an others_share computed anyway, or the load rule's ``> cores``
    changed. Our own work is ignored there (others_share None); the load average against the cores decides."""
    fake = _FakeMachine(monkeypatch, cores=2, busy=None, load=load)
    with claims.Contention() as c:
        fake.advance(wall=1.0, busy=0.0, own=2.0)
    assert c.others_share is None
    assert c.load_before == c.load_after == load
    assert c.busy is busy
    assert c.to_dict()["others_cpu_share"] is None
    assert "unknown" in str(c)


def test_contention_off_linux_either_load_reading_counts(monkeypatch):
    """Catches: the load rule reading only the load average before (or only after) the block."""
    fake = _FakeMachine(monkeypatch, cores=2, busy=None, load=0.5)
    with claims.Contention() as c:
        fake.advance(wall=1.0, busy=0.0, own=0.0)
        fake.load = 3.0
    assert c.busy
    fake.load = 3.0
    with claims.Contention() as c:
        fake.load = 0.5
    assert c.busy


@pytest.mark.skipif(not sys.platform.startswith("linux") or claims._busy_seconds() is None,
                    reason="needs /proc/stat")
def test_contention_real_burn_in_a_thread_is_subtracted():
    """Catches (on the real clocks): the own-time subtraction dropped. A thread of this process burns 0.4 CPU-s
    inside the block. Whatever else the shared machine does meanwhile, the share reported for others must lie below
    the machine-wide busy share (the mutant's reading, recomputed here) by at least half the burn's share."""
    def burn(cpu_s=0.4, wall_cap_s=10.0):  # CPU time, not wall time: the same work on an idle or a loaded machine
        t0, w0, x = time.thread_time(), time.monotonic(), 0
        while time.thread_time() - t0 < cpu_s and time.monotonic() - w0 < wall_cap_s:
            x += 1

    own0 = claims._own_seconds()
    with claims.Contention() as c:
        t = threading.Thread(target=burn)
        t.start()
        t.join()
    busy1, own1 = claims._busy_seconds(), claims._own_seconds()  # read just after Contention's: only larger
    capacity = c.wall_s * c.cores
    if (busy1 - c._busy0) > 1.1 * capacity:
        pytest.skip("/proc/stat counts more CPUs than os.cpu_count() (a container?): shares are not comparable")
    mutant_share = min((busy1 - c._busy0) / capacity, 1.0)
    burn_share = (own1 - own0) / capacity
    assert c.others_share is not None
    assert c.others_share <= mutant_share - 0.5 * burn_share + 0.02, (c.others_share, mutant_share, burn_share)
