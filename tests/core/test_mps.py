"""Apple's MPS (issue 40): memory on an MPS device comes from torch.mps's own counters, never from the CPU profiler
or the process RSS. No Mac runs these tests: the device is played with ``torch.backends.mps.is_available`` and
fake ``torch.mps`` counters, and the CPU paths are made to fail if taken."""
import psutil
import pytest
import torch
import torch._dynamo  # noqa: F401 - TorchDispatchMode imports it on first use, and it must see the real is_available

from mnist_helpers import memory
from mnist_helpers.io import MiB


class FakeMPS:
    """torch.mps's counters over a number the test moves (``held``: bytes held by tensors)."""

    def __init__(self, held: int, driver: int):
        self.held, self.driver, self.syncs = held, driver, 0

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
        monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: self.held)
        monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: self.driver)
        monkeypatch.setattr(torch.mps, "synchronize", self.sync)
        return self

    def sync(self):
        self.syncs += 1


@pytest.fixture
def mps(monkeypatch):
    """An MPS device as far as the memory helpers can tell; the CPU measurements fail the test if used."""
    def cpu_path(*args, **kwargs):
        raise AssertionError("a CPU measurement was taken for the MPS device")

    monkeypatch.setattr(memory, "_profiler_peak", cpu_path)
    monkeypatch.setattr(psutil, "Process", cpu_path)
    monkeypatch.setattr(memory, "rss_peak_bytes", cpu_path)
    return FakeMPS(held=100 * MiB, driver=300 * MiB).install(monkeypatch)


def test_peak_memory_reads_the_mps_counter(mps):
    def step():  # the counter moves as tensors come and go; each operator afterwards is a sample
        mps.held += 80 * MiB
        torch.zeros(1)
        mps.held -= 60 * MiB
        torch.zeros(1)

    rep = memory.peak_memory(step, "mps")
    assert rep.method == "mps" and rep.device == "mps"
    assert rep.before_bytes == 100 * MiB and rep.persistent_bytes == 120 * MiB
    assert rep.peak_bytes == 180 * MiB and rep.transient_bytes == 60 * MiB  # the peak between two operators
    assert mps.syncs >= 2  # queued GPU work finished before each reading of the clock
    assert memory.peak_memory(step, torch.device("mps"), method="mps").method == "mps"


def test_current_bytes_and_summary_are_the_devices(mps):
    assert memory.current_bytes("mps") == 100 * MiB
    text = memory.memory_summary("mps")
    assert "MPS" in text and "current_allocated_memory" in text and "driver_allocated_memory" in text
    assert "100.0 MiB" in text and "300.0 MiB" in text and "RSS" not in text


def test_no_cpu_numbers_for_mps(mps):
    with pytest.raises(ValueError, match="not measured with the profiler"):
        memory.peak_memory(lambda: None, "mps", method="profiler")
    with pytest.raises(ValueError, match="needs an MPS device"):
        memory.peak_memory(lambda: None, "cpu", method="mps")


def test_without_counters_it_says_not_measured(mps, monkeypatch):
    monkeypatch.delattr(torch.mps, "current_allocated_memory")
    with pytest.raises(ValueError, match="not measured on this device"):
        memory.peak_memory(lambda: None, "mps")
    with pytest.raises(ValueError, match="not measured on this device"):
        memory.current_bytes("mps")


def test_mps_asked_for_where_there_is_none(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="MPS is not available"):
        memory.peak_memory(lambda: None, "mps")


def test_sampling_leaves_a_training_step_unchanged(mps):
    """The sampler sits under every operator of ``fn`` (forward, backward, Adam): it must not change the step.
    Played on CPU tensors here; the counter is the fake one."""
    from mnist_helpers.models import Net
    from mnist_helpers.train import train_step

    X, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    weights = []
    for sampled in (False, True):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.Adam(model.parameters())
        step = lambda: train_step(model, opt, X, y, amp="bf16")  # noqa: E731
        if sampled:
            assert memory.peak_memory(step, "mps").method == "mps"
        else:
            step()
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(weights[0], weights[1])
