"""The fair test of the article's batch-size claims (notebook 04_batch_size_and_lr): writes
results/bench_batch_scaling.json in the claims schema (mnist_helpers.course.claims) with the verdicts on
04.double_batch_double_lr, 04.adam_complicated, 04.batch_64_256, 04.batch8_unstable and 04.batch4096.

The regime (mnist_helpers/lessons/n04/batch_scaling.fair_plan): real doublings from the base batch (128, 256, ..., 4096), all
60,000 training images, the same 10 epochs for every batch (batch 2048 still takes 290 steps), the linear rule with a
warm-up of one epoch against a fixed LR; Adam fixed/linear/sqrt at 512 and 2048; batch 8 against 128 at equal epochs
(1 epoch) for SGD and Adam; one tiny-step run (batch 4096 for 1 epoch, 14 steps) labelled "where the rule breaks";
batch 128 for as many steps as batch 4096 takes in 10 epochs (140: one epoch over 17,920 images, "equal-steps");
SGD at batch 64 for 10 epochs (the low end of "batch 64-256 is reasonable").
At least 3 seeds for error bars. The model is the MLP (784-256-10, no BatchNorm), not FastNet or the article's Net:
FastNet needs about an order of magnitude more FLOPs per image (notebook 04's second cell computes both with
``models.flops_per_image``), and the sweep (about 20 runs x 10 epochs x 60,000 images per seed) only fits a 2-core
CPU with the MLP; the MLP's measured images/s are in the result file's ``runs``. The rule is a statement about SGD,
not about convolutions; the notebook runs a reduced sweep live beside this reference.

"Batch 8 is unstable" is judged on runs that diverge and on final accuracy scattered across seeds (the step-loss
noise is higher at batch 8 by construction); "batch 4096 generalises worse" on test accuracy twice, as the article
compares (the same epochs, so 32x fewer steps) and at an equal number of steps: "inconclusive (confounded)" when
only the first finds it worse.

One seed takes about 8 minutes on a shared 2-core Xeon; run the seeds in separate calls and merge them with
--append (each call keeps the rows already in the file, replaces those of the seeds it runs, and re-judges all):

    flock /tmp/mnist-heavy.lock python scripts/bench_batch_scaling.py --seeds 0
    flock /tmp/mnist-heavy.lock python scripts/bench_batch_scaling.py --seeds 1 2 --append --parallel 2
    python scripts/bench_batch_scaling.py --only equal-steps batch64 --append   # some groups, the other rows kept
    python scripts/bench_batch_scaling.py --rejudge        # no runs: the verdicts again from the rows in the file
                                                           # (the file keeps the machine and date that measured them)
    python scripts/bench_batch_scaling.py --quick          # seconds: a smoke test, not a measurement
    python scripts/make_claims.py --keep bench_batch_scaling   # a full run -> results/reference/<machine>/

Timings (only 04.batch4096's "fast" depends on them) are taken under claims.Contention: a call that timed the
doubling runs while other processes took more than a quarter of the CPU makes that claim "no verdict: the machine is
busy" where its verdict rests on the speed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import time

import torch

from mnist_helpers.course import claims
from mnist_helpers.course.display import show
from mnist_helpers.data import load_mnist
from mnist_helpers.errors import ConfigError, cli_entry
from mnist_helpers.io import check_writable
from mnist_helpers.lessons.n04 import batch_scaling as bs
from mnist_helpers.paths import results_dir

NAME = "bench_batch_scaling"


def _config(args) -> dict:
    return {"model": args.model, "train_images": args.train_images, "num_epochs": args.epochs,
            "doublings": args.doublings, "adam_batches": args.adam_batches, "small_batch": args.small_batch,
            "tiny_step_batch": args.tiny_step_batch, "warmup_epochs": args.warmup_epochs, "threads": args.threads}


def _in_processes(args) -> list[dict]:
    """Each seed in its own process (``--parallel`` at a time), into a temporary file; their rows, merged."""
    import subprocess
    import sys
    import tempfile
    flags = ["--epochs", str(args.epochs), "--doublings", *map(str, args.doublings), "--adam-batches",
             *map(str, args.adam_batches), "--small-batch", str(args.small_batch), "--tiny-step-batch",
             str(args.tiny_step_batch), "--warmup-epochs", str(args.warmup_epochs), "--model", args.model,
             "--train-images", str(args.train_images), "--threads", str(args.threads)] \
        + (["--quick"] if args.quick else []) + (["--only", *args.only] if args.only else [])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        seeds = list(args.seeds)
        while seeds:
            batch, seeds = seeds[:args.parallel], seeds[args.parallel:]
            procs = [(s, subprocess.Popen([sys.executable, __file__, "--seeds", str(s), "--out", f"{tmp}/seed{s}.json",
                                           *flags], stdout=open(f"{tmp}/seed{s}.log", "w"), stderr=subprocess.STDOUT))
                     for s in batch]
            for s, p in procs:
                if p.wait() != 0:
                    raise RuntimeError(f"seed {s} failed:\n" + open(f"{tmp}/seed{s}.log").read()[-3000:])
                print(open(f"{tmp}/seed{s}.log").read(), flush=True)
                rows += [{k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in r.items()}
                         for r in json.loads(open(f"{tmp}/seed{s}.json").read())["runs"]]
    return rows


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds to run (default 0 1 2)")
    ap.add_argument("--append", action="store_true", help="merge with the rows already in the output file")
    ap.add_argument("--only", nargs="+", choices=bs.GROUPS, metavar="GROUP",
                    help=f"run only these groups of the plan ({', '.join(bs.GROUPS)}); with --append the file's "
                         "other rows stay")
    ap.add_argument("--epochs", type=int, default=10, help="epochs per run, the same for every batch (default 10)")
    ap.add_argument("--doublings", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    ap.add_argument("--adam-batches", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--small-batch", type=int, default=8)
    ap.add_argument("--tiny-step-batch", type=int, default=4096)
    ap.add_argument("--warmup-epochs", type=float, default=1.0)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--train-images", type=int, default=60_000)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared 2-core machine)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    ap.add_argument("--out", default=None, help="JSON path (default results/bench_batch_scaling.json)")
    ap.add_argument("--rejudge", action="store_true",
                    help="run nothing: judge the rows already in the output file again (after a change to the verdicts)")
    ap.add_argument("--parallel", type=int, default=1,
                    help="run the seeds in this many processes at once (each --threads threads; the load rule counts "
                         "them as this run's own)")
    return ap


@cli_entry  # expected errors: one message with the fix, exit code 2
def main(argv=None) -> dict:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.parallel < 1:
        raise ConfigError(f"--parallel must be at least 1, got {args.parallel}", "pass --parallel 1 or 2")
    if args.quick:
        args.epochs, args.doublings, args.adam_batches, args.train_images = 2, [128, 256, 512], [512], 2_048
        args.tiny_step_batch = 1024
    out = check_writable(args.out or results_dir() / f"{NAME}.json", "--out")
    config = _config(args)
    old_rows, old_contention, measured = [], [], {}
    if args.rejudge and not out.exists():
        raise ConfigError(f"--rejudge reads {out}, which does not exist", "run the sweep first")
    if args.rejudge:
        args.append, args.seeds = True, []
        config = json.loads(out.read_text()).get("config")
    if args.append and out.exists():
        old = json.loads(out.read_text())
        if old.get("config") != config:
            raise ConfigError(f"{out} holds a sweep with another configuration ({old.get('config')})",
                              "run with the same flags as before, or without --append to start a new file")
        groups = set(args.only or bs.GROUPS)  # the rows this call replaces: its seeds' rows of its groups
        old_rows = [{k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in r.items()}  # JSON kept nan as text
                    for r in old.get("runs", []) if r["seed"] not in args.seeds or r["group"] not in groups]
        old_contention = [c for c in old.get("contention_by_call", []) if not set(c["seeds"]) & set(args.seeds)
                          or not set(c.get("groups", bs.GROUPS)) <= groups]
        if args.rejudge:  # the verdicts are new, the measurements are not: they stay the measuring machine's
            measured = {"machine": old.get("machine"), "date": old.get("date")}
        elif old.get("machine_label") not in (None, claims.machine_label()):
            raise ConfigError(f"{out} holds runs measured on {old['machine_label']}, this is "
                              f"{claims.machine_label()}: one file, one machine",
                              "run without --append (a new file), or --out another path")
    try:
        plan = bs.fair_plan(args.doublings, num_epochs=args.epochs, adam_batches=args.adam_batches,
                            small_batch=args.small_batch, tiny_step_batch=args.tiny_step_batch)
    except ValueError as e:
        raise ConfigError(str(e), "pass --doublings starting at 128, each the double of the last") from None
    if args.only:
        plan = [p for p in plan if p["group"] in args.only]
    torch.set_num_threads(args.threads)
    data = None if args.rejudge else load_mnist(subset=(args.train_images, None if not args.quick else 1_000))
    print(f"{len(plan)} runs per seed, seeds {args.seeds}, {args.model}, {args.train_images:,} images, {args.epochs} epochs")
    t0 = time.perf_counter()

    def progress(r):
        print(f"seed {r['seed']} {r['group']:9s} {r['optimizer']} {r['rule']:13s} batch {r['batch_size']:5d} "
              f"lr {r['lr']:.4g}: {r['steps']} steps, test {r['test_acc']:.2%}, noise {r['loss_noise']:.2f}, "
              f"{r['images_per_s']:,.0f} img/s" + (" DIVERGED" if r["diverged"] else ""), flush=True)

    with claims.Contention() as busy:
        if args.rejudge:
            rows = []
        elif args.parallel > 1 and len(args.seeds) > 1:
            rows = _in_processes(args)
        else:
            rows = bs.sweep(data, plan, seeds=args.seeds, model=args.model, warmup_epochs=args.warmup_epochs,
                            on_run=progress)
    print(busy)
    contention = old_contention + ([] if args.rejudge else [
        {"seeds": args.seeds, **({"groups": args.only} if args.only else {}), **busy.to_dict(),
         "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}])
    rows = old_rows + rows
    # the contention recorded with 04.batch4096: the worst of the calls that timed the runs its "fast" reads
    worst = max(bs.timing_calls(contention) or contention, key=lambda c: c["others_cpu_share"] or 0.0)
    verdicts = bs.judge(rows, busy=claims.BUSY if bs.timing_busy(contention) else None)
    res = claims.ResultFile(NAME, profile="quick" if args.quick else "full", folder=out.parent, **measured)
    res.name = out.stem if out.stem.replace("_", "").isalnum() else NAME
    reg = bs.regime(rows, config["model"])
    for cid, v in verdicts.items():
        res.claim(cid, verdict=v["verdict"], evidence=v["evidence"], numbers=v["numbers"], regime=reg,
                  contention=worst if cid == "04.batch4096" else None)
    res.extra = {"script": "scripts/bench_batch_scaling.py", "config": config, "runs": rows,
                 "contention_by_call": contention}
    show(bs.summary(rows), formats={"lr": "{:.4g}", "test_acc": "{:.2%}", "test_acc_sd": "{:.2%}", "gap": "{:+.2%}",
                                    "loss_noise": "{:.2f}", "images_per_s": "{:,.0f}"})
    for cid, v in verdicts.items():
        print(f"- {cid}: {v['verdict']}: {v['evidence']}")
    res.write()
    print(f"{len(rows)} runs in the file; this call took {time.perf_counter() - t0:.0f} s")
    return res.to_dict()


if __name__ == "__main__":
    main()
