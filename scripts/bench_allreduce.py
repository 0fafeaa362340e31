"""AllReduce micro-benchmark and DDP communication settings (notebook 07_scaling_and_multinode).

1. ``dist.all_reduce`` time and bus bandwidth per message size (4 KiB .. 16 MiB) and world size,
   gloo on CPU (NCCL when every process has a GPU), next to the ring model: each rank sends
   2(N-1)/N times the message (per-rank volume nearly constant in N), while the total over all ranks
   2(N-1) x S and the number of steps 2(N-1) (the latency term) grow linearly. World sizes above the
   number of cores are oversubscribed (processes wait for a core).
2. DDP steps of the article's Net per ``bucket_cap_mb`` (25, the default, and 1) and compression hook
   (fp16, bf16), interleaved in one process group, each against the same step without all-reduce.

Writes results/bench_allreduce.json (machine and date inside).

    python scripts/bench_allreduce.py                      # world sizes 2, 3 and 4
    python scripts/bench_allreduce.py --world-sizes 2,4,8  # on a GPU box: device=cuda, one per GPU
    python scripts/bench_allreduce.py --quick
"""
from __future__ import annotations

import argparse
import datetime
import time

import torch

from mnist_helpers.course.display import show
from mnist_helpers.errors import cli_entry
from mnist_helpers.io import check_writable, write_json
from mnist_helpers.paths import results_dir
from mnist_helpers.resources import describe, machine_info
from mnist_helpers.lessons.n07.scaling import (ALLREDUCE_TABLE, DDP_VARIANTS_TABLE, allreduce_sweep, ddp_variants, latency_growth,
                                   measured_growth, ring_volume_verdict)


@cli_entry  # expected errors: one message with the fix, exit code 2
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-sizes", default="2,3,4")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    ap.add_argument("--out", default=None, help="JSON path (default results/bench_allreduce.json)")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        worlds = [int(n) for n in args.world_sizes.split(",")]
    except ValueError:
        ap.error(f"--world-sizes must be comma-separated integers, e.g. 2,4; got {args.world_sizes!r}")
    if min(worlds) < 1:
        ap.error(f"--world-sizes must be positive, got {args.world_sizes!r}")
    out = check_writable(args.out or results_dir() / "bench_allreduce.json", "--out")
    sizes = [4096, 65536, 1 << 20] if args.quick else [4096, 65536, 1 << 20, 4 << 20, 16 << 20]
    print(f"machine: {describe()} | device {device}")
    t0 = time.perf_counter()
    rows = allreduce_sweep(sizes, worlds, iters=3 if args.quick else 10, repeats=2 if args.quick else 5,
                           device=device)
    show(rows, **ALLREDUCE_TABLE)
    growth = latency_growth(rows)
    verdict = ring_volume_verdict((2, 64))  # the model over a real cluster's range; the table shows what we measured
    print(f"ring model, N={verdict['n_min']} -> {verdict['n_max']}: per-rank bytes x{verdict['per_rank_bytes_growth']:.2f}, "
          f"total bytes and steps x{verdict['total_bytes_growth']:.0f} (linear would be "
          f"x{verdict['linear_would_be']:.0f}): 'volume grows linearly' {verdict['verdict']}")
    measured = measured_growth(rows) if len(worlds) > 1 else None
    if measured:
        print(f"measured N={measured['n_min']} -> {measured['n_max']}: smallest message x"
              f"{measured['small_time_growth']:.2f}, largest x{measured['big_time_growth']:.2f}")
    variants = [(25, "none"), (1, "none"), (25, "fp16"), (25, "bf16")]
    ddp = ddp_variants(variants, model="fastnet" if args.quick else "net", batch_size=128,
                       steps=1 if args.quick else 3, repeats=2 if args.quick else 5, device=device)
    show(ddp, **DDP_VARIANTS_TABLE)
    result = {"script": "scripts/bench_allreduce.py", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "quick": args.quick, "machine": machine_info(), "device": device, "allreduce": rows,
              "latency_growth": growth, "measured_growth": measured, "ring_verdict": verdict, "ddp_variants": ddp,
              "wall_seconds": time.perf_counter() - t0}
    write_json(out, result)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
