"""Communication benchmarks under torchrun (introduced in 07_scaling_and_multinode).

Two modes, both launched by ``mnist_helpers.lessons.n07.scaling`` (for notebook 07's lesson and ``scripts/bench_allreduce.py``,
``scripts/bench_scaling.py``) through the launcher; rank 0 writes ``{"rows": [...]}`` to ``--out``.

``allreduce``: ``dist.all_reduce`` of float32 tensors of each ``--sizes`` (bytes). Per size: warm-up,
then ``--repeats`` timed blocks of ``--iters`` calls; a block's time is the slowest rank's (an
all-reduce is done when every rank is done). Reports latency and bus bandwidth
(``algbw * 2(N-1)/N``, the nccl-tests convention: what each link carries in a ring).

``ddp``: training steps of a model under DistributedDataParallel on synthetic MNIST-shaped batches
(compute is the same as for real images; no disk or loader in the way). Each ``--variants`` entry
``BUCKET_MB:HOOK`` (hook none, fp16, bf16) is timed in interleaved blocks against the same step under
``no_sync()`` (no all-reduce at all), so ``1 - t_no_sync / t_step`` is the fraction of the step spent
communicating (and waiting for the slowest rank). Step time is the slowest rank's, median over blocks.

    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.bench.allreduce \\
        allreduce --sizes 4096,4194304 --out /tmp/ar.json
    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.bench.allreduce \\
        ddp --batch-size 128 --variants 25:none,25:fp16 --out /tmp/ddp.json
    python -m mnist_helpers.workers.bench.allreduce ddp ...   # a world of one (no DDP, no all-reduce)
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.models import build_model
from mnist_helpers.train import train_step
from mnist_helpers.worker import entry, finish, parser, process_group

HOOKS = ("none", "fp16", "bf16")


def _slowest(seconds: float, device) -> float:
    """The slowest rank's time (what the group waits for)."""
    if not dist.is_initialized():
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_allreduce(sizes: list[int], iters: int, repeats: int, warmup: int, device) -> list[dict]:
    world = dist.get_world_size() if dist.is_initialized() else 1
    rows = []
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(x) if dist.is_initialized() else None
        times = []
        for _ in range(repeats):
            if dist.is_initialized():
                dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(iters):
                if dist.is_initialized():
                    dist.all_reduce(x)
            _sync(device)
            times.append(_slowest((time.perf_counter() - t0) / iters, device))
        t = statistics.median(times)
        size = x.numel() * 4
        algbw = size / t if t > 0 else float("nan")
        rows.append({"world_size": world, "bytes": size, "latency_us": t * 1e6, "algbw_gbps": algbw / 1e9,
                     "busbw_gbps": algbw * 2 * (world - 1) / world / 1e9,
                     "seconds_all": times})
    return rows


def _hook(name: str):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}[name]


def parse_variants(text: str) -> list[tuple[float, str]]:
    """``"25:none,1:fp16"`` -> [(25.0, "none"), (1.0, "fp16")]; raises ValueError with the format."""
    out = []
    for item in text.split(","):
        try:
            mb, hook = item.split(":")
            mb = float(mb)
        except ValueError:
            raise ValueError(f"variant {item!r} must be BUCKET_MB:HOOK, e.g. 25:none or 25:fp16") from None
        if mb <= 0 or hook not in HOOKS:
            raise ValueError(f"variant {item!r}: bucket MB must be > 0 and hook one of {', '.join(HOOKS)}")
        out.append((mb, hook))
    return out


def bench_ddp(model_name: str, batch_size: int, variants, steps: int, repeats: int, warmup: int,
              device, seed: int = 0) -> list[dict]:
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    g = torch.Generator().manual_seed(seed + rank)  # each rank its own batches, as with a sampler
    X = torch.randn(batch_size, 1, 28, 28, generator=g).to(device)
    y = torch.randint(0, 10, (batch_size,), generator=g).to(device)
    torch.manual_seed(seed)
    models = []
    for mb, hook in variants:
        model = build_model(model_name).to(device)
        if dist.is_initialized():
            ids = [device.index] if device.type == "cuda" else None
            model = DDP(model, device_ids=ids, bucket_cap_mb=mb)
            if hook != "none":
                model.register_comm_hook(None, _hook(hook))
        models.append((model, torch.optim.Adam(model.parameters(), lr=1e-3)))

    def block(model, opt, n, sync: bool) -> float:
        off = not sync and isinstance(model, DDP)
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            # The whole step under no_sync (train_step's own no_sync only skips accumulation micro-batches).
            with model.no_sync() if off else contextlib.nullcontext():
                train_step(model, opt, X, y)
        _sync(device)
        return _slowest((time.perf_counter() - t0) / n, device)

    for model, opt in models:  # warm-up: allocator, thread pools, gloo connections, DDP buckets
        block(model, opt, warmup, True)
        block(model, opt, 1, False)
    timed = {i: {"step": [], "no_sync": []} for i in range(len(models))}
    for _ in range(repeats):  # interleaved, so drift in a shared machine hits every variant alike
        for i, (model, opt) in enumerate(models):
            timed[i]["step"].append(block(model, opt, steps, True))
            timed[i]["no_sync"].append(block(model, opt, steps, False))
    n_params = sum(p.numel() for p in models[0][0].parameters())
    rows = []
    for i, (mb, hook) in enumerate(variants):
        t_step = statistics.median(timed[i]["step"])
        t_comp = statistics.median(timed[i]["no_sync"])
        rows.append({"world_size": world, "model": model_name, "batch_size": batch_size,
                     "global_batch_size": batch_size * world, "bucket_cap_mb": mb, "hook": hook,
                     "threads": torch.get_num_threads(), "step_s": t_step, "no_sync_step_s": t_comp,
                     "images_per_s": batch_size * world / t_step,
                     "comm_fraction": max(0.0, 1 - t_comp / t_step) if world > 1 else 0.0,
                     "gradient_mb": n_params * 4 / 2**20, "step_s_all": timed[i]["step"],
                     "no_sync_step_s_all": timed[i]["no_sync"]})
    return rows


@entry  # expected errors: one message with the fix, exit code 2
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)  # two modes, each a subcommand: allreduce or ddp
    sub = ap.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("allreduce", help="latency and bus bandwidth of dist.all_reduce")
    a.add_argument("--sizes", default="4096,262144,4194304", help="message sizes in bytes, comma-separated")
    a.add_argument("--iters", type=int, default=10, help="all-reduces per timed block")
    d = sub.add_parser("ddp", help="DDP step time with and without all-reduce, per bucket size and hook")
    d.add_argument("--model", default="net")
    d.add_argument("--batch-size", type=int, default=128, help="images per step, per process")
    d.add_argument("--variants", default="25:none", help="BUCKET_MB:HOOK,... (hook none, fp16, bf16)")
    d.add_argument("--steps", type=int, default=3, help="steps per timed block")
    for p in (a, d):
        p.add_argument("--repeats", type=int, default=5, help="timed blocks (the median is reported)")
        p.add_argument("--warmup", type=int, default=2)
        p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads per process")
        p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
        p.add_argument("--timeout", type=float, default=120.0, help="seconds before a stuck collective fails")
        p.add_argument("--out", default=None, help="rank 0 writes the rows (JSON) here")
    args = ap.parse_args(argv)
    for name in ("repeats", "warmup", "iters", "steps", "batch_size", "threads"):
        v = getattr(args, name, None)
        if v is not None and v < (0 if name == "warmup" else 1):
            ap.error(f"--{name.replace('_', '-')} must be a positive integer, got {v}")
    if args.threads:
        torch.set_num_threads(args.threads)
    with process_group(args.backend, args.timeout) as ctx:
        if args.mode == "allreduce":
            try:
                sizes = [int(s) for s in args.sizes.split(",")]
            except ValueError:
                ap.error(f"--sizes must be integers (bytes) separated by commas, got {args.sizes!r}")
            rows = bench_allreduce(sizes, args.iters, args.repeats, args.warmup, ctx.device)
        else:
            try:
                variants = parse_variants(args.variants)
            except ValueError as e:
                ap.error(str(e))
            rows = bench_ddp(args.model, args.batch_size, variants, args.steps, args.repeats, args.warmup,
                             ctx.device)
        for r in rows:
            r["backend"] = ctx.backend or "none"
            r["device"] = str(ctx.device)
        finish(ctx.is_main, {"rows": rows, "pid": os.getpid()}, args.out,
               f"{args.mode}: {len(rows)} rows | world_size {ctx.world_size} | backend {ctx.backend}")
    return 0


if __name__ == "__main__":
    from mnist_helpers.distributed import exit_now

    exit_now(cli())  # past an intermittent abort at interpreter shutdown (see exit_now)
