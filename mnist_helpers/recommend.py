"""A starting configuration for a machine, each choice with its reason (introduced in 01_resource_inspection).

The article's third level of resources is the *task* configuration: batch size, DataLoader workers,
pinned memory, mixed precision, processes per node. ``recommend_config(machine)`` turns a machine
description into those settings, one row each with the reason, so a learner sees *why*:

    from mnist_helpers.recommend import recommend_config, as_kwargs, format_table
    rows = recommend_config()                 # this machine (resources.machine_info())
    print(format_table(rows))
    TrainConfig(loader="dataloader", num_workers=as_kwargs(rows)["num_workers"])

A machine description is a dict like ``resources.machine_info()`` returns; only these keys are read:
``logical_cores`` (int >= 1), ``ram_gib`` (> 0), ``gpus`` (list of ``{"name", "memory_gib",
optional "capability": "8.6"}``), optional ``usable_cores`` (cores this process may use) and ``simd``
(CPU features such as ``"amx_bf16"``). These are rules of thumb, the article's and ours; notebooks 03
(workers), 04 (batch size), 05 (precision) and 07 (processes) measure whether they hold.
"""
from __future__ import annotations

import math
import numbers
import textwrap

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
    import torch

    from .models import build_model

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
        from .resources import cpu_info, machine_info

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


def format_table(rows: list[dict], width: int = 110) -> str:
    """Fixed-width table: setting, value, and the reason wrapped under it."""
    w1 = max(len("setting"), *(len(r["setting"]) for r in rows))
    w2 = max(len("value"), *(len(str(r["value"])) for r in rows))
    lines = [f"{'setting':<{w1}}  {'value':<{w2}}  reason"]
    for r in rows:
        wrapped = textwrap.wrap(r["reason"], max(30, width - w1 - w2 - 4)) or [""]
        lines.append(f"{r['setting']:<{w1}}  {str(r['value']):<{w2}}  {wrapped[0]}")
        lines += [f"{'':<{w1}}  {'':<{w2}}  {w}" for w in wrapped[1:]]
    return "\n".join(lines)


def measured_threads(hostname: str | None = None, *, path=None) -> tuple[int | None, str]:
    """The fastest ``torch.set_num_threads`` value in notebook 01's latest threads sweep on this host.

    Rules of thumb assume an idle machine; a measurement on *this* machine beats them. Prefers the
    latest full-profile sweep, else the latest sweep of any profile. Returns ``(threads, reason)``,
    or ``(None, reason)`` when the experiment log holds no sweep for this host (then leave torch's default).
    """
    import socket

    from . import experiments

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
