"""Every comparison runs on one device, on machines with 0, 1 and 2 GPUs (issue 38; no GPU needed).

``distributed.cuda_gpus()`` is the one function patched to play a machine's GPUs. A comparison's runs share one device
(``distributed.comparison_device``: "cuda" only when each process of its largest run gets a GPU, else "cpu" for every
run, the 1-process ones included), and on cuda no world size exceeds the GPUs. Checked: the plans of notebooks 00, 07
and 09 (the functions, and that the notebooks use them), 02's loop-against-fit() comparison, and 06's demo workers,
whose tensors must live on the process's device (``ctx.device``: under nccl a collective on a CPU tensor fails). The
demos are run on the ``meta`` device, a device that is not the CPU and needs no GPU, up to their first DDP wrap, with
the collectives replaced by spies that record where each tensor lives.
"""
from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from mnist_helpers import distributed
from mnist_helpers.distributed import DistContext, comparison_device
from mnist_helpers.lessons.n07 import lesson as l07
from mnist_helpers.lessons.n09 import lesson as l09

REPO = Path(__file__).resolve().parents[2]
GPU_COUNTS = (0, 1, 2)


def cells(name: str) -> list[str]:
    nb = json.loads((REPO / "notebooks" / f"{name}.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def calls(code: str, name: str) -> list[ast.Call]:
    """Every call of a function (or method) called ``name`` in ``code``."""
    return [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)
            and getattr(n.func, "id", getattr(n.func, "attr", None)) == name]


def keyword(call: ast.Call, name: str) -> str | None:
    return next((ast.unparse(k.value) for k in call.keywords if k.arg == name), None)


@pytest.fixture
def play_gpus(monkeypatch):
    """play_gpus(n): this process now sees n CUDA GPUs."""
    def play(n: int) -> None:
        monkeypatch.setattr(distributed, "cuda_gpus", lambda: n)
    return play


# --------------------------------------------------------------------------- notebook 00: 1 process, then 2

@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_notebook_00_runs_both_processes_counts_on_one_device(gpus, play_gpus, capsys):
    play_gpus(gpus)
    code = cells("00_setup_and_data")
    plan_cell = [c for c in code if "comparison_device(" in c]
    assert len(plan_cell) == 1, "notebook 00 decides its comparison's device in one cell, with comparison_device"
    ns: dict = {}
    exec(plan_cell[0], ns)  # noqa: S102 - the notebook's own cell
    assert ns["DEVICE"] == ("cuda" if gpus >= 2 else "cpu"), "cuda only with a GPU for each of the 2 processes"
    assert set(ns["WORLD_SIZES"]) == {1, 2}
    assert ns["DEVICE"] in capsys.readouterr().out.lower(), "the cell says where both runs go"
    launches = [c for cell in code for c in calls(cell, "torchrun")]
    assert sorted(ast.literal_eval(keyword(c, "nproc")) for c in launches) == [1, 2]
    assert all(keyword(c, "device") == "DEVICE" for c in launches), "both launches on the comparison's device"
    table = next(cell for cell in code if "distinct replicas" in cell and "rows.append" in cell)
    assert '"device": run["device"]' in table, "the table says where each row ran"


# --------------------------------------------------------------------------- notebook 07: scaling, all-reduce

@pytest.mark.parametrize("quick", [True, False])
@pytest.mark.parametrize("gpus", GPU_COUNTS + (3, 4))
def test_notebook_07_plan_fits_the_gpus(gpus, quick, play_gpus):
    play_gpus(gpus)
    p = l07.plan(None, 2, quick)  # the GPUs from distributed.cuda_gpus()
    assert p == l07.plan(gpus, 2, quick)
    assert {1, 2} <= set(p["world_sizes"]), "the 2-vs-1 comparisons read world sizes 1 and 2"
    assert p["device"] == comparison_device(max(p["world_sizes"]), gpus)
    assert p["allreduce_device"] == comparison_device(max(p["allreduce_worlds"]), gpus)
    if p["device"] == "cuda":
        assert max(p["world_sizes"]) <= gpus and p["backend"] == "nccl" and not p["stand_in"]
    if p["allreduce_device"] == "cuda":
        assert max(p["allreduce_worlds"]) <= gpus
    assert len(p["allreduce_worlds"]) >= 2 and min(p["allreduce_worlds"]) >= 2
    assert p["note"] and "\n" not in p["note"]


@pytest.mark.parametrize("gpus", [0, 1])
def test_notebook_07_without_a_gpu_per_process_keeps_the_cpu_world_sizes(gpus):
    """0 or 1 GPU: every run on the CPU, with the world sizes the CPU results were always measured at."""
    for quick, worlds, ar in ((True, [1, 2], [2, 3]), (False, [1, 2, 4], [2, 3, 4])):
        p = l07.plan(gpus, 2, quick)
        assert (p["device"], p["allreduce_device"], p["backend"]) == ("cpu", "cpu", "gloo") and p["stand_in"]
        assert p["world_sizes"] == worlds and p["allreduce_worlds"] == ar
    if gpus:
        assert "the 1-process ones included" in p["note"] and "1 GPU " in p["note"]


def test_notebook_07_on_two_gpus():
    p = l07.plan(2, 16, quick=False)
    assert p["device"] == "cuda" and p["world_sizes"] == [1, 2] and p["memory_device"] == "cuda"
    # two GPUs give one all-reduce world size (2): the sweep, which needs two, runs on the CPU and says so
    assert p["allreduce_device"] == "cpu" and p["allreduce_worlds"] == [2, 3, 4] and "all-reduce" in p["note"]
    asked = l07.plan(2, 16, world_sizes=[1, 2, 4])  # more processes than GPUs: all of them on the CPU
    assert asked["device"] == "cpu" and asked["world_sizes"] == [1, 2, 4]
    with pytest.raises(ValueError, match="1 and 2"):
        l07.plan(2, 16, world_sizes=[1, 4])
    with pytest.raises(ValueError, match="two world sizes"):
        l07.plan(2, 16, allreduce_worlds=[2])


def test_notebook_07_takes_its_devices_and_world_sizes_from_the_plan():
    # a %%writefile cell (section 3's shards.py) is a file the learner writes, not the kernel's Python
    code = "\n".join(c for c in cells("07_scaling_and_multinode") if not c.startswith("%%"))
    assert "l07.plan(" in code
    assert '"cuda" if GPUS' not in code and "torch.cuda.device_count()" not in code
    sweep = calls(code, "allreduce_sweep")
    assert sweep and all(keyword(c, "device") == "AR_DEVICE" for c in sweep)
    for name in ("article_comparison", "ddp_variants"):
        assert all(keyword(c, "device") == "DEVICE" for c in calls(code, name)), name
    assert "device=DEVICE" in next(c for c in cells("07_scaling_and_multinode") if "strong_scaling(" in c)


# --------------------------------------------------------------------------- notebook 09: profiles, the priority

@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_notebook_09_plan_fits_the_gpus(gpus, cores, play_gpus):
    play_gpus(gpus)
    p = l09.plan(cores=cores)
    assert p == l09.plan(gpus, cores)
    assert p["device"] == comparison_device(max(p["world_sizes"]), gpus)
    assert p["distributed"] == (max(p["world_sizes"]) > 1)
    if p["device"] == "cuda":
        assert max(p["world_sizes"]) <= gpus
    assert p["profile_ddp_device"] == comparison_device(2, gpus)
    expected = {0: ("cpu", (1, 2) if cores >= 2 else (1,)), 1: ("cuda", (1,)), 2: ("cuda", (1, 2))}[gpus]
    assert (p["device"], p["world_sizes"]) == expected
    if gpus == 1:
        assert p["dist_note"].startswith("not testable here")


def test_lever_plan_puts_every_run_on_one_device(play_gpus):
    levers = {1: {"loader": "tensor", "num_workers": 0}, 4: {}}
    play_gpus(1)  # a 2-process run with one GPU: the whole comparison on the CPU
    runs = l09.lever_plan(l09.ARTICLE_BASELINE, levers)
    assert {r["device"] for r in runs} == {"cpu"} and {r["cfg"].device for r in runs} == {"cpu"}
    with pytest.raises(ValueError, match="needs 2 GPUs"):
        l09.lever_plan(l09.ARTICLE_BASELINE, levers, device="cuda")
    alone = l09.lever_plan(l09.ARTICLE_BASELINE, {1: levers[1]})  # no 2-process run: the GPU
    assert {r["device"] for r in alone} == {"cuda"}
    play_gpus(2)
    assert {r["device"] for r in l09.lever_plan(l09.ARTICLE_BASELINE, levers)} == {"cuda"}


def test_side_by_side_passes_the_one_device_to_the_kernel_run_and_the_launcher(monkeypatch, play_gpus):
    play_gpus(1)
    seen = []

    def fake_tta(cfg, X, y, target, **kw):
        seen.append(("kernel", cfg.device))
        return {"seconds": 1.0, "reached": True, "images": 10, "steps": 1, "final_acc": 0.9, "curve": []}

    def fake_torchrun(module, args, nproc=1, device="auto", **kw):
        seen.append(("torchrun", device))
        return {"time_to_accuracy": {"seconds": 1.0, "reached": True, "images": 10, "steps": 1, "final_acc": 0.9,
                                     "curve": []}}

    monkeypatch.setattr(l09, "time_to_accuracy", fake_tta)
    monkeypatch.setattr(l09, "torchrun", fake_torchrun)
    monkeypatch.setattr(l09, "load_mnist", lambda subset=None, **kw: (None, None, torch.zeros(1), torch.zeros(1)))
    runs = l09.lever_plan(l09.ARTICLE_BASELINE, {4: {}})
    rows = l09.side_by_side(runs, 0.5, seeds=(0,), progress=False)
    assert seen == [("kernel", "cpu"), ("torchrun", "cpu")], "1 process and 2 processes on the same device"
    assert {r["device"] for r in rows} == {"cpu"}
    assert {s["device"] for s in l09.runs_summary(rows)} == {"cpu"}
    with pytest.raises(ValueError, match="share a device"):
        l09.side_by_side([{**runs[0], "device": "cuda"}, runs[1]], 0.5, seeds=(0,), progress=False)


def test_autotunes_process_stage_launches_on_its_device(monkeypatch):
    seen = []

    def fake_torchrun(module, args, nproc=1, device="auto", **kw):
        seen.append(device)
        return {"ranks": [{"wall_s_per_step": 0.1}] * nproc}

    monkeypatch.setattr(l09, "torchrun", fake_torchrun)
    l09.measure_processes(2, device="cpu")
    assert seen == ["cpu"]
    assert "device=self.dev.type" in Path(l09.__file__).read_text(), "autotune passes its own device"


def test_notebook_09_takes_its_devices_from_the_plan():
    code = "\n".join(cells("09_profiling_and_autotune"))
    assert 'select_device("auto")' not in code and "DEVICE_PLAN = plan(" in code
    assert all(keyword(c, "device") for c in calls(code, "torchrun")), "every launch names its device"
    assert all(keyword(c, "device") == "DEVICE_PLAN['device']" for c in calls(code, "lever_plan"))
    assert all(keyword(c, "device") == "DEVICE_PLAN['device']" for c in calls(code, "autotune"))


# --------------------------------------------------------------------------- notebook 02: the loop against fit()

def test_notebook_02_compares_the_loop_and_fit_on_one_device():
    code = "\n".join(cells("02_single_device_baseline"))
    cfg = next(c for c in calls(code, "TrainConfig") if keyword(c, "loader") == "'dataloader'")
    assert keyword(cfg, "device") == "device.type", "fit() runs on the article loop's device"
    assert "loop_device=device.type" in code, "the comparison knows the article loop's device"
    from mnist_helpers.lessons.n02.lesson import compare_loop_and_fit
    row = [{"epoch": 1, "test_acc": 0.9, "seconds": 1.0}]
    assert not compare_loop_and_fit(row, row, loop_device="cpu", fit_device="mps", max_weight_diff=0.0)["identical"], \
        "the claim is judged only on same-device runs"


# --------------------------------------------------------------------------- 06's demos: tensors on ctx.device

class _Stop(Exception):
    """Raised by the DDP spy: the demo got as far as its first DDP wrap."""


@pytest.mark.parametrize("demo", ["manual_allreduce", "seeding", "syncbn", "validation"])
def test_demo_tensors_live_on_the_contexts_device(demo, monkeypatch, mnist_root):
    """On the ``meta`` device (not the CPU, no GPU needed), as if nccl had given this rank its GPU: every tensor
    handed to a collective and every parameter handed to DDP must be on ``ctx.device``."""
    import importlib

    module = importlib.import_module(f"mnist_helpers.workers.demos.{demo}")
    device = torch.device("meta")
    ctx = DistContext(rank=0, local_rank=0, world_size=2, backend="nccl", device=device)
    args = argparse.Namespace(batch_size=4, steps=1, train_steps=1, seed=0, data_root=str(mnist_root), timeout=10)
    seen: list[tuple[str, torch.device]] = []

    def collective(name):
        def spy(tensor, *a, **kw):
            for t in tensor if isinstance(tensor, (list, tuple)) else [tensor]:
                seen.append((name, t.device))
            for t in a:
                if isinstance(t, torch.Tensor):
                    seen.append((name, t.device))
        return spy

    for name in ("all_reduce", "all_gather", "broadcast"):
        monkeypatch.setattr(dist, name, collective(name))

    def ddp_spy(model, device_ids=None, **kw):
        seen.extend(("DDP", p.device) for p in model.parameters())
        assert device_ids is None, "device_ids only for a CUDA device"
        raise _Stop

    monkeypatch.setattr(module, "DDP", ddp_spy)
    for name in ("params_digest", "grads_digest"):  # digests read bytes, which a meta tensor has none of
        if hasattr(module, name):
            monkeypatch.setattr(module, name, lambda model: "digest")
    with pytest.raises(_Stop):
        module.run(ctx, args)
    assert any(kind == "DDP" for kind, _ in seen)
    if demo == "manual_allreduce":
        assert any(kind == "all_reduce" for kind, _ in seen), "the hand-written all-reduce came first"
    wrong = sorted({(kind, str(dev)) for kind, dev in seen if dev != device})
    assert not wrong, f"tensors not on the context's device ({device}): {wrong}"
