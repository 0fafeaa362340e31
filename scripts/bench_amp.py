"""Mixed precision and gradient accumulation benchmark (notebook 05_mixed_precision_and_memory).

Trains the article's Net in every precision mode side by side (same weights, same batches,
interleaved timed blocks, median), measures one step's peak memory split into persistent (weights,
gradients, optimizer state) and transient (activations), then the peak over k micro-batches.
Prints ratios measured in this one run and writes results/amp_bench.json (machine inside).
On a GPU, ``--allocator`` adds the caching-allocator experiments (expandable segments, empty_cache),
each in a fresh process; copy the JSON to results/reference/ to show it on CPU-only machines.

    python scripts/bench_amp.py                 # CPU: fp32/bf16/channels_last at batch 512; fp16 at batch 32
    python scripts/bench_amp.py --allocator     # on a GPU: every mode at batch 512 + allocator cells
    python scripts/bench_amp.py --quick         # seconds, for a smoke test

Measured on a shared 2-core Intel Xeon (AMX/AVX512-bf16, no GPU), torch 2.14.1: see the JSON.
CPU fp16 has no fast convolution backward (about 5x slower than fp32 here), so on CPU it runs at a
small batch and only its memory and GradScaler behaviour matter.
"""
from __future__ import annotations

import argparse
import datetime
import json
import time

from mnist_helpers.course.display import show
from mnist_helpers.data import load_mnist
from mnist_helpers.errors import ConfigError, cli_entry
from mnist_helpers.io import check_writable, write_json
from mnist_helpers.memory import run_isolated
from mnist_helpers.paths import results_dir
from mnist_helpers.lessons.n05.precision import (accumulation_memory, allocator_fragmentation, compare_precisions,
                                     deprecated_amp_warnings, empty_cache_cost)
from mnist_helpers.resources import describe, machine_info
from mnist_helpers.train import select_device

# run_isolated runs precision.allocator_fragmentation in a fresh process (PYTORCH_CUDA_ALLOC_CONF read there)
FRAGMENTATION = allocator_fragmentation
FORMATS = {"images_per_s": "{:,.0f}", "speedup": "{:.2f}", "peak_mib": "{:.1f}", "persistent_mib": "{:.1f}",
           "transient_mib": "{:.1f}", "transient_ratio": "{:.2f}", "test_acc": "{:.2%}", "max_grad_diff": "{:.1e}"}


@cli_entry  # expected errors: one message with the fix, exit code 2
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    ap.add_argument("--allocator", action="store_true", help="CUDA only: allocator experiments in fresh processes")
    ap.add_argument("--out", default=None, help="JSON path (default results/amp_bench.json)")
    args = ap.parse_args(argv)
    device = select_device("auto")
    if args.allocator and device.type != "cuda":
        raise ConfigError("--allocator measures the CUDA caching allocator, and this machine has no CUDA device",
                          "run without --allocator here, or on a GPU machine: python scripts/bench_amp.py --allocator")
    out = check_writable(args.out or results_dir() / "amp_bench.json", "--out")
    t0 = time.perf_counter()
    X, y, Xt, yt = load_mnist(subset=(4096, 1000) if args.quick else None)
    big, small = (128, 16) if args.quick else (512, 32)
    blocks = dict(warmup=1, repeats=2, chunk=2) if args.quick else dict(warmup=1, repeats=3, chunk=5)
    fast_fp16 = device.type == "cuda"
    modes = ["fp32", "bf16", "fp32 channels_last", "bf16 channels_last"]
    if fast_fp16:
        modes += ["fp16+scaler", "fp16 no scaler"]
    print(f"machine: {describe()} | device {device}")
    main_rows = compare_precisions(modes, X=X, y=y, X_test=Xt, y_test=yt, batch_size=big, device=device, **blocks)
    cols = ["mode", "images_per_s", "speedup", "peak_mib", "persistent_mib", "transient_mib", "transient_ratio", "test_acc"]
    show(main_rows, cols, formats=FORMATS)
    fp16_rows = []
    if not fast_fp16:
        fp16_rows = compare_precisions(["fp32", "fp16+scaler", "fp16 no scaler"], X=X, y=y, batch_size=small,
                                       device=device, warmup=1, repeats=1 if args.quick else 3, chunk=1)
        show(fp16_rows, cols[:-1], formats=FORMATS)
    acc_rows = accumulation_memory((1, 2, 4, 8), X=X[:big].to(device), y=y[:big].to(device))
    show(acc_rows, ["k", "micro_batch", "peak_mib", "transient_mib", "transient_ratio", "max_grad_diff"], formats=FORMATS)
    allocator = None
    if args.allocator:
        allocator = {"default": run_isolated(FRAGMENTATION)["result"],
                     "expandable_segments": run_isolated(FRAGMENTATION,
                                                         env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})["result"],
                     "empty_cache": empty_cache_cost()}
        print(json.dumps(allocator, indent=1))
    result = {"script": "scripts/bench_amp.py", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "quick": args.quick, "machine": machine_info(), "device": str(device), "precisions": main_rows,
              "fp16_small_batch": fp16_rows, "accumulation": acc_rows, "allocator": allocator,
              "deprecations": deprecated_amp_warnings(), "wall_seconds": time.perf_counter() - t0}
    write_json(out, result)
    print(f"wrote {out} in {result['wall_seconds']:.0f} s")
    return result


if __name__ == "__main__":
    main()
