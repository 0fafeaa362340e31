"""Machines other than this one: accelerators beyond CUDA (monkeypatched), and the no-`make` route of Kaggle,
Colab and JupyterHub kernels that already have torch (checked offline, without a second torch install)."""
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from mnist_helpers import distributed, train
from mnist_helpers.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def fake_accelerator(monkeypatch, kind, count=1):
    acc = types.SimpleNamespace(is_available=lambda: kind is not None, device_count=lambda: count if kind else 0,
                                current_accelerator=lambda: torch.device(kind) if kind else None)
    monkeypatch.setattr(torch, "accelerator", acc, raising=False)
    # CUDA GPUs are counted through NVML (resources.gpu_count: torch.cuda.device_count), not acc.is_available()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count if kind == "cuda" else 0)


@pytest.mark.parametrize("kind,local_rank,expected", [
    (None, 0, "cpu"), ("cuda", 0, "cuda:0"), ("cuda", 3, "cuda:1"), ("mps", 0, "mps"), ("xpu", 1, "xpu:1")])
def test_auto_picks_the_accelerator_through_torch_accelerator(monkeypatch, kind, local_rank, expected):
    fake_accelerator(monkeypatch, kind, count=2)
    assert train.accelerator() == kind
    assert str(train.select_device("auto", local_rank)) == expected


def test_asking_for_an_absent_device_says_what_to_use(monkeypatch):
    fake_accelerator(monkeypatch, "mps")
    assert str(train.select_device("mps")) == "mps" and str(train.select_device("cpu")) == "cpu"
    with pytest.raises(ConfigError, match=r"'cuda' was asked for but cuda is not available.*accelerator: mps"):
        train.select_device("cuda")


def test_ddp_lessons_use_gloo_on_the_cpu_next_to_an_mps_device(monkeypatch, capsys):
    fake_accelerator(monkeypatch, "mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for k in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    ctx = distributed.init_distributed("auto")
    assert ctx.device.type == "cpu" and distributed.choose_backend(1) == "gloo"
    assert "gloo on the CPU; this machine's mps accelerator is not used" in capsys.readouterr().out


def readme_section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(rf"^## {re.escape(title)}.*?(?=^## )", text, re.S | re.M)
    assert m, f"README has no '## {title}' section"
    return m.group(0)


@pytest.mark.process
def test_the_no_make_route_leaves_the_installed_torch_alone(tmp_path):
    """`pip install -e .` in an environment that already has torch/torchvision installs neither again: pip's
    own resolver, asked offline (--no-index) for a report of what it would install."""
    section = readme_section("Hosted: Colab, Kaggle, JupyterHub")
    assert "pip install -e ." in section and "python -m mnist_helpers.data" in section
    assert "torch==" not in section  # no pinned build: the platform's torch stays
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                           "--quiet", "--report", str(report), "-e", str(REPO)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert names == {"mnist-scale-lab"}, f"the route would (re)install {sorted(names - {'mnist-scale-lab'})}"


@pytest.mark.skipif(not __import__("os").environ.get("MNIST_EXPECT_AVX2"), reason="only under `make test-avx2`")
def test_the_avx2_profile_is_in_effect():
    """`make test-avx2` must really run torch's CPU kernels at AVX2, or it tests nothing new."""
    import platform

    from mnist_helpers.resources import machine_info

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("ATEN_CPU_CAPABILITY=avx2 exists on x86-64 only")
    info = machine_info()
    assert torch.backends.cpu.get_cpu_capability() == "AVX2" and info["onednn_max_cpu_isa"] == "AVX2"
    assert info["cpu_capability"] == "AVX2"


def test_a_limited_isa_compiles_into_its_own_cache(monkeypatch, tmp_path):
    """Inductor's cache is not keyed by ATEN_CPU_CAPABILITY: a run limited to AVX2 must not replay native code."""
    from mnist_helpers.resources import isolate_compile_cache

    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    for var in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    assert isolate_compile_cache() is None and "TORCHINDUCTOR_CACHE_DIR" not in __import__("os").environ  # native
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    path = isolate_compile_cache()
    assert path.startswith(str(tmp_path)) and path.endswith("_avx2")
    assert __import__("os").environ["TORCHINDUCTOR_CACHE_DIR"] == path
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "chosen"))  # a folder someone chose stays
    assert isolate_compile_cache() is None
