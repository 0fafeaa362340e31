"""The communication hook of workers/bench/accum_nosync times an all-reduce until it has completed, not its launch.

An asynchronous collective returns on the host at once; with NCCL its future even completes at launch, so a host clock
read in the callback would measure a queued kernel. On a GPU the hook times with CUDA events (the GPU test skips
here without one); with gloo the future completes when the communication has ended. The 2-process run of the worker
itself is tests/notebooks/test_n05_precision.py::test_no_sync_all_reduces_once_per_step.
"""
from __future__ import annotations

import datetime
import os
import threading

import pytest
import torch
import torch.distributed as dist

from mnist_helpers.ports import free_port
from mnist_helpers.workers.bench import accum_nosync as an


class Bucket:  # what the hook uses of DDP's GradBucket
    def __init__(self, buf):
        self._buf = buf

    def buffer(self):
        return self._buf


def fresh_state():
    return {"calls": 0, "bytes": 0, "seconds": 0.0, "events": []}


def test_the_hook_times_until_the_all_reduce_has_completed(monkeypatch):
    """A stand-in all-reduce that completes 0.2 s after its launch: the hook's seconds cover the 0.2 s."""
    class Work:
        def __init__(self, t):
            self.fut = torch.futures.Future()
            threading.Timer(0.2, lambda: self.fut.set_result([t * 2])).start()  # the sum of 2 ranks' halves

        def get_future(self):
            return self.fut

    monkeypatch.setattr(an.dist, "all_reduce", lambda t, async_op: Work(t))
    monkeypatch.setattr(an.dist, "get_world_size", lambda: 2)
    state = fresh_state()
    out = an.counting_allreduce_hook(state, Bucket(torch.ones(10)))
    assert state["seconds"] == 0.0  # launched, not done: nothing timed yet
    assert torch.equal(out.wait(), torch.ones(10))  # averaged: (1/2) * 2
    an.settle(state)
    assert state["calls"] == 1 and state["bytes"] == 40 and state["seconds"] >= 0.2


def _one_rank_group(backend, device=None):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    kw = {"device_id": device} if device is not None else {}
    dist.init_process_group(backend, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30), **kw)


def test_the_hook_on_gloo_is_timed_by_the_host_clock():
    _one_rank_group("gloo")
    try:
        state = fresh_state()
        out = an.counting_allreduce_hook(state, Bucket(torch.full((1000,), 3.0)))
        assert torch.equal(out.wait(), torch.full((1000,), 3.0))
        an.settle(state)
        assert state["calls"] == 1 and state["bytes"] == 4000 and state["seconds"] > 0 and not state["events"]
    finally:
        dist.destroy_process_group()
    assert "host clock" in an.timing_label(torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (NCCL)")
def test_the_hook_on_nccl_is_timed_by_cuda_events():
    device = torch.device("cuda", 0)
    _one_rank_group("nccl", device)
    try:
        state = fresh_state()
        out = an.counting_allreduce_hook(state, Bucket(torch.ones(2**24, device=device)))
        out.wait()  # on the host: returns at once (the callback has run, the GPU may still be communicating)
        assert len(state["events"]) == 1 and state["seconds"] == 0.0  # timed by events, read only by settle
        an.settle(state)
        assert state["seconds"] > 0 and not state["events"]
    finally:
        dist.destroy_process_group()
    assert "CUDA events" in an.timing_label(device)
