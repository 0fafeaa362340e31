"""Scaling benchmark on CPU: 2 processes against 1, in the article's comparison (notebook 07_scaling_and_multinode).

The article (5.4) compares 1 GPU at batch 128 with 2 GPUs at 64 each: the same global batch, *strong scaling*.
This script measures that comparison and, as a second lesson, *weak scaling* (128 per process, the global batch
doubles). Each point launches ``mnist_helpers.workers.bench.allreduce ddp`` through the launcher: the article's
Net under DDP on synthetic MNIST-shaped batches, one thread per process (set explicitly), warm-up first, then
timed blocks interleaved with the same step under ``no_sync()`` (no all-reduce); the slowest rank's time counts.
World sizes alternate in rounds (1, 2, 1, 2, ...) so drift on a shared machine hits both alike; per round the
2-vs-1 ratio is taken side by side, and the verdicts come from ``mnist_helpers.lessons.n07.scaling.speedup_verdict`` and
``mnist_helpers.lessons.n07.scaling.comm_verdict`` (the same functions the notebook uses) on those repeats. On a CPU this is a
stand-in (gloo), not a GPU measurement; a busy machine gets no verdict (``claims.Contention``).

Prints the table, the ratios with their spread and the verdicts, and writes results/bench_scaling.json (machine,
date and the CPU share other processes used inside). No expected figure is written here: the numbers are the
JSON's, and the reference runs live in results/reference/<machine label>/.

    python scripts/bench_scaling.py                       # strong (2 x 64 vs 1 x 128) and weak (2 x 128)
    python scripts/bench_scaling.py --world-sizes 1,2,4 --rounds 5
    python scripts/bench_scaling.py --quick               # a smoke test, not a measurement
"""
from __future__ import annotations

import argparse
import datetime
import time

from mnist_helpers.course import claims
from mnist_helpers.course.display import show
from mnist_helpers.errors import cli_entry
from mnist_helpers.io import check_writable, write_json
from mnist_helpers.paths import results_dir
from mnist_helpers.resources import describe, machine_info
from mnist_helpers.lessons.n07.scaling import (NEGLIGIBLE_SHARE, SCALING_TABLE, comm_fractions, comm_verdict, round_ratios,
                                   speedup_verdict, strong_scaling, weak_scaling)


@cli_entry  # expected errors: one message with the fix, exit code 2
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-sizes", default="1,2", help="processes per point, comma-separated (must include 1 and 2)")
    ap.add_argument("--global-batch-size", type=int, default=128,
                    help="strong scaling: images per step over all processes (the article's 128)")
    ap.add_argument("--model", default="net")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds over the world sizes")
    ap.add_argument("--quick", action="store_true", help="tiny: fastnet, 1 round, 1 step per block")
    ap.add_argument("--out", default=None, help="JSON path (default results/bench_scaling.json)")
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.world_sizes.split(",")]
    except ValueError:
        ap.error(f"--world-sizes must be comma-separated integers, e.g. 1,2; got {args.world_sizes!r}")
    if args.global_batch_size < 1 or args.rounds < 1 or min(sizes) < 1:
        ap.error("--world-sizes, --global-batch-size and --rounds must be positive")
    out = check_writable(args.out or results_dir() / "bench_scaling.json", "--out")
    if 1 not in sizes or 2 not in sizes:
        ap.error(f"--world-sizes must include 1 and 2 (the ratio this script reports), got {sizes}")
    if any(args.global_batch_size % n for n in sizes):
        ap.error(f"--global-batch-size {args.global_batch_size} must divide by every world size in {sizes}")
    model, rounds, steps, repeats = ("fastnet", 1, 1, 2) if args.quick else (args.model, args.rounds, 3, 5)
    print(f"machine: {describe()}")
    t0 = time.perf_counter()
    kw = dict(model=model, threads_per_proc=1, steps=steps, repeats=repeats, warmup=2, rounds=rounds)
    with claims.Contention() as busy:
        strong = strong_scaling(sizes, args.global_batch_size, **kw)
        weak = weak_scaling(sizes, args.global_batch_size, reuse=strong, **kw)
    show(strong + weak, **SCALING_TABLE)
    strong_ratios, weak_ratios = round_ratios(strong, 2), round_ratios(weak, 2)
    fractions = comm_fractions(next(r for r in strong if r["world_size"] == 2))
    s, f = claims.spread(strong_ratios), claims.spread(fractions)
    held = claims.busy_verdict(busy)
    speed = held or speedup_verdict(strong_ratios)
    comm = held or comm_verdict(fractions)
    print(f"\nstrong scaling, 2 x {args.global_batch_size // 2} vs 1 x {args.global_batch_size} ({model}, "
          f"{rounds} round(s)): median {s['median']:.2f}x (range {s['min']:.2f}-{s['max']:.2f})")
    print(f"weak scaling, 2 x {args.global_batch_size} vs 1 x {args.global_batch_size}: "
          f"{', '.join(f'{x:.2f}x' for x in weak_ratios)}")
    print(f"article '2 GPUs are 1.7-1.9x faster' (CPU stand-in, gloo, not a GPU measurement): {speed}")
    print(f"communication share of a 2-process step: median {f['median']:.1%} (quartiles {f['q1']:.1%}-"
          f"{f['q3']:.1%}) against {NEGLIGIBLE_SHARE:.0%} -> 'negligible': {comm}")
    print(busy)
    result = {"script": "scripts/bench_scaling.py", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "quick": args.quick, "machine": machine_info(), "model": model, "strong": strong, "weak": weak,
              "strong_ratios_2_vs_1": strong_ratios, "weak_ratios_2_vs_1": weak_ratios, "comm_fractions_2": fractions,
              "verdicts": {"07.two_gpu_speedup": speed, "07.comm_negligible": comm},
              "contention": busy.to_dict(), "wall_seconds": time.perf_counter() - t0}
    write_json(out, result)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
