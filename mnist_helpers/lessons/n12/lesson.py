"""Lesson 12, DDP in depth (12_ddp_in_depth, the appendix to 06): what its kernel runs itself, and its claims.

Everything else 12 runs is a worker started by the launcher (``workers/demos``: ``local_rank_bug``, ``sampler``,
``seeding``, ``syncbn``, ``validation``; ``workers/progression``; ``workers/demos/article_ddp.py``, the article's 5.2
script). This module holds:

**mp.spawn from a notebook** (article section 5.2). ``torch.multiprocessing.spawn`` starts fresh Python
processes and sends each one the function to run *by reference*: its module and name, pickled. A child
finds the function by importing that module. A function defined in a script lives in ``__main__``, and
the child re-runs the script's file (under the name ``__mp_main__``) to find it. A function defined in a
notebook cell also lives in ``__main__``, but the kernel's ``__main__`` has no file to re-run, so every
child dies with ``AttributeError: Can't get attribute 'train' on <module '__main__' (built-in)>`` and the
parent raises ``ProcessExitedException``. ``python -c`` has a ``__main__`` without a file just like a
kernel, so :func:`spawn_like_a_notebook` runs the reproduction of notebook 08
(``workers/bugs/spawn_main.py``, its text passed with ``-c``) and reports what the children and the
parent said; :func:`spawn_from_a_file` runs the very same file as a script, where it works. Hence the
workers live in the package, and notebooks start them with torchrun through ``mnist_helpers.launch``.

**What init_process_group needs** (article sections 4 and 5.2). ``dist.init_process_group(backend)`` with
the default ``init_method="env://"`` reads four environment variables: ``RANK`` and ``WORLD_SIZE`` (who am
I, how many are we) and ``MASTER_ADDR`` and ``MASTER_PORT`` (where rank 0 hosts the rendezvous store).
``mp.spawn`` code sets them itself (the article's ``setup()``); torchrun sets them for every process (its
rendezvous picks the port). :func:`init_requirements` runs this module as a script in a fresh process (a
process group is made once per process), which adds the variables one at a time with gloo and records
each error, then asks for NCCL (GPUs only), and returns the JSON it prints.

**DataParallel vs DDP** (>= 2 GPUs): :func:`dp_vs_ddp` times both in interleaved rounds.

**The claims**: :func:`claims_12` judges them from one :class:`Measured12` record of the notebook's runs (pure:
measurements in, the entries ``claims.record`` writes to ``results/12_ddp_in_depth.json`` out;
tests/notebooks/test_n12_claims.py).

    from mnist_helpers.lessons.n12.lesson import init_requirements, spawn_like_a_notebook
    spawn_like_a_notebook()["child_error"]   # AttributeError: Can't get attribute 'train' on <module '__main__' ...
    init_requirements()["env_steps"]         # {"nothing set": "ValueError: ... RANK expected", ...}
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import torch
import torch.distributed as dist

from mnist_helpers.course.claims import GLOO
from mnist_helpers.launch import child_env
from mnist_helpers.ports import free_port
from mnist_helpers.resources import gpu_count

# 08's reproduction of the failure: the one copy of the code both notebooks run.
SPAWN_MAIN = Path(find_spec("mnist_helpers.workers.bugs.spawn_main").origin)


# --------------------------------------------------------------------------- mp.spawn from a notebook

def _run_spawn(command: list[str], nprocs: int, timeout: float) -> dict:
    env = {**child_env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([*command, "--nprocs", str(nprocs)], capture_output=True, text=True, timeout=timeout,
                          env=env)
    text = proc.stdout + proc.stderr
    errors = [ln for ln in text.splitlines() if ln and not ln.startswith(" ") and "Error" in ln.split(":")[0]
              or ln.startswith("torch.multiprocessing")]
    child = next((ln for ln in errors if "Can't get attribute" in ln), None)
    parent = next((ln for ln in errors if "ProcessExitedException" in ln or "ProcessRaisedException" in ln), None)
    finished = proc.returncode == 0 and text.count("hello from spawned rank") == nprocs
    return {"returncode": proc.returncode, "child_error": child, "parent_error": parent,
            "finished": finished, "output": text[-3000:]}


def spawn_like_a_notebook(nprocs: int = 2, timeout: float = 120) -> dict:
    """``workers/bugs/spawn_main.py`` run as ``python -c``: ``__main__`` has no file, as in a Jupyter kernel.

    Returns ``{"returncode", "child_error", "parent_error", "finished", "output"}``."""
    return _run_spawn([sys.executable, "-c", SPAWN_MAIN.read_text()], nprocs, timeout)


def spawn_from_a_file(nprocs: int = 2, timeout: float = 120) -> dict:
    """The same file run as a script: the children re-import it and find ``train``."""
    return _run_spawn([sys.executable, str(SPAWN_MAIN)], nprocs, timeout)


# --------------------------------------------------------------------------- what init_process_group needs

def _attempt(backend: str, **kwargs) -> str:
    try:
        dist.init_process_group(backend, **kwargs)
    except Exception as e:  # noqa: BLE001 - the message is the measurement
        return f"{type(e).__name__}: {str(e).splitlines()[0][:240]}"
    try:
        return f"ok: rank {dist.get_rank()} of {dist.get_world_size()}, backend {dist.get_backend()}"
    finally:
        dist.destroy_process_group()


def _probe() -> dict:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    steps = {}
    steps["nothing set"] = _attempt("gloo")
    os.environ.update(RANK="0", WORLD_SIZE="1")
    steps["RANK, WORLD_SIZE"] = _attempt("gloo")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    steps["+ MASTER_ADDR"] = _attempt("gloo")
    os.environ["MASTER_PORT"] = str(free_port())
    steps["+ MASTER_PORT"] = _attempt("gloo")
    return {"env_steps": steps, "nccl": _attempt("nccl"),
            "available": {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
                          "mpi": dist.is_mpi_available()},
            "cuda_devices": gpu_count()}


def init_requirements(timeout: float = 120) -> dict:
    """Run the probe in a fresh Python process and return ``{"env_steps", "nccl", "available", "cuda_devices"}``."""
    proc = subprocess.run([sys.executable, "-m", "mnist_helpers.lessons.n12.lesson"], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"the backend probe failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(_probe()))


# --------------------------------------------------------------------------- DataParallel vs DDP (>= 2 GPUs)

DP_VS_DDP_WORKER = "mnist_helpers.workers.bench.allreduce"


def _time_dp(model, X, y, *, steps: int, warmup: int, repeats: int, device) -> list[float]:
    """DataParallel in this process: ``warmup`` steps, then ``repeats`` blocks of ``steps`` steps, each block
    synchronised; seconds per step of every block (the same protocol as the DDP benchmark worker)."""
    import time

    from mnist_helpers.train import synchronize, train_step

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(warmup):
        train_step(model, opt, X, y)
    blocks = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            train_step(model, opt, X, y)
        synchronize(device)
        blocks.append((time.perf_counter() - t0) / steps)
    return blocks


def dp_vs_ddp(processes: int, *, batch_size: int = 128, steps: int = 20, warmup: int = 10, repeats: int = 5,
              rounds: int = 2, device: str | None = None, model: str = "net", echo: bool = False) -> list[dict]:
    """``nn.DataParallel`` (one process driving ``processes`` GPUs) against DDP (``processes`` processes, one GPU
    each) at the same global batch (``batch_size`` per GPU), both warmed up with ``warmup`` steps and timed over
    ``repeats`` blocks of ``steps`` steps (median), in ``rounds`` interleaved rounds. One row per method and round,
    with its device. ``device``: ``comparison_device(processes)`` by default; on ``"cpu"`` DataParallel has no GPU
    to split over and just calls the module (what the unit test exercises)."""
    from torch import nn

    from mnist_helpers.distributed import comparison_device
    from mnist_helpers.launch import torchrun
    from mnist_helpers.models import build_model

    device = device or comparison_device(processes)
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    global_batch = batch_size * processes
    g = torch.Generator().manual_seed(0)
    X = torch.randn(global_batch, 1, 28, 28, generator=g).to(dev)
    y = torch.randint(0, 10, (global_batch,), generator=g).to(dev)
    torch.manual_seed(0)
    dp = nn.DataParallel(build_model(model).to(dev))
    common = {"device": device, "global_batch_size": global_batch, "warmup_steps": warmup, "timed_steps": steps,
              "repeats": repeats}
    rows = []
    for r in range(rounds):
        blocks = _time_dp(dp, X, y, steps=steps, warmup=warmup if r == 0 else 0, repeats=repeats, device=dev)
        step_s = statistics.median(blocks)
        rows.append({"round": r, "method": f"DataParallel, 1 process x {processes} "
                                           f"{'GPUs' if device == 'cuda' else 'CPU (no split)'}",
                     "processes": 1, **common, "step_s": step_s, "images_per_s": global_batch / step_s})
        res = torchrun(DP_VS_DDP_WORKER, ["ddp", "--model", model, "--batch-size", batch_size, "--variants", "25:none",
                                          "--steps", steps, "--repeats", repeats, "--warmup", warmup],
                       nproc=processes, device=device, echo=echo, provision=False, timeout=600)
        ddp = res["rows"][0]
        rows.append({"round": r, "method": f"DDP, {processes} processes", "processes": processes, **common,
                     "step_s": ddp["step_s"], "images_per_s": ddp["images_per_s"]})
    return rows


def dp_vs_ddp_verdict(rows: list[dict]) -> str:
    """``holds`` (DDP faster) or ``does not hold here`` when one method is faster in every round, else
    ``inconclusive``; ``not testable here`` without rows (fewer than 2 GPUs) or on the CPU."""
    if not rows or rows[0]["device"] != "cuda":
        return "not testable here"
    rounds = sorted({r["round"] for r in rows})
    ratio = [next(r["step_s"] for r in rows if r["round"] == k and r["processes"] == 1)
             / next(r["step_s"] for r in rows if r["round"] == k and r["processes"] > 1) for k in rounds]
    if all(x > 1.05 for x in ratio):
        return "holds"
    if all(x < 1 / 1.05 for x in ratio):
        return "does not hold here"
    return "inconclusive"


# --------------------------------------------------------------------------- the notebook's claims, from its runs

def syncbn_claim(sb: dict) -> dict:
    """12.syncbn from the syncbn demo's summary. The article's API is ``nn.SyncBatchNorm.convert_sync_batchnorm``,
    which refuses CPU tensors: on a CPU the claim is *not testable here*, and the same collectives written by hand
    (``CpuSyncBatchNorm``) are the context, not the verdict."""
    mechanism = (sb["running_stats_spread_plain"] > 1e-4 and sb["running_stats_spread_sync"] < 1e-6
                 and sb["sync_vs_single_process"] < 1e-9 and sb["plain_vs_single_process"] > 1e-3)
    impl = sb["sync_impl"].split(" (")[0]
    article_api = impl == "nn.SyncBatchNorm"
    numbers = {k: sb[k] for k in ("running_stats_spread_plain", "running_stats_spread_sync",
                                  "plain_vs_single_process", "sync_vs_single_process")}
    measured = (f"running-stat spread plain {sb['running_stats_spread_plain']:.1e} vs synced "
                f"{sb['running_stats_spread_sync']:.1e}; one step (outputs, input and weight grads) vs 1 process: "
                f"plain {sb['plain_vs_single_process']:.1e}, synced {sb['sync_vs_single_process']:.1e}")
    if article_api:
        verdict = "holds" if mechanism else "does not hold here"
        evidence = f"nn.SyncBatchNorm (convert_sync_batchnorm before DDP): {measured}"
    else:
        verdict = "not testable here"
        evidence = (f"nn.SyncBatchNorm refuses CPU tensors, so the article's code needs GPUs; the same collectives "
                    f"written by hand ({impl}): {measured}")
    return dict(verdict=verdict, evidence=evidence, numbers=numbers,
                regime=f"NetBN, 32 images per process, 2 processes, {sb['steps']} steps, one-step comparison in "
                       f"float64; {impl}; {GLOO}")


def rank0_eval_claim(v: dict, load=None) -> dict:
    """12.rank0_eval_waits from the validation demo's summary (its largest world size). That the other ranks wait
    while rank 0 scores alone is true by construction; the claim's substance is that this costs time, so the verdict
    compares the wall time of the whole validation step, rank 0 alone against the work split over the ranks (the
    exact method), over interleaved rounds: *holds* when rank 0 alone is at least 1.2x slower and the rounds do not
    overlap, *does not hold here* when it is not slower at all (the rounds do not overlap the other way, or within
    5%), *inconclusive* otherwise."""
    from mnist_helpers.course import claims

    r0, ex = v["rank0_only_rounds_s"], v["exact_rounds_s"]
    m0, mx = statistics.median(r0), statistics.median(ex)
    ratio = m0 / mx
    apart = claims.separated(r0, ex)
    if ratio >= 1.2 and apart:
        verdict = "holds"
    elif (apart and m0 < mx) or abs(ratio - 1) <= 0.05:
        verdict = "does not hold here"
    else:
        verdict = "inconclusive"
    return dict(verdict=claims.busy_verdict(load) or verdict,
                evidence=(f"{v['world_size']} processes, 10,000 test images: the validation step took {m0:.2f} s with "
                          f"rank 0 scoring alone and {mx:.2f} s split over the ranks ({ratio:.2f}x; medians of "
                          f"{len(r0)} interleaved rounds, {'spreads apart' if apart else 'spreads overlap'}); "
                          f"meanwhile the others waited {v['others_wait_fraction']:.0%} of rank 0's step"),
                numbers={"rank0_only_s": m0, "split_s": mx, "ratio": ratio, "rank0_only_rounds_s": r0,
                         "split_rounds_s": ex, "others_wait_share": v["others_wait_fraction"]},
                regime=f"FastNet(width=8), 10,000 test images, {v['world_size']} processes on this machine's cores, "
                       f"{len(r0)} interleaved rounds; {GLOO}",
                contention=load)


SEEDING_REGIME = "Net built with per-rank seeds, 2 processes; random pixel shifts as the augmentation"


def same_seed_judgement(n: dict) -> tuple[str, str]:
    """12.same_seed's verdict and evidence from the seeding demo's counts (``demos/seeding.py``'s summary: distinct
    initial weights with a different seed per rank before and after wrapping in DDP, distinct augmentation streams
    with one seed and with ``seed + rank``). The article gives two reasons for one seed everywhere: equal replicas,
    and reproducibility. *wrong* when DDP equalised the weights without a common seed (it broadcasts rank 0's at
    construction) and one seed gave every rank the same augmentation stream (fewer streams than ranks): the first
    reason does not need it, and the data side is harmed by it (``seed + rank`` gives each rank its own).
    *holds* (*with nuance* when one seed also duplicates the augmentation) when the replicas stayed different
    without it; *does not hold here* when DDP equalised them and one seed did not duplicate anything;
    *inconclusive* when per-rank seeds did not give different weights to begin with (nothing was tested)."""
    ws = n["world_size"]
    dup = n["distinct_augmentation_same_seed"] < ws
    if n["distinct_weights_before_ddp"] < 2:
        verdict = "inconclusive"
    elif n["distinct_weights_after_ddp"] > 1:
        verdict = "holds with nuance" if dup else "holds"
    else:
        verdict = "wrong" if dup else "does not hold here"
    return verdict, (
        f"equal weights need no equal seed: with a different seed per rank, {n['distinct_weights_before_ddp']} "
        f"distinct initial weights before DDP, {n['distinct_weights_after_ddp']} after (DDP broadcasts rank 0's at "
        f"construction); one seed on every rank: {n['distinct_augmentation_same_seed']} augmentation stream(s) for "
        f"{ws} ranks" + (" (every rank draws the same shifts)" if dup else "") + f"; seed + rank: "
        f"{n['distinct_augmentation_per_rank_seed']}, so the data-side randomness wants seed + rank")


def rejudge(entry: dict) -> dict:
    """A kept 12.same_seed entry judged again by today's rule (``same_seed_judgement``) from its own numbers; a
    file kept before the numbers held ``world_size`` ran 2 processes (its regime says so)."""
    from mnist_helpers.course.claims import rule
    if entry["id"] != "12.same_seed":
        raise ValueError(f"l12.rejudge judges 12.same_seed, not {entry['id']}")
    n = {**entry["numbers"]}
    n.setdefault("world_size", 2)
    verdict, evidence = same_seed_judgement(n)
    return {**entry, "verdict": verdict, "evidence": evidence, "numbers": n, "rule": rule(entry["id"])}


@dataclass(frozen=True, kw_only=True)
class Measured12:
    """What notebook 12 measured, the one input of :func:`claims_12` (its closing cell builds it once).

    ``demos``: ``{processes: the demo workers' results}`` (2: local_rank_bug, sampler, seeding, syncbn; 3: sampler,
    validation); ``demos_load``: the ``claims.Contention`` of those launches (None: not measured); ``article``: the
    article's 5.2 script's JSON; ``spawn_run``: ``ddp_train --spawn 2``'s; ``like_notebook``:
    :func:`spawn_like_a_notebook`'s; ``backends``: :func:`init_requirements`'s; ``dp_rows``: :func:`dp_vs_ddp`'s
    (empty with fewer than 2 GPUs); ``gpus``: this machine's GPU count."""
    demos: dict
    demos_load: object
    article: dict
    spawn_run: dict
    like_notebook: dict
    backends: dict
    dp_rows: list[dict]
    gpus: int


def claims_12(m: Measured12) -> list[dict]:
    """Every claim of 12, judged from what the notebook measured (:class:`Measured12`); no I/O. One dict per claim
    (``claims.record``'s entries)."""
    return [*_c12_torchrun(m.demos), _c12_sampler(m.demos), *_c12_seeding_and_syncbn(m.demos),
            *_c12_validation(m.demos, m.demos_load), _c12_backends(m.backends), _c12_dp_vs_ddp(m.dp_rows, m.gpus),
            _c12_spawn(m.article, m.spawn_run, m.like_notebook)]


def _c12_torchrun(demos: dict) -> list[dict]:
    """12.local_rank_arg and 12.torchrun_env."""
    lr = demos[2]["local_rank_bug"]["summary"]
    local_rank_bug = (not lr["any_local_rank_argument"]) and lr["article_distinct_devices"] == 1
    env_vars = set(lr["env_set_by_torchrun"])
    return [
        dict(id="12.local_rank_arg", verdict="wrong" if local_rank_bug else "holds",
             evidence=(f"torchrun passed --local_rank to {int(lr['any_local_rank_argument'])} process(es); the "
                       f"article's parser gave {lr['article_distinct_devices']} distinct device(s) for 2 processes"),
             numbers={"article_distinct_devices": lr["article_distinct_devices"],
                      "local_rank_arguments": int(lr["any_local_rank_argument"])},
             regime="the article's argparse under torchrun --nproc-per-node=2 (device names computed, no GPU needed)"),
        dict(id="12.torchrun_env",
             verdict="holds" if {"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"} <= env_vars
             else "does not hold here",
             evidence=f"set by torchrun in every process: {', '.join(sorted(env_vars))}",
             numbers={"variables": len(env_vars)}, regime="torchrun --standalone --nproc-per-node=2")]


def _c12_sampler(demos: dict) -> dict:
    """12.distributed_sampler: every world size's shards cover the 60,000 training images, none overlapping."""
    sm = {n: demos[n]["sampler"]["summary"] for n in sorted(demos)}
    shards_ok = all(s["covered"] == 60_000 and s["overlapping"] == 0 for s in sm.values())
    return dict(id="12.distributed_sampler", verdict="holds" if shards_ok else "does not hold here",
                evidence=(f"{' and '.join(str(n) for n in sm)} ranks: "
                          f"{' and '.join(format(s['covered'], ',') for s in sm.values())} images covered, "
                          f"overlapping {' and '.join(str(s['overlapping']) for s in sm.values())}"),
                numbers={**{f"covered_{n}": s["covered"] for n, s in sm.items()},
                         **{f"overlapping_{n}": s["overlapping"] for n, s in sm.items()}},
                regime=f"MNIST training set (60,000), DistributedSampler over 3 epochs, "
                       f"{' and '.join(str(n) for n in sm)} ranks; {GLOO}")


def _c12_seeding_and_syncbn(demos: dict) -> list[dict]:
    """12.same_seed and 12.syncbn."""
    sd = demos[2]["seeding"]["summary"]
    n = {k: sd[k] for k in ("world_size", "distinct_weights_before_ddp", "distinct_weights_after_ddp",
                            "distinct_augmentation_same_seed", "distinct_augmentation_per_rank_seed") if k in sd}
    n.setdefault("world_size", 2)
    verdict, evidence = same_seed_judgement(n)
    return [dict(id="12.same_seed", verdict=verdict, evidence=evidence, numbers=n, regime=SEEDING_REGIME),
            dict(id="12.syncbn", **syncbn_claim(demos[2]["syncbn"]["summary"]))]


def _c12_validation(demos: dict, demos_load) -> list[dict]:
    """12.rank0_eval_waits and 12.distributed_validation, from the validation demo's largest world size."""
    val = {n: demos[n]["validation"]["summary"] for n in sorted(demos) if "validation" in demos[n]}
    v = val[max(val)]
    pads = v["sampler_count"] > v["test_images"] and v["exact_count"] == v["test_images"] and v["exact_equals_single"]
    return [
        dict(id="12.rank0_eval_waits", **rank0_eval_claim(v, demos_load)),
        dict(id="12.distributed_validation", verdict="holds with nuance" if pads else "holds",
             evidence=(f"{v['world_size']} ranks: DistributedSampler counts {v['sampler_count']:,} images (padded), "
                       f"the exact method {v['exact_count']:,} with the single process's accuracy "
                       f"{v['exact_acc']:.2%}"),
             numbers={"sampler_count": v["sampler_count"], "exact_count": v["exact_count"],
                      "exact_acc": v["exact_acc"], "test_images": v["test_images"]},
             regime=f"FastNet(width=8), 10,000 test images, {v['world_size']} processes; {GLOO}")]


def _c12_backends(backends: dict) -> dict:
    """12.nccl_gloo."""
    joins = backends["env_steps"]["+ MASTER_PORT"].startswith("ok")
    nccl_gpu_only = backends["cuda_devices"] > 0 or "only supported with GPUs" in backends["nccl"]
    return dict(id="12.nccl_gloo", verdict="holds" if nccl_gpu_only and joins else "does not hold here",
                evidence=(f"gloo on the CPU: {'joins' if joins else 'fails'}; nccl with {backends['cuda_devices']} "
                          f"CUDA device(s): {'joins' if backends['nccl'].startswith('ok') else 'refused (needs GPUs)'}"),
                numbers={"cuda_devices": backends["cuda_devices"]},
                regime="init_process_group in a fresh process, world of one")


def _c12_dp_vs_ddp(dp_rows: list[dict], gpus: int) -> dict:
    """12.dp_vs_ddp (GPUs only)."""
    verdict = dp_vs_ddp_verdict(dp_rows)
    if verdict == "not testable here":
        return dict(id="12.dp_vs_ddp", verdict=verdict,
                    evidence=f"DataParallel needs >= 2 GPUs; this machine has {gpus}",
                    numbers={"gpus": gpus}, regime="needs >= 2 GPUs")
    dp = statistics.median(r["images_per_s"] for r in dp_rows if r["processes"] == 1)
    dd = statistics.median(r["images_per_s"] for r in dp_rows if r["processes"] > 1)
    first = dp_rows[0]
    return dict(id="12.dp_vs_ddp", verdict=verdict,
                evidence=f"DataParallel {dp:,.0f} vs DDP {dd:,.0f} images/s (medians over rounds)",
                numbers={"dp_images_per_s": dp, "ddp_images_per_s": dd, "gpus": gpus},
                regime=(f"Net, batch {first['global_batch_size'] // gpus} per GPU, {gpus} GPUs, {first['warmup_steps']} "
                        f"warm-up + {first['repeats']} x {first['timed_steps']} timed steps each, "
                        f"{len({r['round'] for r in dp_rows})} interleaved rounds"))


def _c12_spawn(article: dict, spawn_run: dict, like_notebook: dict) -> dict:
    """12.mp_spawn."""
    article_replicas = len({r["param_digest"] for r in article["ranks"]})
    spawn_fails = like_notebook["returncode"] != 0 and "Can't get attribute" in (like_notebook["child_error"] or "")
    spawn_ok = article_replicas == 1 and spawn_run["world_size"] == 2
    return dict(id="12.mp_spawn", verdict=("holds with nuance" if spawn_ok and spawn_fails else "holds" if spawn_ok
                                           else "does not hold here"),
                evidence=(f"the article's script (mp.spawn, 2 processes) ran, {article_replicas} distinct replica(s); "
                          f"mp.spawn of a notebook function: {'fails' if spawn_fails else 'works'} (exit code "
                          f"{like_notebook['returncode']}): workers must live in a file, or be forked"),
                numbers={"article_distinct_replicas": article_replicas,
                         "notebook_spawn_returncode": like_notebook["returncode"],
                         "article_steps_per_epoch": article["ranks"][0]["steps"]},
                regime=f"the article's 5.2 script as a subprocess, free port; {GLOO}")
