"""Counting GPUs must not start the CUDA driver (issue 47; no GPU needed).

``torch.cuda.is_available()`` asks the driver (``cudaGetDeviceCount``) unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` is
set when it is called; from then on a forked child cannot use CUDA (``accelerate.notebook_launcher`` on a 2-GPU
Kaggle kernel), while ``torch.cuda.is_initialized()`` still says False. The series counts GPUs with
``resources.gpu_count()`` (``torch.cuda.device_count()``, which asks NVML first) wherever the answer only decides what
to run. Here ``torch.cuda.is_available`` is replaced by a function that raises, and each of those places must still
work and report this machine's GPUs (0 on a machine without one). A source scan keeps new ``is_available()`` calls
out of the package, except in the modules that use the GPU right after asking.

What this cannot show without a GPU: that NVML really leaves the driver alone. On a machine without NVML (no
``libnvidia-ml.so.1``, like our CPU machines) ``device_count()`` itself falls back to the driver;
``test_the_count_needs_no_driver_where_nvml_answers`` plays NVML's answer instead.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch

from mnist_helpers import distributed, launch, memory, resources, train
from mnist_helpers.course import doctor, hosted
from mnist_helpers.course import env_check

PACKAGE = Path(resources.__file__).resolve().parent
GPUS = torch.cuda.device_count()  # this machine's count, asked once before any test replaces anything


@pytest.fixture
def no_is_available(monkeypatch):
    """``torch.cuda.is_available()`` now raises: a call to it fails the test."""
    def is_available():
        raise AssertionError("is_available initialises the CUDA driver")
    monkeypatch.setattr(torch.cuda, "is_available", is_available)


def test_gpu_count_is_the_device_count(no_is_available):
    assert resources.gpu_count() == GPUS


def test_the_first_cell_counts_gpus_without_is_available(no_is_available, monkeypatch):
    seen, choose = [], hosted.choose_profile

    def spy(env_value, cores, gpus):
        seen.append(gpus)
        return choose(env_value, cores, gpus)
    monkeypatch.setattr(hosted, "choose_profile", spy)
    hosted.prepare(data=False, quiet=True)
    assert seen == [GPUS] and os.environ["MNIST_PROFILE"] in ("quick", "full")


class _Launched(Exception):
    """Raised instead of starting torchrun: the command and environment torchrun() chose."""


def test_the_launcher_chooses_its_device_without_is_available(no_is_available, monkeypatch, capsys):
    def run(command, env, *args, **kwargs):
        raise _Launched(command, env)
    monkeypatch.setattr(launch, "_run", run)
    with pytest.raises(_Launched) as launched:
        launch.torchrun("mnist_helpers.workers.progression.ddp_train", nproc=2, provision=False)
    command, _env = launched.value.args
    assert command[command.index("--nproc-per-node") + 1] == "2"
    where = "cuda with nccl" if GPUS >= 2 else "the CPU with gloo"
    assert f"2 process(es) on {where}, chosen by device='auto'" in capsys.readouterr().out


def test_distributed_chooses_backend_and_device_without_is_available(no_is_available, monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.cuda_gpus() == GPUS
    assert distributed.choose_backend(2) == ("nccl" if GPUS >= 2 else "gloo")
    assert distributed.comparison_device(2) == ("cuda" if GPUS >= 2 else "cpu")
    if GPUS == 0:  # a world of one joins no group; on a GPU machine this would take the GPU
        ctx = distributed.init_distributed("auto")
        assert (ctx.backend, ctx.device.type) == (None, "cpu")
        with pytest.raises(Exception, match="has none"):
            distributed.check_nccl(0)


def test_machine_info_counts_gpus_without_is_available(no_is_available):
    info = resources.machine_info()
    assert info["cuda_available"] is (GPUS > 0) and len(info["gpus"]) == GPUS


def test_train_default_device_without_is_available(no_is_available):
    want = "cuda" if GPUS else None
    if train.accelerator() not in (None, "cuda"):
        pytest.skip("this machine's accelerator is not CUDA (Apple MPS, Intel XPU)")
    assert train.accelerator() == want
    assert train.select_device("auto").type == (want or "cpu")


def test_env_check_and_doctor_without_is_available(no_is_available, capsys):
    d = env_check.devices()
    assert d["cuda_device_count"] == GPUS and d["cuda_available"] is (GPUS > 0)
    assert env_check.main(["--quiet"]) == 0
    assert ("CPU only" in capsys.readouterr().out) is (GPUS == 0)
    gpus, _gloo, nccl = doctor.check_gpus()
    assert (gpus.level == "info") is (GPUS == 0) and (nccl.level == "info") is (GPUS == 0)


def test_a_failed_cpu_step_does_not_start_cuda(no_is_available):
    memory.release_cached()  # the batch-size search's clean-up after an out-of-memory step


def test_the_count_needs_no_driver_where_nvml_answers(monkeypatch):
    """With NVML answering (played) and the driver's count replaced by a function that raises, the count and the
    choices made from it need no driver: what happens on a Linux GPU machine."""
    def driver(*args):
        raise AssertionError("cudaGetDeviceCount starts the CUDA driver")
    if not torch.cuda._is_compiled():
        pytest.skip("torch built without CUDA: device_count() is 0 without asking anyone")
    if torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised in this process: device_count() asks the driver, as it may then")
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 2)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", driver)
    monkeypatch.setattr(torch.cuda, "is_available", driver)
    assert resources.gpu_count() == 2
    assert distributed.choose_backend(2) == "nccl" and distributed.comparison_device(2) == "cuda"
    assert train.accelerator() == "cuda"
    assert launch.check_devices("auto", 2, resources.gpu_count(), lambda n, dev: "") == "cuda"


# --------------------------------------------------------------------------- no new is_available() in the package

# The modules that may ask torch.cuda.is_available(): each uses the GPU right after asking (or reads it, lesson 01),
# so the driver starts anyway. Everywhere else a count decides what to run: resources.gpu_count().
GPU_USERS = {
    "lessons/n05/precision.py": "CUDA-only measurements (allocator, empty_cache cost) that allocate on the GPU next",
    "memory.py": "a run that asked for a cuda device",
    "lessons/n09/profiling.py": "a profiled run that is on cuda",
    "lessons/n10/speedrun.py": "names the GPU of a run on cuda",
    "workers/progression/ft_train.py": "saves and restores the CUDA RNG inside a torchrun worker",
    "lessons/n01/lesson.py": "notebook 01 reads its GPUs through torch, as the article does; it forks nothing",
}


def is_available_calls(path: Path) -> list[int]:
    """Lines of ``<...>.cuda.is_available()`` and ``<...>.accelerator.is_available()`` calls in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "is_available"
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr in ("cuda", "accelerator")):
            out.append(node.lineno)
    return out


def test_no_new_is_available_calls_in_the_package():
    found = {p.relative_to(PACKAGE).as_posix(): lines for p in sorted(PACKAGE.rglob("*.py"))
             if (lines := is_available_calls(p))}
    unexpected = {name: lines for name, lines in found.items() if name not in GPU_USERS}
    assert not unexpected, ("torch.cuda.is_available() starts the CUDA driver (a fork after it cannot use CUDA): count "
                            f"GPUs with mnist_helpers.resources.gpu_count() instead, at {unexpected}")
    stale = set(GPU_USERS) - set(found)
    assert not stale, f"no is_available() left in {stale}: take them off GPU_USERS"


def test_machine_info_names_gpus_through_nvml_without_the_driver(monkeypatch):
    """Two GPUs seen by a stand-in NVML: machine_info names them while torch's device calls raise (on this CPU
    machine the real NVML path cannot run; this shows which calls machine_info makes, not what NVML answers)."""
    import sys
    import types

    import torch

    from mnist_helpers import resources

    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 * 2**30))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(resources, "gpu_count", lambda: 2)

    def driver(*a, **k):
        raise AssertionError("torch.cuda.get_device_properties initialises the CUDA driver")

    monkeypatch.setattr(torch.cuda, "get_device_properties", driver)
    info = resources.machine_info()
    assert info["cuda_available"] and [g["name"] for g in info["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
    assert info["gpus"][0] == {"name": "NVIDIA H100 80GB HBM3", "memory_gib": 80.0, "capability": "9.0"}
    assert calls == ["init", "shutdown"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # NVML's numbering is not CUDA's any more: torch answers
    assert resources.gpus_through_nvml(2) is None
