"""Notebook 01_resource_inspection's lesson code: the task level's starting configuration, and the
framework level measured (the sweeps behind the "2x from configuration alone" claim).

The hardware and framework levels are read by the core (``mnist_helpers.resources``); this module adds:

1. **A starting configuration for a machine, each choice with its reason.** The article's third level of
   resources is the *task* configuration: batch size, DataLoader workers, pinned memory, mixed precision,
   processes per node. ``recommend_config(machine)`` turns a machine description into those settings, one
   row ``{"setting", "value", "reason"}`` each, so a learner sees *why*; ``measured_threads()`` reads back
   the fastest thread count of this host's latest threads sweep (02 uses it)::

       from mnist_helpers.display import show
       from mnist_helpers.lessons.l01_resources import as_kwargs, recommend_config
       rows = recommend_config()                 # this machine (resources.machine_info())
       show(rows, columns=["setting", "value", "reason"])
       TrainConfig(loader="dataloader", num_workers=as_kwargs(rows)["num_workers"])

   A machine description is a dict like ``resources.machine_info()`` returns; only these keys are read:
   ``logical_cores`` (int >= 1), ``ram_gib`` (> 0), ``gpus`` (list of ``{"name", "memory_gib", optional
   "capability": "8.6"}``), optional ``usable_cores`` (cores this process may use) and ``simd`` (CPU features
   such as ``"amx_bf16"``). These are rules of thumb, the article's and ours; notebooks 03 (workers), 04
   (batch size), 05 (precision) and 07 (processes) measure whether they hold.

2. **Training-step throughput under different framework settings.** The article claims that on the same
   hardware, framework configuration alone can change utilisation about 2x. ``threads_sweep()`` measures it:
   the series' training step (``train.train_step``: the model, Adam, one batch of synthetic MNIST-shaped data)
   at ``torch.set_num_threads(1..N)`` and beyond. ``framework_sweep(configs)`` does the same for any settings
   (on a GPU: TF32 on/off, ``cudnn.benchmark``, bf16 autocast). Each returns one row per setting (a list of
   dicts) for ``display.show``.

   Each point runs in a fresh subprocess, because thread pools are per process and a fresh process keeps one
   setting from leaking into the next; it prints one JSON line::

       python -m mnist_helpers.lessons.l01_resources --threads 2 --model fastnet --batch-size 32 --steps 5

   Rounds are interleaved (1, 2, 4, 1, 2, 4, ...) so that a burst of load from other jobs on a shared machine
   hits every setting alike; each point is the median over every timed block. Reported per point:
   ``images_per_s`` and ``cpu_cores_busy`` (process CPU time / wall time during the timed blocks: the
   utilisation the claim is about).
"""
from __future__ import annotations

import argparse
import json
import math
import numbers
import os
import socket
import statistics
import subprocess
import sys
import time

import torch

from mnist_helpers import experiments
from mnist_helpers.models import build_model
from mnist_helpers.resources import cpu_info, machine_info, usable_cores
from mnist_helpers.train import check_amp, select_device, train_step

# --------------------------------------------------------------------------- 1. the task configuration

# Fake machines for the unit tests and for comparison tables in 01.
EXAMPLE_MACHINES = {
    "2-core CPU laptop": {"cpu_model": "laptop CPU", "logical_cores": 2, "ram_gib": 8, "gpus": []},
    "article's 8-core + 8 GB GPU": {
        "cpu_model": "8-core CPU", "logical_cores": 8, "ram_gib": 16,
        "gpus": [{"name": "NVIDIA GeForce RTX 3070", "memory_gib": 8, "capability": "8.6"}]},
    "8-GPU server": {
        "cpu_model": "64-core server CPU", "logical_cores": 64, "ram_gib": 512,
        "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_gib": 80, "capability": "8.0"}] * 8},
}

ARTICLE_BATCH = 128         # section 5.1; "64-256 is reasonable for MNIST"
MAX_USEFUL_WORKERS = 4      # MNIST decodes in microseconds; beyond this workers only add processes
CUDA_CONTEXT_GIB = 0.5      # what the CUDA context and kernels take before the first tensor


def _fail(msg: str):
    raise ValueError(f"{msg}. A machine description looks like "
                     "{'logical_cores': 8, 'ram_gib': 16, 'gpus': [{'name': 'RTX 3070', 'memory_gib': 8}]}; "
                     "resources.machine_info() makes one for this machine")


def _is_num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def validate_machine(machine) -> dict:
    """Return a normalised copy of ``machine`` or raise ValueError saying which field is wrong."""
    if not isinstance(machine, dict):
        _fail(f"machine must be a dict, got {type(machine).__name__}")
    m = dict(machine)
    cores = m.get("logical_cores")
    if not isinstance(cores, int) or isinstance(cores, bool) or cores < 1:
        _fail(f"machine['logical_cores'] must be an integer >= 1, got {cores!r}")
    usable = m.get("usable_cores", cores)
    if not isinstance(usable, int) or isinstance(usable, bool) or not 1 <= usable <= cores:
        _fail(f"machine['usable_cores'] must be an integer between 1 and logical_cores ({cores}), got {usable!r}")
    m["usable_cores"] = usable
    ram = m.get("ram_gib")
    if not _is_num(ram) or ram <= 0:
        _fail(f"machine['ram_gib'] must be a positive number of GiB, got {ram!r}")
    gpus = m.get("gpus", [])
    if not isinstance(gpus, (list, tuple)):
        _fail(f"machine['gpus'] must be a list (empty for none), got {type(gpus).__name__}")
    clean = []
    for i, g in enumerate(gpus):
        if not isinstance(g, dict):
            _fail(f"machine['gpus'][{i}] must be a dict with 'name' and 'memory_gib', got {g!r}")
        if not isinstance(g.get("name"), str) or not g["name"]:
            _fail(f"machine['gpus'][{i}]['name'] must be a non-empty string, got {g.get('name')!r}")
        mem = g.get("memory_gib")
        if not _is_num(mem) or mem <= 0:
            _fail(f"machine['gpus'][{i}]['memory_gib'] must be a positive number, got {mem!r}")
        cap = g.get("capability")
        if cap is not None:
            try:
                major = int(str(cap).split(".")[0])
            except ValueError:
                major = -1
            if major < 1:
                _fail(f"machine['gpus'][{i}]['capability'] must look like '8.6', got {cap!r}")
        clean.append(dict(g))
    m["gpus"] = clean
    simd = m.get("simd", [])
    if not isinstance(simd, (list, tuple, set)):
        _fail(f"machine['simd'] must be a list of CPU feature names, got {type(simd).__name__}")
    m["simd"] = list(simd)
    return m


def train_memory_gib(batch_size: int, model: str = "net") -> float:
    """Estimated memory for one training step: activations kept for backward and their gradients
    (measured with forward hooks on one image), plus weights, gradients and Adam's two moments."""
    net = build_model(model)
    acts = []
    hooks = [mod.register_forward_hook(lambda _m, _i, out: acts.append(out.numel()))
             for mod in net.modules() if not list(mod.children())]
    with torch.no_grad():
        net(torch.zeros(1, 1, 28, 28))
    for h in hooks:
        h.remove()
    # functional ReLU/pool outputs are not module outputs: count the module outputs twice for them,
    # and twice again for their gradients in backward.
    per_image = 4 * sum(acts) * 2 * 2
    params = 4 * sum(p.numel() for p in net.parameters()) * 4
    return (per_image * batch_size + params) / 2**30


def _capability(gpu: dict) -> float | None:
    cap = gpu.get("capability")
    return None if cap is None else float(str(cap))


def recommend_config(machine: dict | None = None, *, model: str = "net") -> list[dict]:
    """Rows ``{"setting", "value", "reason"}`` for device, processes_per_node, batch_size, num_workers,
    threads_per_process, pin_memory and amp. ``machine`` defaults to this machine."""
    if machine is None:
        machine = machine_info()
        cpu = cpu_info()
        machine.update(usable_cores=cpu["usable_cores"], simd=cpu["simd"])
    m = validate_machine(machine)
    cores, gpus, rows = m["usable_cores"], m["gpus"], []

    def add(setting, value, reason):
        rows.append({"setting": setting, "value": value, "reason": reason})

    if gpus:
        add("device", "cuda", f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} found ({gpus[0]['name']}): train there; the CPU feeds it")
        nproc = len(gpus)
        add("processes_per_node", nproc,
            "one DDP process per GPU (torchrun --nproc_per_node=%d); " % nproc
            + ("a single GPU needs no DDP" if nproc == 1 else "each process owns one GPU and one shard of the data"))
    else:
        add("device", "cpu", "no GPU: the CPU trains, with one intra-op thread per core")
        nproc = 1
        add("processes_per_node", 1, "on CPU one process already uses every core through intra-op threads; "
            "several gloo processes would split the same cores and add all-reduce traffic (notebook 07 measures it)")

    # batch size: the article's 128, halved only if the estimate would not fit comfortably.
    budget = min(g["memory_gib"] for g in gpus) - CUDA_CONTEXT_GIB if gpus else m["ram_gib"] / 4
    where = "the smallest GPU's memory" if gpus else "a quarter of RAM"
    batch = ARTICLE_BATCH
    while batch > 8 and train_memory_gib(batch, model) > budget / 2:
        batch //= 2
    need = train_memory_gib(batch, model)
    fits = "fits easily" if need < budget / 10 else "fits"
    add("batch_size", batch,
        f"the article's {ARTICLE_BATCH} (64-256 is reasonable for MNIST)" if batch == ARTICLE_BATCH else
        f"halved from {ARTICLE_BATCH} until the step fits in half of {where}")
    rows[-1]["reason"] += (f"; a training step needs ~{need * 1024:.0f} MiB, {fits} in {where} "
                           f"({max(budget, 0):.1f} GiB)") + ("; it is per process, so the global batch is "
                                                             f"{batch} x {nproc} = {batch * nproc}" if nproc > 1 else "")

    cores_per_proc = max(1, cores // nproc)
    if gpus:
        workers = max(1, min(MAX_USEFUL_WORKERS, cores_per_proc // 2))
        add("num_workers", workers,
            f"{cores_per_proc} core(s) per process: the article's 1/4-1/2 of the cores, leaving the rest to "
            f"the process that drives the GPU; capped at {MAX_USEFUL_WORKERS} because MNIST decodes in "
            "microseconds (notebook 03 measures the curve)")
        threads = max(1, cores_per_proc - workers)
        add("threads_per_process", threads, "the cores left per process after its loader workers; "
            "a GPU process needs few CPU threads")
    else:
        workers = cores // 4
        add("num_workers", workers,
            f"{cores} core(s) and the CPU also trains: every loader worker takes a core from the compute "
            + ("threads, and MNIST decoding is cheap, so load in the main process (0)" if workers == 0 else
               f"threads; a quarter of the cores ({workers}) is enough to decode MNIST")
            + " (notebook 03 measures it)")
        add("threads_per_process", max(1, cores - workers),
            "torch.set_num_threads: one compute thread per core not used by a loader worker "
            "(notebook 01's threads sweep shows why not more)")
    add("pin_memory", bool(gpus),
        "page-locked host memory makes host-to-GPU copies faster and asynchronous" if gpus else
        "only speeds host-to-GPU copies; meaningless without a GPU")

    if gpus:
        caps = [_capability(g) for g in gpus]
        if any(c is None for c in caps):
            add("amp", "fp16", "compute capability unknown: fp16 autocast with GradScaler works on every CUDA "
                "GPU; use bf16 (no scaler needed) if the GPU is Ampere (8.0) or newer")
        elif min(caps) >= 8.0:
            add("amp", "bf16", f"capability {min(caps):.1f} >= 8.0 supports bfloat16: fp32's range, so no "
                "GradScaler, and tensor cores for the convolutions and fc layers")
        else:
            add("amp", "fp16", f"capability {min(caps):.1f} < 8.0 has no fast bfloat16: fp16 autocast with "
                "GradScaler")
    else:
        amx = "amx_bf16" in m["simd"] or "avx512_bf16" in m["simd"]
        add("amp", "none", "CPU training in float32" + (
            "; this CPU has bf16 instructions (AMX/AVX512-BF16), so amp='bf16' may be faster: measure it first "
            "(notebook 05)" if amx else "; without bf16 instructions (AMX/AVX512-BF16) autocast only adds casts"))
    return rows


def as_kwargs(rows: list[dict]) -> dict:
    """``{setting: value}`` from ``recommend_config`` rows."""
    return {r["setting"]: r["value"] for r in rows}


def measured_threads(hostname: str | None = None, *, path=None) -> tuple[int | None, str]:
    """The fastest ``torch.set_num_threads`` value in notebook 01's latest threads sweep on this host.

    Rules of thumb assume an idle machine; a measurement on *this* machine beats them. Prefers the
    latest full-profile sweep, else the latest sweep of any profile. Returns ``(threads, reason)``,
    or ``(None, reason)`` when the experiment log holds no sweep for this host (then leave torch's default).
    """
    host = hostname or socket.gethostname()
    rows = [r for r in experiments.query(path, notebook="01", name="threads-sweep", hostname=host)
            if isinstance(r.get("images_per_s"), dict) and r["images_per_s"]]
    if not rows:
        return None, f"no threads sweep from notebook 01 for host {host!r} in the experiment log: torch's default"
    full = [r for r in rows if "full" in r["tags"].split(",")]
    row = (full or rows)[-1]
    ips = {int(k): float(v) for k, v in row["images_per_s"].items()}
    best = max(ips, key=ips.get)
    others = ", ".join(f"{t}: {v:,.0f}" for t, v in sorted(ips.items()))
    return best, (f"fastest in notebook 01's sweep of {row['time']} ({'full' if full else 'quick'} profile; "
                  f"img/s by threads {others})")


# --------------------------------------------------------------------------- 2. framework settings, measured

SETTING_KEYS = ("threads", "device", "channels_last", "tf32", "cudnn_benchmark", "amp")
WORKLOAD_KEYS = ("model", "batch_size", "steps", "warmup", "repeats", "seed")


def step_throughput(*, model: str = "net", batch_size: int = 128, threads: int | None = None,
                    device: str = "cpu", channels_last: bool = False, tf32: bool | None = None,
                    cudnn_benchmark: bool | None = None, amp: str = "none", steps: int = 10,
                    warmup: int = 3, repeats: int = 3, seed: int = 0) -> dict:
    """Time ``repeats`` blocks of ``steps`` training steps (``train.train_step``) in this process, after
    ``warmup`` steps.

    Returns ``{"images_per_s": [per block], "cpu_cores_busy": [per block], ...settings}``.
    Changes this process's thread count and backend flags: run it in a subprocess (``measure``).
    """
    for name, v in (("batch_size", batch_size), ("steps", steps), ("repeats", repeats)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if threads is not None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
        torch.set_num_threads(threads)
    dev = select_device(device)
    check_amp(amp, dev)
    if tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    if cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = cudnn_benchmark
    torch.manual_seed(seed)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = build_model(model).to(dev).to(memory_format=fmt)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    X = torch.randn(batch_size, 1, 28, 28, device=dev).contiguous(memory_format=fmt)
    y = torch.randint(0, 10, (batch_size,), device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(warmup):
        train_step(net, opt, X, y, amp=amp)
    sync()
    ips, busy = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            train_step(net, opt, X, y, amp=amp)
        sync()
        wall = time.perf_counter() - t0
        ips.append(steps * batch_size / wall)
        busy.append((time.process_time() - c0) / wall)
    return {"model": model, "batch_size": batch_size, "threads": torch.get_num_threads(), "device": str(dev),
            "channels_last": channels_last, "tf32": tf32, "cudnn_benchmark": cudnn_benchmark, "amp": amp,
            "images_per_s": ips, "cpu_cores_busy": busy}


def command(settings: dict) -> list[str]:
    """The subprocess that measures ``settings``: ``python -m mnist_helpers.lessons.l01_resources --threads 2 ...``
    (``--tf32`` / ``--no-tf32`` for the on/off settings)."""
    argv = [sys.executable, "-m", "mnist_helpers.lessons.l01_resources"]
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def measure(settings: dict, *, timeout: float = 300.0) -> dict:
    """``step_throughput(**settings)`` in a fresh Python process (its own thread pool); returns its dict."""
    unknown = set(settings) - set(SETTING_KEYS) - set(WORKLOAD_KEYS)
    if unknown:
        raise ValueError(f"unknown setting(s) {sorted(unknown)}; allowed: {', '.join(SETTING_KEYS + WORKLOAD_KEYS)}")
    env = dict(os.environ)
    if settings.get("threads"):  # the OpenMP/MKL pools read these before torch.set_num_threads runs
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(settings["threads"])
    res = subprocess.run(command(settings), capture_output=True, text=True, timeout=timeout, env=env)
    if res.returncode != 0:
        tail = "\n".join(res.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"throughput measurement {settings} failed (exit {res.returncode}):\n{tail}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def framework_sweep(configs: list[dict], *, rounds: int = 3, common: dict | None = None,
                    timeout: float = 300.0, echo: bool = True) -> list[dict]:
    """Measure each settings dict in ``configs`` ``rounds`` times, interleaved, each in a subprocess.

    Returns one row per config (show it with ``display.show``): ``label``, its settings, ``images_per_s``
    (median over all timed blocks), ``spread`` ((max - min) / median), ``cpu_cores_busy`` (median),
    ``blocks``, and ``vs_best`` (images_per_s / best). ``echo`` prints one line per measurement as it lands.
    """
    if not configs or not all(isinstance(c, dict) for c in configs):
        raise ValueError("configs must be a non-empty list of settings dicts, e.g. [{'threads': 1}, {'threads': 2}]")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    common = dict(common or {})
    samples = [{"ips": [], "busy": [], "result": None} for _ in configs]
    for r in range(rounds):
        for i, cfg in enumerate(configs):
            res = measure({**common, **cfg}, timeout=timeout)
            samples[i]["ips"] += res["images_per_s"]
            samples[i]["busy"] += res["cpu_cores_busy"]
            samples[i]["result"] = res
            if echo:
                print(f"round {r + 1}/{rounds}, {label(cfg)}: {statistics.median(res['images_per_s']):,.0f} img/s",
                      flush=True)
    rows = []
    for cfg, s in zip(configs, samples):
        med = statistics.median(s["ips"])
        rows.append({"label": label(cfg), **{k: s["result"][k] for k in SETTING_KEYS},
                     "images_per_s": med, "spread": (max(s["ips"]) - min(s["ips"])) / med,
                     "cpu_cores_busy": statistics.median(s["busy"]), "blocks": len(s["ips"])})
    best = max(r["images_per_s"] for r in rows)
    for r in rows:
        r["vs_best"] = r["images_per_s"] / best
    return rows


def label(cfg: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items()) or "default"


def thread_counts(max_threads: int | None = None, oversubscribe: bool = True) -> list[int]:
    """1, 2, 4, ... up to the usable cores (always including that number), plus twice it if ``oversubscribe``."""
    n = max_threads or usable_cores()
    counts = sorted({1, n} | {2**k for k in range(1, 8) if 2**k < n})
    return counts + [2 * n] if oversubscribe else counts


def threads_sweep(threads: list[int] | None = None, *, rounds: int = 3, echo: bool = True, **common) -> list[dict]:
    """``framework_sweep`` over ``torch.set_num_threads(n)`` for n in ``threads`` (default ``thread_counts()``)."""
    threads = threads or thread_counts()
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in threads):
        raise ValueError(f"threads must be positive integers, got {threads!r}")
    return framework_sweep([{"threads": t} for t in threads], rounds=rounds, common=common, echo=echo)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Time training steps (train.train_step) under one framework setting; "
                                             "prints one JSON line (what measure() reads).")
    ap.add_argument("--model", default="net", help="model from the registry (default: net)")
    ap.add_argument("--batch-size", type=int, default=128, help="images per step (default: 128)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    ap.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=False,
                    help="NHWC memory format for images and weights")
    ap.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=None,
                    help="TF32 for float32 matmuls and convolutions on a GPU (default: leave as is)")
    ap.add_argument("--cudnn-benchmark", action=argparse.BooleanOptionalAction, default=None,
                    help="cudnn.benchmark (default: leave as is)")
    ap.add_argument("--amp", default="none", help="autocast dtype: none, bf16, fp16 (default: none)")
    ap.add_argument("--steps", type=int, default=10, help="training steps per timed block (default: 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    ap.add_argument("--repeats", type=int, default=3, help="timed blocks (default: 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed for weights and data (default: 0)")
    args = ap.parse_args(argv)
    print(json.dumps(step_throughput(**vars(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
