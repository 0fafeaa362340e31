"""Tensor batches vs the DataLoader: how many more images per second reach the model (notebook 03).

    .venv/bin/python scripts/bench_loader.py [--subset 20000] [--batch-size 128] [--workers 0 2] [--threads 1]

Measures, side by side in one run and after one warm-up pass each: in-memory ``TensorBatches`` (float32),
``Uint8Batches`` (uint8 pixels normalised per batch), GPU-resident versions of both when CUDA is present, and the
torchvision DataLoader with per-sample transforms (PIL -> ToTensor -> Normalize) at each ``--workers`` count.
Prints every feed's images/s and the ratio *best tensor feed / best DataLoader*; target: >= 100x on a CPU.
Both routes read RAM (torchvision's MNIST holds every image as one uint8 tensor): the gain is the per-sample
PIL/ToTensor/Normalize and collate work skipped, not disk reads. It is the feed rate alone; what it does to *training*
throughput (with the article's Net on a CPU, about nothing) is measured in notebook 03.
Writes ``results/bench_loader.json`` (machine and date inside). Numbers on a shared machine are noisy; the ratio
of rates measured in the same run is what this script is for.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnist_helpers.errors import cli_entry  # noqa: E402 - after the sys.path line above

TARGET = 100.0


@cli_entry  # expected errors (data, --out): one message with the fix, exit code 2
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subset", type=int, default=20000, help="training images to feed (default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="DataLoader num_workers values")
    ap.add_argument("--epochs", type=int, default=3, help="timed passes after the warm-up (median)")
    ap.add_argument("--dataloader-batches", type=int, default=60, help="batches per DataLoader pass (it is slow)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave as is)")
    ap.add_argument("--out", default=None, help="JSON path (default: results/bench_loader.json)")
    args = ap.parse_args(argv)
    if not 1 <= args.subset <= 60000:
        ap.error(f"--subset must be between 1 and 60000 (the training set), got {args.subset}")
    if args.batch_size < 1 or args.epochs < 1 or args.dataloader_batches < 1 or min(args.workers) < 0:
        ap.error("--subset, --batch-size, --epochs and --dataloader-batches must be positive, --workers >= 0")

    import torch
    from mnist_helpers.course.display import show
    from mnist_helpers.io import check_writable, write_json
    from mnist_helpers.lessons.n03.feeding import feed_rates
    from mnist_helpers.paths import results_dir
    from mnist_helpers.resources import describe, machine_info

    out = check_writable(Path(args.out) if args.out else results_dir() / "bench_loader.json", "--out")
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_info()
    print(f"machine: {describe(machine)}; torch threads {torch.get_num_threads()}")
    rows = feed_rates(subset=args.subset, batch_size=args.batch_size, num_workers=args.workers,
                      epochs=args.epochs, dataloader_max_batches=args.dataloader_batches)
    show(rows, columns=["feed", "device", "images_per_s", "ratio_vs_dataloader"],
         rename={"images_per_s": "img/s", "ratio_vs_dataloader": "x DataLoader"},
         formats={"img/s": "{:,.0f}", "x DataLoader": "{:,.1f}x"})
    tensor = max((r for r in rows if not r["feed"].startswith("DataLoader")), key=lambda r: r["images_per_s"])
    ratio = tensor["ratio_vs_dataloader"]
    ok = ratio >= TARGET
    print(f"\nbest tensor feed ({tensor['feed']}) / best DataLoader = {ratio:,.0f}x "
          f"(target >= {TARGET:.0f}x: {'met' if ok else 'NOT met'}); the gain is per-sample Python work skipped, not "
          "disk reads (both read RAM)")
    write_json(out, {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "machine": machine, "args": vars(args), "rows": rows, "ratio": ratio,
                     "target": TARGET, "target_met": ok})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
