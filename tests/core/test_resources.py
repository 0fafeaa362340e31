"""Hardware and framework inspection (notebook 01): plain dicts, no crash without a GPU or a tool."""
import json
import sys
import types

import pytest

from mnist_helpers import resources as r
from mnist_helpers.lessons.n01 import lesson as l01


def test_machine_info_and_describe_keep_their_shape():
    info = r.machine_info()
    for key in ("cpu_model", "logical_cores", "ram_gib", "torch", "gpus"):
        assert key in info
    json.dumps(info)
    line = r.describe(info)
    assert info["cpu_model"] in line and f"{info['logical_cores']} cores" in line
    assert r.describe({"cpu_model": "X", "logical_cores": 8, "torch": "2.x",
                       "gpus": [{"name": "RTX 3070", "memory_gib": 8}]}) == "X (8 cores), 1x RTX 3070, torch 2.x"


@pytest.mark.process
@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_a_pinned_process_says_how_many_cores_it_may_use():
    """taskset / a cpuset: os.cpu_count() still counts the machine; the record and the line say the cores usable."""
    import subprocess
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from mnist_helpers import resources as r; i = r.machine_info(); print(i['usable_cores'], r.describe(i))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    usable, line = out.split(" ", 1)
    assert usable == "1"
    info = r.machine_info()
    assert (f"1 of {info['logical_cores']} cores" in line) == (info["logical_cores"] > 1)
    assert r.describe({"cpu_model": "X", "logical_cores": 16, "usable_cores": 2, "torch": "2.x",
                       "gpus": []}) == "X (2 of 16 cores), no GPU, torch 2.x"


def test_hardware_levels_are_json_ready(mnist_root):
    info = l01.hardware_info(mnist_root, measure_io=False)
    json.dumps(info)
    cpu = info["cpu"]
    assert 1 <= cpu["usable_cores"] <= cpu["logical_cores"]
    assert info["memory"]["ram_total_gib"] >= info["memory"]["ram_available_gib"] > 0
    assert info["disk"]["disk_total_gib"] >= info["disk"]["disk_free_gib"] >= 0
    assert isinstance(info["gpus"], list)


def test_read_throughput_reads_what_it_says(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * 3_000_000)
    (tmp_path / "b.bin").write_bytes(b"y" * 1_000_000)
    res = l01.read_throughput(tmp_path, repeats=1)
    assert res["files"] == 2 and res["megabytes"] == pytest.approx(4.0)
    assert res["cold_mb_per_s"] > 0 and res["warm_mb_per_s"] > 0
    capped = l01.read_throughput(tmp_path, max_bytes=1_500_000, repeats=1)
    assert capped["files"] == 1 and capped["megabytes"] == pytest.approx(1.5)


@pytest.mark.parametrize("kwargs,match", [({"repeats": 0}, "repeats must be a positive integer")])
def test_read_throughput_rejects_bad_input(tmp_path, kwargs, match):
    (tmp_path / "a").write_bytes(b"1")
    with pytest.raises(ValueError, match=match):
        l01.read_throughput(tmp_path, **kwargs)
    with pytest.raises(ValueError, match="does not exist"):
        l01.read_throughput(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no data"):
        l01.read_throughput(tmp_path / "empty")


def test_framework_info_names_the_knobs():
    import torch
    info = l01.framework_info()
    assert info["intra_op_threads"] == torch.get_num_threads()
    assert info["torch"] == torch.__version__
    assert "PYTORCH_CUDA_ALLOC_CONF" in info and "float32_matmul_precision" in info
    json.dumps(info)


@pytest.mark.process
def test_shell_equivalents_run_or_say_absent(monkeypatch):
    res = l01.shell_equivalent("lscpu")
    assert res["command"] == "lscpu" and res["output"]
    monkeypatch.setattr(l01.shutil, "which", lambda name: None)
    absent = l01.shell_equivalent("nvidia-smi")
    assert absent["present"] is False and "not installed here" in absent["output"]
    with pytest.raises(ValueError, match="unknown command"):
        l01.shell_equivalent("rm -rf /")


def test_nvml_absent_or_failing_is_reported_not_raised(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert l01.nvml_info() == {"available": False, "reason": "pynvml is not installed (pip install nvidia-ml-py)"}
    broken = types.SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("Driver Not Loaded")))
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    res = l01.nvml_info()
    assert res["available"] is False and "Driver Not Loaded" in res["reason"]


def test_nvml_reads_a_fake_gpu(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: b"550.54", nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetName=lambda h: "Fake GPU",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=8 * 2**30, used=2**30),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=37, memory=12),
        nvmlDeviceGetTemperature=lambda h, sensor: 55,
        nvmlDeviceGetPowerUsage=lambda h: (_ for _ in ()).throw(RuntimeError("not supported")))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    res = l01.nvml_info()
    assert res["driver"] == "550.54" and calls == ["init", "shutdown"]
    gpu = res["gpus"][0]
    assert gpu["memory_total_gib"] == 8 and gpu["memory_used_gib"] == 1 and gpu["utilization_gpu_pct"] == 37
    assert gpu["temperature_c"] == 55 and gpu["power_w"] is None
