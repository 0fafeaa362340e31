"""Gradient accumulation under DDP, with and without ``no_sync()`` (introduced in 05_mixed_precision_and_memory).

Each optimizer step is ``--grad-accum`` micro-batches. Plain DDP all-reduces the gradients after
*every* micro-batch's backward; inside ``model.no_sync()`` it only accumulates locally, so wrapping all
but the last micro-batch all-reduces once per step and gives the same update. This worker trains two
identical replicas side by side (same weights, same batches), one each way, counts the all-reduce
calls and bytes with a DDP communication hook, times each all-reduce from its launch to its completion, and
compares the resulting weights.

Timing an asynchronous collective: the host returns from ``dist.all_reduce(..., async_op=True)`` at once, and with
NCCL the future's callbacks run as soon as the kernel is queued, before the GPU has communicated anything; a host
clock read there measures the launch. So on a GPU the hook records a CUDA event before the launch and one in the
callback (whose stream waits for the all-reduce), and reads them after the block's ``synchronize``; with gloo the
future completes when the communication has ended, and the host clock is right. ``allreduce_timing`` in the JSON
says which was used. The seconds are summed over buckets (buckets in flight together count each).

Never combine ``DDP(static_graph=True)`` with ``no_sync()``: that pairing is a known PyTorch bug
(gradients silently not synchronised); this worker keeps the default ``static_graph=False``.

    # from a notebook
    mnist_helpers.launch.torchrun("mnist_helpers.workers.bench.accum_nosync", ["--grad-accum", "4"], nproc=2, device="cpu")
    # by hand
    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.bench.accum_nosync --grad-accum 4 --out r.json
    python -m mnist_helpers.workers.bench.accum_nosync   # world size 1: no all-reduce at all

Flags: every ``TrainConfig`` field (``--batch-size`` per process and per step), plus ``--steps``
(optimizer steps per timed block), ``--repeats`` (blocks per mode, interleaved), ``--out``.
"""
from __future__ import annotations

import itertools
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.data import TensorBatches, load_mnist
from mnist_helpers.io import MiB
from mnist_helpers.resources import machine_info
from mnist_helpers.train import TrainConfig, build_training, train_one_epoch
from mnist_helpers.worker import entry, finish, parser, process_group

MODES = ("sync every micro-batch", "no_sync")


def counting_allreduce_hook(state, bucket):  # no annotations: DDP checks them, and ours are strings
    """DDP's default all-reduce (average), plus counting calls and bytes and timing launch to completion."""
    buf = bucket.buffer()
    buf.div_(dist.get_world_size())
    state["calls"] += 1
    state["bytes"] += buf.numel() * buf.element_size()
    if buf.is_cuda:  # NCCL: the future completes at launch; CUDA events time the all-reduce on the GPU
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done_on_gpu(f):
            end = torch.cuda.Event(enable_timing=True)
            end.record()  # on the callback's stream, which waits for the all-reduce's kernels
            state["events"].append((start, end))
            return f.value()[0]
        return fut.then(done_on_gpu)
    t0 = time.perf_counter()
    fut = dist.all_reduce(buf, async_op=True).get_future()

    def done(f):  # gloo completes the future when the communication has ended
        state["seconds"] += time.perf_counter() - t0
        return f.value()[0]
    return fut.then(done)


def settle(state) -> None:
    """Add the GPU-timed all-reduces to ``state["seconds"]`` (after the block's synchronize: the events are done)."""
    if state["events"]:
        torch.cuda.synchronize()
        state["seconds"] += sum(start.elapsed_time(end) for start, end in state["events"]) / 1e3
        state["events"].clear()


def timing_label(device: torch.device) -> str:
    if device.type == "cuda":
        return ("CUDA events from the all-reduce's launch to its completion on the GPU (waiting for earlier buckets "
                "and the other ranks included), summed over buckets")
    return "host clock from the all-reduce's launch to the completion of its gloo work, summed over buckets"


def main(cfg: TrainConfig, steps: int = 4, repeats: int = 3, out: str | None = None) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    with process_group("auto") as ctx:
        X, y, _, _ = load_mnist(cfg.data_root, device=ctx.device, subset=(cfg.subset or 60000, 1))
        runs = {}
        for mode in MODES:
            tr = build_training(cfg, ctx.device, steps_per_epoch=1)  # same seed: identical starting weights
            stats = {"calls": 0, "bytes": 0, "seconds": 0.0, "events": []}
            if ctx.world_size > 1:
                ids = [ctx.device.index] if ctx.device.type == "cuda" else None
                tr.model = DDP(tr.model, device_ids=ids)  # static_graph stays False: never with no_sync
                tr.model.register_comm_hook(stats, counting_allreduce_hook)
            batches = TensorBatches(X, y, cfg.batch_size, shuffle=True, drop_last=True, seed=cfg.seed,
                                    rank=ctx.rank, world_size=ctx.world_size)
            stream = itertools.chain.from_iterable(batches for _ in itertools.count())
            runs[mode] = {"tr": tr, "stats": stats, "stream": stream, "block_seconds": [],
                          "no_sync": tr.model.no_sync if (mode == "no_sync" and ctx.world_size > 1) else None}

        def block(run, n):
            out = train_one_epoch(run["tr"], itertools.islice(run["stream"], n), cfg, no_sync=run["no_sync"])
            settle(run["stats"])
            return out

        for run in runs.values():  # warm-up: one step each, then reset the counters
            block(run, 1)
            run["stats"].update(calls=0, bytes=0, seconds=0.0, events=[])
        for _ in range(repeats):  # interleaved, so a busy machine slows both modes alike
            for run in runs.values():
                run["block_seconds"].append(block(run, steps)["seconds"])
        total_steps = steps * repeats
        rows = []
        for mode, run in runs.items():
            s = run["stats"]
            rows.append({"mode": mode, "grad_accum": cfg.grad_accum, "allreduce_calls_per_step": s["calls"] / total_steps,
                         "allreduce_mib_per_step": s["bytes"] / total_steps / MiB,
                         "allreduce_seconds_per_step": s["seconds"] / total_steps,
                         "step_seconds": statistics.median(run["block_seconds"]) / steps})
        params = [torch.cat([p.detach().flatten() for p in run["tr"].model.parameters()]) for run in runs.values()]
        result = {"world_size": ctx.world_size, "backend": ctx.backend, "device": str(ctx.device),
                  "config": cfg.to_dict(), "steps_per_block": steps, "repeats": repeats, "rows": rows,
                  "allreduce_timing": (timing_label(ctx.device) if ctx.world_size > 1
                                       else "none: no all-reduce at world size 1"),
                  "max_weight_diff_between_modes": float((params[0] - params[1]).abs().max()),
                  "machine": machine_info()}
        return finish(ctx.is_main, result, out, *(
            f"{r['mode']}: {r['allreduce_calls_per_step']:.1f} all-reduces/step, {r['allreduce_mib_per_step']:.1f} "
            f"MiB/step, {1e3 * r['step_seconds']:.1f} ms/step" for r in rows))


@entry  # expected errors: one message with the fix, exit code 2
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    TrainConfig.add_arguments(ap)
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per timed block")
    ap.add_argument("--repeats", type=int, default=3, help="timed blocks per mode (median)")
    ap.add_argument("--out", default=None, help="rank 0 writes the results JSON here")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        ap.error(f"--steps and --repeats must be positive integers, got {args.steps} and {args.repeats}")
    try:
        cfg = TrainConfig.from_namespace(args)
    except ValueError as e:
        ap.error(str(e))
    if cfg.grad_accum < 2:
        ap.error("--grad-accum must be at least 2: no_sync only matters with several micro-batches per step")
    main(cfg, args.steps, args.repeats, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
