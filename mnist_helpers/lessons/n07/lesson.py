"""Scaling, communication and restarts for 07_scaling_and_multinode.

**What runs where** (:func:`plan`): one device for every run of a comparison, from what the machine has
(``distributed.comparison_device``): the GPUs, one process each with nccl, when every world size of the comparison
gets a GPU per process; else the CPU with gloo for all of its runs, the 1-process ones included (a 1-process GPU run
is never set beside a 2-process CPU run). On the CPU the world sizes are the same on every machine (1, 2 and 4
processes; 2, 3 and 4 for the all-reduce), so results stay comparable.

**The article's comparison** (5.4): 1 GPU at batch 128 against 2 GPUs at 64 each, the same global batch, i.e.
*strong scaling*, with the article's loader. :func:`loader_run` launches 06's ``ddp_train`` worker with
``--loader dataloader --num-workers N`` and times the last epoch; :func:`article_comparison` alternates the points
in rounds and :func:`paired_ratios` takes each round's ratio from its own pair; :func:`speedup_verdict` judges
"1.7-1.9x" on the spread of those ratios (quartiles inside, above, below, or straddling the range).

The measurement harness lives beside this module, ``mnist_helpers/lessons/n07/scaling.py`` (shared with ``scripts/bench_scaling.py``,
``scripts/bench_allreduce.py`` and ``scripts/bench_restarts.py``), and is imported from there: the weak and strong
scaling sweeps without the loader (``measure_step``, ``weak_scaling``, ``strong_scaling``, ``round_ratios``,
``comm_fractions``), the verdicts (``speedup_verdict``, ``comm_verdict``: "negligible" is ``NEGLIGIBLE_SHARE`` of a
step), what an all-reduce costs (4.4: ``ring_model``, ``ring_growth``, ``ring_volume_verdict``,
``allreduce_sweep``, ``latency_growth``, ``measured_growth``, ``ddp_variants``) and the restart trials (7.2:
``restart_command``, ``restart_rates`` over ``RESTART_CONFIGS``, ``record_restarts`` writes claim
``07.restarts``). Here: :func:`elastic_membership` lets a second agent join a ``--nnodes=1:2`` job; :func:`ddp_memory`,
:func:`memory_compare` and :func:`memory_verdict` (memory per process under DDP); :func:`mpi_probe`,
:func:`cuda_index_probe` and :func:`shard_overlap` (what this machine can test); for the learner's ``train_ft.py``
(section 5) :func:`ft_runs_table` (its kill -9 is ``mnist_helpers.launch.kill_rank_when``),
:func:`learner_ddp_script` and :func:`ft_train_differences`; :func:`claims_07`.

Rows are lists of dicts; ``ARTICLE_TABLE`` here, ``scaling.SCALING_TABLE``, ``ALLREDUCE_TABLE``,
``DDP_VARIANTS_TABLE`` and ``RESTARTS_TABLE`` in ``scaling`` are the columns and formats to show them with
(``display.show(rows, **scaling.SCALING_TABLE)``).

    from mnist_helpers.lessons.n07.lesson import article_comparison
    from mnist_helpers.lessons.n07.scaling import allreduce_sweep, strong_scaling
    rows = article_comparison({"1 x 128": (1, 128, 4), "2 x 64": (2, 64, 4)}, rounds=3)
    rows = strong_scaling([1, 2], global_batch_size=128, threads_per_proc=1)
    rows = allreduce_sweep([4096, 4 * 2**20], world_sizes=[2, 3, 4])
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

from mnist_helpers import distributed
from mnist_helpers.distributed import comparison_device
from mnist_helpers.launch import torchrun
# the measurement harness and the verdicts live beside this module (scripts/bench_scaling.py, bench_allreduce.py and
# bench_restarts.py run them too): mnist_helpers.lessons.n07.scaling (strong_scaling, allreduce_sweep, ring_model, ...), imported
# from there by notebook 07 and the tests
from mnist_helpers.lessons.n07.scaling import (ARTICLE_SPEEDUP, MIN_ROUNDS, NEGLIGIBLE_SHARE, RESTART_WORKER, comm_fractions,
                                   comm_verdict, ring_volume_verdict, speedup_verdict)


# --------------------------------------------------------------------------- what runs where

CPU_WORLD_SIZES = {True: [1, 2], False: [1, 2, 4]}      # quick / full: the scaling sweeps on the CPU
CPU_ALLREDUCE_WORLDS = {True: [2, 3], False: [2, 3, 4]}  # quick / full: the all-reduce sweep on the CPU


def plan(gpus: int | None = None, cores: int | None = None, quick: bool = False, *, world_sizes=None,
         allreduce_worlds=None) -> dict:
    """The device and the world sizes of notebook 07's comparisons, from what this machine has.

    The article's comparison (1 x 128 against 2 x 64), the scaling sweeps (``world_sizes``) and the DDP variants (2
    processes) are one comparison: they run on ``device`` = ``comparison_device(largest world size)``, so "cuda"
    (nccl, one GPU per process) only with 2 GPUs or more, and never with a world size larger than the GPUs; with 0
    or 1 GPU every one of their runs is on the CPU with gloo. The all-reduce sweep needs two world sizes of 2 or
    more: on the GPUs with 3 or more of them, else on the CPU (``allreduce_device``). ``world_sizes`` /
    ``allreduce_worlds`` override the defaults (the CPU's ``CPU_WORLD_SIZES`` / ``CPU_ALLREDUCE_WORLDS``, the same
    on every machine; on GPUs every GPU count); ``gpus`` defaults to ``distributed.cuda_gpus()``, ``cores`` only
    feeds the note. Returns ``{"device", "backend", "world_sizes", "allreduce_device", "allreduce_backend",
    "allreduce_worlds", "stand_in" (True when the comparisons run on the CPU), "memory_device" (memory per process
    under DDP needs one GPU: "cuda" with one or more), "note" (one plain line)}``.
    """
    gpus = distributed.cuda_gpus() if gpus is None else int(gpus)
    if world_sizes is None:
        world_sizes = CPU_WORLD_SIZES[quick] if gpus < 2 else ([1, 2] if quick else list(range(1, gpus + 1)))
    world_sizes = sorted({int(n) for n in world_sizes})
    if not {1, 2} <= set(world_sizes) or min(world_sizes) < 1:
        raise ValueError(f"world_sizes must hold 1 and 2 (the 2-vs-1 comparisons read them), got {world_sizes!r}")
    if allreduce_worlds is None:
        on_gpus = list(range(2, gpus + 1))
        allreduce_worlds = CPU_ALLREDUCE_WORLDS[quick] if len(on_gpus) < 2 else (on_gpus[:2] if quick else on_gpus)
    allreduce_worlds = sorted({int(n) for n in allreduce_worlds})
    if len(allreduce_worlds) < 2 or min(allreduce_worlds) < 2:
        raise ValueError(f"allreduce_worlds must hold two world sizes >= 2 (to see what grows with N), "
                         f"got {allreduce_worlds!r}")
    device = comparison_device(max(world_sizes), gpus)
    ar_device = comparison_device(max(allreduce_worlds), gpus)
    if device == "cuda":
        note = f"{gpus} GPUs: one process per GPU with nccl; world sizes {world_sizes}"
    else:
        why = ("no GPU" if gpus == 0 else
               f"{gpus} GPU{'s' if gpus > 1 else ''} for up to {max(world_sizes)} processes, and nccl needs one GPU "
               "per process")
        note = (f"{why}: every run of the comparisons, the 1-process ones included, is on the CPU with gloo and 1 "
                f"thread per process (the CPU stand-in for one GPU each); world sizes {world_sizes}")
        if cores and max(world_sizes) > cores:
            note += f" ({max(world_sizes)} processes on {cores} cores: oversubscribed)"
    if ar_device != device:
        note += (f"; the all-reduce sweep (N = {', '.join(map(str, allreduce_worlds))}) on the "
                 + ("GPUs with nccl" if ar_device == "cuda" else
                    f"CPU with gloo ({gpus} GPU{'s give' if gpus != 1 else ' gives'} fewer than two world sizes of 2 "
                    "or more)"))
    return {"device": device, "backend": "nccl" if device == "cuda" else "gloo", "world_sizes": world_sizes,
            "allreduce_device": ar_device, "allreduce_backend": "nccl" if ar_device == "cuda" else "gloo",
            "allreduce_worlds": allreduce_worlds, "stand_in": device == "cpu",
            "memory_device": "cuda" if gpus >= 1 else "cpu", "note": note}


# --------------------------------------------------------------------------- the article's own configuration (5.4)

TRAIN_WORKER = "mnist_helpers.workers.progression.ddp_train"
ARTICLE_TABLE = {"columns": ["label", "device", "world_size", "batch_size", "global_batch_size", "num_workers",
                             "epoch_s", "images_per_s", "images_per_s_min", "images_per_s_max", "test_acc"],
                 "formats": {"epoch_s": "{:.1f}", "images_per_s": "{:,.0f}", "images_per_s_min": "{:,.0f}",
                             "images_per_s_max": "{:,.0f}", "test_acc": "{:.2%}"}}


def loader_run(nproc: int, batch_size: int, *, num_workers: int = 4, model: str = "net", subset: int = 12800,
               epochs: int = 2, threads_per_proc: int = 1, device: str = "cpu", timeout: float = 600,
               echo: bool = False) -> dict:
    """One launch of 06's ``ddp_train`` worker with the article's loader (torchvision MNIST, ``ToTensor`` +
    ``Normalize`` per sample, ``DataLoader(num_workers=...)``, a ``DistributedSampler`` under DDP): ``nproc``
    processes at ``batch_size`` each. The last epoch's time counts (the first one starts the loader workers,
    which stay: ``persistent_workers``)."""
    from mnist_helpers.train import TrainConfig

    if epochs < 2:
        raise ValueError(f"epochs must be >= 2 (the first epoch is the warm-up), got {epochs}")
    cfg = TrainConfig(model=model, batch_size=batch_size, subset=subset, num_epochs=epochs, loader="dataloader",
                      num_workers=num_workers, threads=threads_per_proc)
    res = torchrun(TRAIN_WORKER, cfg.to_args(), nproc=nproc, threads_per_proc=threads_per_proc, timeout=timeout,
                   provision=False, device=device, echo=echo)
    last = res["history"][-1]
    return {"world_size": nproc, "batch_size": batch_size, "global_batch_size": batch_size * nproc,
            "num_workers": num_workers, "epoch_s": last["seconds"], "images_per_s": last["images_per_s"],
            "test_acc": res["final_test_acc"], "backend": res["backend"], "device": res["device"]}


def article_comparison(points: dict, *, rounds: int = 3, progress=None, **kw) -> list[dict]:
    """``points``: label -> (nproc, batch_size, num_workers). Every point once per round, rounds interleaved (drift
    on a shared machine hits all alike); rows carry the median and every round's images/s (``images_per_s_runs``)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    runs = {label: [] for label in points}
    for _ in range(rounds):
        for label, (n, b, w) in points.items():
            runs[label].append(loader_run(n, b, num_workers=w, **kw))
            if progress is not None:
                progress.update(1)
    rows = []
    for label, rs in runs.items():
        ips = [r["images_per_s"] for r in rs]
        rows.append({**rs[0], "label": label, "epoch_s": statistics.median(r["epoch_s"] for r in rs),
                     "images_per_s": statistics.median(ips), "images_per_s_min": min(ips),
                     "images_per_s_max": max(ips), "images_per_s_runs": ips,
                     "test_acc": statistics.median(r["test_acc"] for r in rs)})
    return rows


def paired_ratios(rows: list[dict], label: str, base: str) -> list[float]:
    """Per round: images/s of ``label`` over ``base`` (measured in the same round)."""
    get = {r["label"]: r["images_per_s_runs"] for r in rows}
    return [a / b for a, b in zip(get[label], get[base])]


# --------------------------------------------------------------------------- elastic membership (7.2)


def elastic_membership(share_off: str | None = "1", *, join_after: float = 10.0, run_seconds: float = 12.0,
                       timeout: float = 120) -> dict:
    """Elastic membership on one machine: agent A starts ``--nnodes=1:2`` alone (``last_call_timeout=1``, so it
    does not wait for more), trains; after ``join_after`` seconds agent B joins the same c10d endpoint; A's agent
    sees the waiting node and restarts its workers in a new round with both. Returns ok (the job finished with
    world size 2 on both agents), the world sizes A's worker saw, exit codes and a one-line summary.
    ``share_off``: TORCH_DISABLE_SHARE_RDZV_TCP_STORE (None: torch's default)."""
    import os
    import re
    import subprocess
    import sys
    import tempfile
    import time
    from pathlib import Path

    from mnist_helpers.launch import popen_guarded, stop_tree
    from mnist_helpers.ports import free_port

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    if share_off is not None:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = share_off
    with tempfile.TemporaryDirectory(prefix="mnist_elastic_") as tmp:
        def agent(name):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=1",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=elastic",
                   "--rdzv-conf=last_call_timeout=1", "--max-restarts=3", "--monitor-interval=1",
                   "-m", RESTART_WORKER, "--die-rank", "-1", "--seconds", str(run_seconds),
                   "--out", str(Path(tmp) / f"{name}.json")]
            log = open(Path(tmp) / f"{name}.log", "w")
            return cmd, popen_guarded(cmd, env={**env, "PET_LOG_DIR": str(Path(tmp) / name)}, stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL), log
        t0 = time.monotonic()
        cmd_a, a, log_a = agent("a")
        time.sleep(join_after)
        cmd_b, b, log_b = agent("b")
        codes = []
        for p in (b, a):
            try:
                codes.append(p.wait(max(1.0, timeout - (time.monotonic() - t0))))
            except subprocess.TimeoutExpired:
                stop_tree(p)
                codes.append("timeout")
        log_a.close()
        log_b.close()
        text = (Path(tmp) / "a.log").read_text(errors="replace") + (Path(tmp) / "b.log").read_text(errors="replace")
        results = [json.loads(f.read_text()) for f in Path(tmp).glob("*.json")]
    seen = sorted({int(w) for w in re.findall(r"process group up, world size (\d+)", text)})
    ok = codes == [0, 0] and any(r["world_size"] == 2 for r in results)
    err = re.findall(r"(torch\.distributed\.\w+Error: [^\n]{0,120})", text)
    setting = f"TORCH_DISABLE_SHARE_RDZV_TCP_STORE={share_off}" if share_off is not None else "torch's default store"
    summary = (f"{setting}: " + (f"the job grew from world size {seen[0]} to 2 and finished" if ok and seen[0] == 1
                                 else "both agents finished with world size 2" if ok
                                 else f"failed (exit codes {codes}): {err[-1] if err else 'no error line'}"))
    return {"setting": setting, "ok": ok, "world_sizes_seen": seen, "exit_codes": codes,
            "seconds": time.monotonic() - t0, "error": err[-1] if err else None, "summary": summary,
            "command_a": " ".join(cmd_a), "join_after_s": join_after}


# --------------------------------------------------------------------------- per-process memory under DDP (5.4)

MEMORY_TABLE = {"columns": ["variant", "batch_size", "peak_mib", "persistent_mib", "gradients_mib", "activations_mib"],
                "formats": {"peak_mib": "{:.1f}", "persistent_mib": "{:.1f}", "gradients_mib": "{:.1f}",
                            "activations_mib": "{:.1f}"}}


def ddp_memory(model: str = "net", batch_sizes=(128, 64), threads: int = 1, device: str = "cpu") -> list[dict]:
    """Tensor memory of one training step (Adam, after two warm-up steps) per process: the model alone, under DDP,
    and under DDP with ``gradient_as_bucket_view=True``, at each batch size. Measured with the profiler's
    allocation replay (``mnist_helpers.memory.peak_memory``) in a world of one gloo process: DDP's reducer and its
    buckets are the same as at N processes. Call it in a fresh process (``memory.run_isolated``), since it makes a
    process group: ``run_isolated(l07.ddp_memory, ...)``. ``device="cuda"``: on GPU 0
    (a one-process nccl group; the CUDA allocator's counters measure the peak)."""
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from mnist_helpers.memory import peak_memory
    from mnist_helpers.models import build_model
    from mnist_helpers.ports import free_port
    from mnist_helpers.train import train_step

    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    rows = []
    try:
        for b in batch_sizes:
            g = torch.Generator().manual_seed(0)
            X, y = torch.randn(int(b), 1, 28, 28, generator=g), torch.randint(0, 10, (int(b),), generator=g)
            X, y = X.to(dev), y.to(dev)
            for variant in ("one process", "DDP", "DDP, gradient_as_bucket_view"):
                torch.manual_seed(0)
                m = build_model(model).to(dev)
                if variant != "one process":
                    m = DDP(m, device_ids=[0] if dev.type == "cuda" else None,
                            gradient_as_bucket_view=variant.endswith("view"))
                opt = torch.optim.Adam(m.parameters(), lr=1e-3)
                for _ in range(2):  # Adam's moments and DDP's buckets exist after the first steps
                    train_step(m, opt, X, y)
                r = peak_memory(lambda m=m, opt=opt: train_step(m, opt, X, y), dev)
                rows.append({"variant": variant, "batch_size": int(b), "device": dev.type,
                             "peak_mib": r.peak_bytes / 2**20,
                             "persistent_mib": r.persistent_bytes / 2**20,
                             "gradients_mib": r.by_category.get("gradients", 0) / 2**20,
                             "activations_mib": r.by_category.get("activations", 0) / 2**20})
                del m, opt
    finally:
        dist.destroy_process_group()
    return rows


def memory_compare(rows: list[dict], batch_size: int, ddp_batch_size: int | None = None) -> dict:
    """DDP's peak per process (at ``ddp_batch_size``, default ``batch_size``) over one process's peak at
    ``batch_size``, from :func:`ddp_memory`'s rows: ``ratio``, ``view_ratio`` (with ``gradient_as_bucket_view``),
    the peaks in MiB and the memory DDP keeps on top (``ddp_extra_persistent_mib``: its buckets). The article's
    comparison (5.4) is ``memory_compare(rows, 128, 64)``: one GPU at 128 against each of two at 64."""
    ddp_batch_size = ddp_batch_size or batch_size
    get = {(r["variant"], r["batch_size"]): r for r in rows}
    one = get[("one process", batch_size)]
    ddp, view = (get[(v, ddp_batch_size)] for v in ("DDP", "DDP, gradient_as_bucket_view"))
    same = get[("one process", ddp_batch_size)]
    return {"ratio": ddp["peak_mib"] / one["peak_mib"], "view_ratio": view["peak_mib"] / one["peak_mib"],
            "ddp_extra_persistent_mib": ddp["persistent_mib"] - same["persistent_mib"],
            "one_peak_mib": one["peak_mib"], "ddp_peak_mib": ddp["peak_mib"], "view_peak_mib": view["peak_mib"],
            "batch_size": batch_size, "ddp_batch_size": ddp_batch_size,
            "device": rows[0].get("device", "cpu")}


def memory_verdict(rows: list[dict], batch_size: int, tolerance: float = 0.10, *,
                   ddp_batch_size: int | None = None) -> dict:
    """"Per-GPU memory is about the same as single-GPU": :func:`memory_compare` plus a verdict. At the same batch
    per process: "holds with nuance" within ``tolerance`` (DDP keeps one gradient-sized copy in its buckets unless
    ``gradient_as_bucket_view=True``), "holds" when not even that shows, "does not hold here" beyond it. With
    ``ddp_batch_size`` (the article's 2 x 64 against 1 x 128): "holds" within ``tolerance`` either way, else
    "does not hold here". Memory is deterministic (no timing), so the tolerance needs no spread."""
    c = memory_compare(rows, batch_size, ddp_batch_size)
    ratio = c["ratio"]
    if ddp_batch_size and ddp_batch_size != batch_size:
        verdict = "holds" if abs(ratio - 1) <= tolerance else "does not hold here"
    else:
        verdict = ("does not hold here" if ratio > 1 + tolerance else
                   "holds" if ratio <= 1.005 else "holds with nuance")
    return {**c, "tolerance": tolerance, "verdict": verdict}


# --------------------------------------------------------------------------- what this machine can test at all

_MPI_PROBE = """
import json, torch, torch.distributed as dist
dist.init_process_group("mpi")
t = torch.ones(3)
dist.all_reduce(t)
print(json.dumps({"world_size": dist.get_world_size(), "sum": t.tolist()}))
dist.destroy_process_group()
"""
_CUDA_INDEX_PROBE = """
import json, torch
a, b = torch.ones(2, device="cuda:0"), torch.ones(2, device="cuda:1")
torch.cuda.set_device(1)
c = torch.ones(2, device="cuda")
print(json.dumps({"a": a.device.index, "b": b.device.index, "after_set_device": c.device.index}))
"""


def _probe(code: str, timeout: float) -> dict:
    """Run ``code`` in a fresh Python (CUDA and MPI stay out of the notebook's kernel); its last printed JSON line."""
    import subprocess
    import sys

    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:g} s"}
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode == 0 and lines:
        return {"ok": True, **json.loads(lines[-1])}
    err = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
    return {"ok": False, "error": err[:200]}


def mpi_probe(timeout: float = 60) -> dict:
    """Article 4: "MPI rarely". ``torch.distributed.is_mpi_available()``, asked live (torch's pip wheels are built
    without MPI); where it is available, a one-process MPI group all-reduces a tensor in a fresh Python.
    ``{"available", "ran" (None when not tried), "error"}``."""
    import torch.distributed as dist

    available = bool(dist.is_available() and dist.is_mpi_available())
    if not available:
        return {"available": False, "ran": None, "error": None}
    r = _probe(_MPI_PROBE, timeout)
    return {"available": True, "ran": r["ok"], "error": r.get("error")}


def cuda_index_probe(gpus: int | None = None, timeout: float = 120) -> dict:
    """Article 3: ``cuda:0`` / ``cuda:1`` select a GPU. With two GPUs or more, a fresh Python puts a tensor on each
    and checks where ``"cuda"`` points after ``torch.cuda.set_device(1)``. ``{"gpus", "ran" (None: fewer than
    two GPUs), "indices", "error"}``."""
    gpus = distributed.cuda_gpus() if gpus is None else int(gpus)
    if gpus < 2:
        return {"gpus": gpus, "ran": None, "indices": None, "error": None}
    r = _probe(_CUDA_INDEX_PROBE, timeout)
    ok = r["ok"] and (r["a"], r["b"], r["after_set_device"]) == (0, 1, 1)
    return {"gpus": gpus, "ran": ok, "indices": [r.get("a"), r.get("b"), r.get("after_set_device")] if r["ok"] else None,
            "error": r.get("error")}


def shard_overlap(report: dict) -> list[dict]:
    """From the shards script's report (``{"images", "world_size", "seen": {loader: [indices per rank]}}``): per
    loader, how many images each rank saw, how many more than one rank saw, and how many were seen at all."""
    n, rows = report["images"], []
    for name, per_rank in report["seen"].items():
        counts: dict[int, int] = {}
        for idx in per_rank:
            for i in set(idx):
                counts[i] = counts.get(i, 0) + 1
        rows.append({"loader": name, "world_size": report["world_size"], "images": n,
                     "per_rank": [len(idx) for idx in per_rank],
                     "seen_by_several": sum(1 for c in counts.values() if c > 1), "covered": len(counts)})
    return rows


# --------------------------------------------------------------------------- fault tolerance, the learner's script


def ft_runs_table(runs: dict) -> list[dict]:
    """One row per run of the learner's ``train_ft.py`` (``{label: results JSON}``): restarts, where the last attempt
    resumed, steps, test accuracy and the final weights' digest, for ``display.show``."""
    return [{"run": label, "world_size": r["world_size"], "restarts": r.get("restarts", 0),
             "resumed_at_step": r.get("resumed_at_step"), "steps": r.get("steps"),
             "test_acc": r["correct"] / r["count"], "test_images": r["count"], "weights_digest": r["digest"]}
            for label, r in runs.items()]


FT_RUNS_TABLE = {"formats": {"test_acc": "{:.2%}", "test_images": "{:,}"}}


def learner_ddp_script(work_dir, scratch) -> "Path | None":
    """06's ``train_ddp.py``: ``work_dir/train_ddp.py`` if notebook 06 ran in this folder, else the text of 06's
    ``%%writefile work/train_ddp.py`` cell (from ``06_ddp_fundamentals.ipynb`` beside this notebook or in the
    series' notebooks folder) written to ``scratch``; None when neither exists."""
    from pathlib import Path

    from mnist_helpers.paths import repo_root

    mine = Path(work_dir) / "train_ddp.py"
    if mine.is_file():
        return mine
    for nb in (Path("06_ddp_fundamentals.ipynb"), repo_root() / "notebooks" / "06_ddp_fundamentals.ipynb"):
        if not nb.is_file():
            continue
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if cell["cell_type"] == "code" and src.startswith("%%writefile work/train_ddp.py"):
                out = Path(scratch) / "train_ddp.py"
                out.write_text(src.partition("\n")[2] + "\n")
                return out
    return None


# What the series' ft_train.py does beyond the learner's train_ft.py: (what, a line of ft_train.py that shows it,
# why). ft_train_differences() finds each line's number, so the table points into the file shown beside it.
FT_DIFFERENCES = [
    ("a snapshot holds every rank's RNG states", "rng = gather_objects(_rng_state())",
     "ranks seeded differently (augmentation, dropout per rank) draw differently; yours keeps rank 0's for all"),
    ("the atomic write also fsyncs", "save_snapshot(snap, self.snapshot, self.cfg, self.ctx.world_size)",
     "io.atomic_save: temp file, fsync, rename: the snapshot survives a power cut, not only a kill"),
    ("the snapshot is checked before it is used", "snap = load_snapshot(self.snapshot, self.cfg, self.ctx.world_size)",
     "weights_only=True, the format, and this run's settings and world size: a snapshot of another job is refused"),
    ("a snapshot at the end of every epoch as well", "if self.snapshot is not None:",
     "a restart after an epoch's evaluation does not redo any of it"),
    ("a stop asked from outside", "def _stop_requested(self) -> bool:",
     "--stop-file: every rank agrees by one all-reduce, rank 0 snapshots that step, all exit 0 (Slurm's signal)"),
    ("the kill is built in", "os.kill(os.getpid(), signal.SIGKILL)",
     "--die-at-step K: rank 1 kills itself after step K on the first attempt (tests and section 4's agents)"),
    ("the running loss survives the restart", '"partial": dict(self.partial)',
     "the epoch's train loss counts the steps before the crash too"),
    ("mixed precision's scaler is saved", '"scaler": tr.scaler.state_dict() if tr.scaler else None',
     "with --amp on GPUs the GradScaler's scale is state too"),
]


def ft_train_differences(ft_train=None) -> list[dict]:
    """``FT_DIFFERENCES`` as rows, each with the line number of ``ft_train.py`` where it shows."""
    from pathlib import Path

    series = Path(__file__).resolve().parents[2] / "workers" / "progression" / "ft_train.py"
    path = Path(ft_train) if ft_train else series
    lines = path.read_text().splitlines()
    rows = []
    for what, anchor, why in FT_DIFFERENCES:
        at = next((i + 1 for i, ln in enumerate(lines) if anchor in ln), None)
        rows.append({"ft_train.py does": what, "line": at, "code": anchor, "why": why})
    return rows


# --------------------------------------------------------------------------- the claims, from the measurements

BUSY = "no verdict: the machine is busy"  # claims.BUSY


def _contention(c) -> dict | None:
    return c.to_dict() if hasattr(c, "to_dict") else c


def _busy(*cs) -> bool:
    return any(bool((_contention(c) or {}).get("busy")) for c in cs)


def _spread(xs) -> dict:
    from mnist_helpers.course.claims import spread

    return spread(xs)


def _comm_combined(verdicts: list[str]) -> str:
    if all(v == "holds" for v in verdicts):
        return "holds"
    if any(v == "does not hold here" for v in verdicts):
        return "does not hold here"
    return "inconclusive"


@dataclass(frozen=True, kw_only=True)
class Measured07:
    """What notebook 07 measured, the one input of :func:`claims_07` (its closing cell builds it once).

    ``plan``: :func:`plan`'s dict; ``gpu_names``: this machine's GPUs; ``model`` and ``batch`` (B) of the comparisons.
    ``article``: ``{"subset", "epochs", "workers", "rounds"}`` of :func:`article_comparison`'s run, ``article_rows``
    its rows (labels "1 x B", "2 x B/2", optionally "1 x B, 8 workers"). ``strong`` / ``weak``: the sweeps' rows
    (with ``comm_fractions``); ``timing``: ``{"repeats", "rounds"}``. ``allreduce_rows`` / ``allreduce_sizes``:
    ``scaling.allreduce_sweep``; ``ring``: ``scaling.ring_growth``; ``growth``: ``scaling.measured_growth``.
    ``memory_rows``: :func:`ddp_memory` at B and B/2. ``shards``: :func:`shard_overlap`'s rows (loaders
    "shuffle=True", "DistributedSampler", "own shard, shuffle=True"). ``mpi``: :func:`mpi_probe`; ``cuda_index``:
    :func:`cuda_index_probe`; ``cores``: this machine's. ``mixed_gpu_busbw``: ``{"same", "mixed"}`` all-reduce bus
    bandwidth of a same-model and a mixed-model GPU pair, where one was measured. The ``*_contention`` fields: the
    ``claims.Contention`` (or its dict) of each timing."""
    plan: dict
    gpu_names: list[str]
    model: str
    batch: int
    article: dict
    article_rows: list[dict]
    article_contention: object = None
    strong: list[dict]
    weak: list[dict]
    sweep_contention: object = None
    timing: dict
    allreduce_rows: list[dict]
    allreduce_sizes: list[int]
    allreduce_contention: object = None
    ring: dict
    growth: dict
    memory_rows: list[dict]
    shards: list[dict]
    mpi: dict
    cuda_index: dict
    cores: int | None = None
    mixed_gpu_busbw: dict | None = None


def claims_07(m: Measured07) -> list[dict]:
    """Notebook 07's claims, judged from what it measured (:class:`Measured07`); no I/O. One dict per claim
    (``claims.record``'s entries).

    A claim about GPUs is judged only where the comparison ran on GPUs (``plan["device"] == "cuda"``: two or more);
    elsewhere it is "not testable here" and the CPU processes' numbers go into its numbers and evidence as context,
    never judged. A timing taken on a busy machine gets "no verdict: the machine is busy".

    Each claim is judged by its own function below (``_c07_<claim>``), from the shared facts in ``ctx``."""
    plan, gpu_names, model, batch, article = m.plan, m.gpu_names, m.model, m.batch, m.article
    gpus = len(gpu_names)
    ctx = {"gpus": gpus, "gpu_names": gpu_names, "on_gpus": plan["device"] == "cuda", "model": model, "batch": batch,
           "where": (f"{plan['backend']} on {'GPUs' if plan['device'] == 'cuda' else 'the CPU'}, "
                     + ", ".join(map(str, plan["world_sizes"])) + " processes"),
           "no_gpus": f"needs 2 GPUs, this machine has {gpus}", "one": f"1 x {batch}", "two": f"2 x {batch // 2}",
           "cores": m.cores, "article": article, "article_contention": m.article_contention,
           "runs": {r["label"]: r["images_per_s_runs"] for r in m.article_rows}}
    ctx["art_regime"] = (f"{model}, the article's DataLoader (torchvision MNIST, ToTensor+Normalize, "
                         f"{article['workers']} workers per process, DistributedSampler), {article['subset']:,} images, "
                         f"epoch {article['epochs']} of {article['epochs']} timed, {article['rounds']} interleaved "
                         f"round(s); {ctx['two']} against {ctx['one']} (global batch {batch}, the article's 5.4); "
                         f"{ctx['where']}")
    out = [_c07_two_gpu_speedup(ctx),
           _c07_comm_negligible(ctx, m.strong, m.weak, m.sweep_contention, m.timing),
           _c07_ring_linear(ctx, plan, m.allreduce_rows, m.allreduce_sizes, m.allreduce_contention, m.ring, m.growth)]
    if f"{ctx['one']}, 8 workers" in ctx["runs"]:  # the full profile measures it
        out.append(_c07_workers_4_to_8(ctx))
    out += [_c07_per_gpu_memory(ctx, m.memory_rows), _c07_tree_allreduce(ctx), _c07_distributed_sampler(m.shards),
            _c07_mpi_backend(m.mpi), _c07_cuda_device_index(ctx, m.cuda_index),
            _c07_nccl_mixed_gpus(ctx, m.mixed_gpu_busbw)]
    return out


def _c07_context_only(ctx: dict, text: str, needs: str | None = None) -> tuple[str, str]:
    """A GPU claim on a machine without the GPUs: not judged, the CPU numbers as context."""
    return "not testable here", f"{needs or ctx['no_gpus']}; CPU processes (gloo), for context only: {text}"


def _c07_two_gpu_speedup(ctx: dict) -> dict:
    """5.4: 2 GPUs against 1, the article's loader, the same global batch."""
    one, two, batch = ctx["one"], ctx["two"], ctx["batch"]
    ratios = [a / b for a, b in zip(ctx["runs"][two], ctx["runs"][one])]
    s = _spread(ratios)
    text = (f"{two} vs {one} (same global batch): median {s['median']:.2f}x, range {s['min']:.2f}x to "
            f"{s['max']:.2f}x over {s['n']} round(s)")
    if not ctx["on_gpus"]:
        verdict, evidence = _c07_context_only(ctx, text)
    else:
        verdict = BUSY if _busy(ctx["article_contention"]) else speedup_verdict(ratios)
        evidence = text + ("" if s["n"] >= MIN_ROUNDS else f" (fewer than {MIN_ROUNDS} rounds: too few to judge)")
    return {"id": "07.two_gpu_speedup", "verdict": verdict, "evidence": evidence,
            "numbers": {"speedup_median": s["median"], "speedup_min": s["min"], "speedup_max": s["max"],
                        "rounds": s["n"], "ratios": ratios, "batch_one_process": batch,
                        "batch_per_process_two": batch // 2, "gpus": ctx["gpus"], "low": ARTICLE_SPEEDUP[0],
                        "high": ARTICLE_SPEEDUP[1]},
            "regime": ctx["art_regime"], "contention": _contention(ctx["article_contention"])}


def _c07_comm_negligible(ctx: dict, strong: list[dict], weak: list[dict], sweep_contention, timing: dict) -> dict:
    """4 and 5.4: communication, in both of the article's settings."""
    batch = ctx["batch"]
    w2 = next(r for r in weak if r["world_size"] == 2)
    s2 = next(r for r in strong if r["world_size"] == 2)
    settings = {f"2 x {batch} (global {2 * batch}, the article's 4)": comm_fractions(w2),
                f"2 x {batch // 2} (global {batch}, the article's 5.4)": comm_fractions(s2)}
    parts, numbers = [], {"threshold": NEGLIGIBLE_SHARE, "gpus": ctx["gpus"], "batch": batch,
                          "batch_per_process_54": batch // 2, "global_batch_4": 2 * batch}
    for (label, fr), key in zip(settings.items(), ("sec4", "sec54")):
        c = _spread(fr)
        parts.append(f"{label}: median {c['median']:.1%}, quartiles {c['q1']:.1%} to {c['q3']:.1%} "
                     f"({c['n']} blocks)")
        numbers.update({f"{key}_median": c["median"], f"{key}_q1": c["q1"], f"{key}_q3": c["q3"],
                        f"{key}_blocks": c["n"]})
    text = "communication share of a DDP step, " + "; ".join(parts)
    if not ctx["on_gpus"]:
        verdict, evidence = _c07_context_only(ctx, text)
    else:
        verdict = (BUSY if _busy(sweep_contention) else
                   _comm_combined([comm_verdict(fr) for fr in settings.values()]))
        evidence = f"{text}; negligible: under {NEGLIGIBLE_SHARE:.0%} in both"
    return {"id": "07.comm_negligible", "verdict": verdict, "evidence": evidence, "numbers": numbers,
            "regime": (f"{ctx['model']} under DDP, synthetic batches, 2 processes at {batch} each (the article's 4) "
                       f"and at {batch // 2} each (5.4), step vs no_sync() step in {timing['repeats']} interleaved "
                       f"blocks x {timing['rounds']} round(s); {ctx['where']}"),
            "contention": _contention(sweep_contention)}


def _c07_ring_linear(ctx: dict, plan: dict, allreduce_rows: list[dict], allreduce_sizes: list[int],
                     allreduce_contention, ring: dict, growth: dict) -> dict:
    """4: the ring's volume (arithmetic, plus the measured all-reduce as context)."""
    rv = ring_volume_verdict(growth=ring)
    backend = allreduce_rows[0]["backend"]
    ar_where = ("with one GPU each" if allreduce_rows[0].get("device") == "cuda"
                else f"CPU processes on {ctx['cores'] or '?'} cores (N > cores oversubscribed)")
    return {"id": "07.ring_linear", "verdict": rv["verdict"],
            "evidence": (f"ring model N={ring['n_min']}->{ring['n_max']}: per-rank bytes "
                         f"x{ring['per_rank_bytes_growth']:.2f}, total bytes and steps "
                         f"x{ring['total_bytes_growth']:.0f}; {backend} measured N={growth['n_min']}->"
                         f"{growth['n_max']}: small message x{growth['small_time_growth']:.2f}, large "
                         f"x{growth['big_time_growth']:.2f}"),
            "numbers": {**{f"model_{k}": v for k, v in ring.items()},
                        **{f"measured_{k}": v for k, v in growth.items()}},
            "regime": (f"ring model (arithmetic) plus {backend} all_reduce of {min(allreduce_sizes):,}-"
                       f"{max(allreduce_sizes):,} bytes at N={', '.join(map(str, plan['allreduce_worlds']))} "
                       f"processes, {ar_where}"),
            "contention": _contention(allreduce_contention)}


def _c07_workers_4_to_8(ctx: dict) -> dict:
    """5.4: num_workers 4 -> 8 (the full profile measures it)."""
    one, two, batch, article = ctx["one"], ctx["two"], ctx["batch"], ctx["article"]
    w8 = [a / b for a, b in zip(ctx["runs"][f"{one}, 8 workers"], ctx["runs"][one])]
    s = _spread(w8)
    text = (f"{one}, num_workers 8 vs 4: median {s['median']:.2f}x, range {s['min']:.2f}x to {s['max']:.2f}x "
            f"over {s['n']} round(s)")
    if not ctx["on_gpus"]:
        verdict, evidence = "not testable here", f"{ctx['no_gpus']}; CPU processes, for context only: {text}"
    else:
        bar = 1 + NEGLIGIBLE_SHARE
        verdict = (BUSY if _busy(ctx["article_contention"]) else "inconclusive" if s["n"] < MIN_ROUNDS else
                   "holds" if s["min"] > bar else "does not hold here" if s["max"] < bar else "inconclusive")
        evidence = text
    return {"id": "07.workers_4_to_8", "verdict": verdict, "evidence": evidence,
            "numbers": {"ratio_median": s["median"], "ratio_min": s["min"], "ratio_max": s["max"],
                        "batch": batch, "rounds": s["n"], "ratios": w8, "cores": ctx["cores"], "gpus": ctx["gpus"]},
            "regime": ctx["art_regime"].replace(f"{article['workers']} workers per process", "4 vs 8 workers")
            .replace(f"; {two} against {one} (global batch {batch}, the article's 5.4)", f"; {one}"),
            "contention": _contention(ctx["article_contention"])}


def _c07_per_gpu_memory(ctx: dict, memory_rows: list[dict]) -> dict:
    """5.4: memory per GPU, the article's comparison (one at B against each of two at B/2)."""
    batch = ctx["batch"]
    m = memory_verdict(memory_rows, batch, ddp_batch_size=batch // 2)
    same = memory_compare(memory_rows, batch // 2)
    text = (f"one process at {batch}: peak {m['one_peak_mib']:.1f} MiB; each DDP process at {batch // 2}: "
            f"{m['ddp_peak_mib']:.1f} MiB ({m['ratio']:.2f}x); at the same batch ({batch // 2}) DDP keeps "
            f"+{same['ddp_extra_persistent_mib']:.1f} MiB of buckets ({same['ratio']:.3f}x)")
    if m["device"] != "cuda":
        verdict, evidence = "not testable here", f"needs a GPU, this machine has none; CPU tensor memory for context: {text}"
    else:
        verdict, evidence = m["verdict"], f"{text}; about the same: within {m['tolerance']:.0%}"
    return {"id": "07.per_gpu_memory", "verdict": verdict, "evidence": evidence,
            "numbers": {**{k: v for k, v in m.items() if k not in ("verdict", "device")},
                        "same_batch_ratio": same["ratio"],
                        "same_batch_extra_mib": same["ddp_extra_persistent_mib"], "gpus": ctx["gpus"]},
            "regime": (f"{ctx['model']}, Adam, one training step after 2 warm-up steps, one process at {batch} "
                       f"against a DDP process at {batch // 2} (the article's 5.4), DDP in a one-process group (the "
                       f"same reducer and buckets as at N); "
                       + ("GPU 0, the CUDA allocator's peak" if m["device"] == "cuda"
                          else "CPU, the profiler's allocation replay"))}


def _c07_tree_allreduce(ctx: dict) -> dict:
    """4.4: tree all-reduce."""
    gpus = ctx["gpus"]
    return {"id": "07.tree_allreduce", "verdict": "not testable here",
            "evidence": ("gloo has no ring/tree choice to compare; NCCL's NCCL_ALGO=Tree vs Ring needs several "
                         f"GPUs (this machine: {gpus})"),
            "numbers": {"gpus": gpus},
            "regime": f"{ctx['cores'] or '?'} CPU cores, gloo" + (f", {gpus} GPU(s)" if gpus else ", no GPU")}


def _c07_distributed_sampler(shards: list[dict]) -> dict:
    """7.2: "large datasets must use DistributedSampler instead of shuffle=True"."""
    rows = {r["loader"]: r for r in shards}
    sh, ds, own = rows["shuffle=True"], rows["DistributedSampler"], rows["own shard, shuffle=True"]
    n = sh["images"]
    disjoint = {k: r["seen_by_several"] == 0 and r["covered"] == n for k, r in rows.items()}
    if sh["seen_by_several"] == 0:
        verdict = "wrong"                      # shuffle=True alone would already split the data
    elif not disjoint["DistributedSampler"]:
        verdict = "does not hold here"         # the sampler did not give distinct shards
    else:                                      # distinct shards are what matters; DistributedSampler is one way
        verdict = "holds with nuance" if disjoint["own shard, shuffle=True"] else "holds"
    return {"id": "07.distributed_sampler_big_data", "verdict": verdict,
            "evidence": (f"{sh['world_size']} processes, {n:,} images: shuffle=True alone: {sh['seen_by_several']:,} "
                         f"images seen by more than one rank; DistributedSampler: {ds['seen_by_several']:,}, "
                         f"{ds['covered']:,} covered; each rank's own shard (a strided Subset) with "
                         f"shuffle=True: {own['seen_by_several']:,}, {own['covered']:,} covered"),
            "numbers": {"images": n, "world_size": sh["world_size"],
                        **{f"{k}_{f}": r[f] for k, r in (("shuffle", sh), ("sampler", ds), ("own_shard", own))
                           for f in ("seen_by_several", "covered")}},
            "regime": (f"a dataset of {n:,} indices, DataLoader per rank, {sh['world_size']} gloo processes, the "
                       "indices each rank loaded in one epoch gathered to rank 0")}


def _c07_mpi_backend(mpi: dict) -> dict:
    """4: the MPI backend."""
    if not mpi["available"]:
        verdict, evidence = ("not testable here", "torch.distributed.is_mpi_available() is False: this torch build "
                             "has no MPI backend (pip wheels are built without it; it needs torch built from source "
                             "against an MPI library)")
    else:
        verdict = "demonstrated" if mpi["ran"] else "does not hold here"
        evidence = ("MPI is built in; a one-process MPI group all-reduced a tensor" if mpi["ran"] else
                    f"MPI is built in, but a one-process MPI group failed: {mpi['error']}")
    return {"id": "07.mpi_backend", "verdict": verdict, "evidence": evidence,
            "numbers": {"mpi_available": int(mpi["available"]), "ran": int(bool(mpi["ran"]))},
            "regime": "torch.distributed.is_mpi_available(), asked live; where True, init_process_group('mpi') "
                      "in a fresh Python"}


def _c07_cuda_device_index(ctx: dict, cuda_index: dict) -> dict:
    """3: cuda:0 / cuda:1."""
    if cuda_index["ran"] is None:
        verdict, evidence = "not testable here", f"{ctx['no_gpus']}"
    else:
        verdict = "demonstrated" if cuda_index["ran"] else "does not hold here"
        evidence = (f"tensors on cuda:0 and cuda:1 landed on GPUs {cuda_index['indices']} (the last: 'cuda' after "
                    "torch.cuda.set_device(1))" if cuda_index["indices"] else f"failed: {cuda_index['error']}")
    return {"id": "07.cuda_device_index", "verdict": verdict, "evidence": evidence,
            "numbers": {"gpus": ctx["gpus"], "indices": cuda_index.get("indices") or []},
            "regime": "a fresh Python puts a tensor on cuda:0 and one on cuda:1, then torch.cuda.set_device(1)"}


def _c07_nccl_mixed_gpus(ctx: dict, mixed_gpu_busbw: dict | None) -> dict:
    """4: NCCL and mixed GPU models."""
    gpus, models = ctx["gpus"], sorted(set(ctx["gpu_names"]))
    if mixed_gpu_busbw:
        ratio = mixed_gpu_busbw["mixed"] / mixed_gpu_busbw["same"]
        verdict = "holds" if ratio < 0.9 else "does not hold here"
        evidence = (f"NCCL all-reduce bus bandwidth, mixed pair {mixed_gpu_busbw['mixed']:.1f} GB/s vs same-model "
                    f"pair {mixed_gpu_busbw['same']:.1f} GB/s ({ratio:.2f}x)")
        numbers = {**mixed_gpu_busbw, "ratio": ratio, "gpus": gpus}
    else:
        verdict = "not testable here"
        evidence = (f"needs GPUs of two models beside a same-model pair; this machine has {gpus} GPU(s) of "
                    f"{len(models)} model(s)")
        numbers = {"gpus": gpus, "models": len(models)}
    return {"id": "07.nccl_mixed_gpus", "verdict": verdict, "evidence": evidence, "numbers": numbers,
            "regime": "NCCL all-reduce between a same-model GPU pair and a mixed-model pair" +
                      (f" ({', '.join(models)})" if models else "")}
