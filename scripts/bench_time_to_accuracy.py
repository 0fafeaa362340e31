"""Time to 99.0% and to 99.5% MNIST test accuracy: the article's recipe, our fastest (`fast`) and our 99.5% recipe
(`fast995`), side by side, judged against the series' targets (claims 10.speedrun_99 and 10.speedrun_995).

The recipes run in one process, interleaved seed by seed (article seed 0, fast seed 0, fast995 seed 0, article
seed 1, ...), so a change in machine load hits all alike. Each run evaluates on the full 10,000-image test set
every ``--eval-every`` epoch, and every ``--fine-every`` epoch once it is within 0.5 points of a target not yet
reached (98.5% for 99.0%), so the reported time lies close to the crossing; time to a target is the *training* time
until the first evaluation at or above it (evaluation excluded; CUDA events on a GPU), wall time (data loading,
worker start-up, compilation, evaluations) apart. torch.compile's compilation happens in a warm-up kept out of the
training time (``setup_s``). The article's recipe gets its own 5 epochs (the article's section 5.1), aims at 99.0%
only and stops there; its evaluations stay at ``--eval-every`` (each costs ~3 s of wall time for Net). A run of it
that misses 99.0% within its epochs took longer than its training time: that lower bound still bounds the ratio.

The per-machine settings (bf16 or float32, channels_last, torch.compile) are chosen by a short measurement at the
start (``speedrun.choose_settings``), printed and recorded in the result file; a run that ``--merge``s into an
existing file reuses that file's choice, so the parts of one benchmark train the same recipes.

    python scripts/bench_time_to_accuracy.py                     # 5 seeds each, this machine's device
    python scripts/bench_time_to_accuracy.py --recipes article --seeds 0,1 --merge   # a part, added to the file
    python scripts/bench_time_to_accuracy.py --choice-from results/reference/xeon-2core-amx/fast_choice_20261203.json
    python scripts/bench_time_to_accuracy.py --seeds 10 --device cuda --fast graphs
    python scripts/bench_time_to_accuracy.py --quick             # seconds: tiny subset, low target (tests, CI)

Writes ``results/bench_time_to_accuracy.json`` (or ``--out``) in the claims schema (``mnist_helpers.claims``): the
machine, the two claims with their verdicts (``speedrun.judge_target``: mean +- 2 standard errors against 3 s and
40x the article's recipe for 99.0% (30x on a CPU without AMX), 60 s for 99.5%; the load rule applies), the chosen
settings with their measurement, every run with its accuracy curve and contention, the summary rows. A partial
file is written after every run. References: ``results/reference/<machine label>/bench_time_to_accuracy.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from mnist_helpers import claims, speedrun
from mnist_helpers.errors import cli_entry
from mnist_helpers.io import check_writable, write_json
from mnist_helpers.paths import results_dir
from mnist_helpers.resources import describe, machine_info
from mnist_helpers.train import select_device

RECIPES = ("article", "fast", "fast995")
# the series' targets (issue 20): seconds of training to 99.0% / 99.5%, and the ratio to the article's recipe
TARGET_S = {"0.99": 3.0, "0.995": 60.0}
RATIO_TARGET = {"amx": 40.0, "other": 30.0}


def parse_seeds(text: str) -> list[int]:
    """'5' -> 0..4; '0,3' -> [0, 3]."""
    try:
        if "," in text:
            seeds = [int(x) for x in text.split(",") if x.strip()]
        else:
            seeds = list(range(int(text)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes a count (5) or a comma list (0,3), got {text!r}") from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"--seeds takes a count of at least 1 (5: seeds 0..4) or a comma list of "
                                         f"seeds >= 0 (0,3; one seed: 3,), got {text!r}")
    return seeds


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=parse_seeds, default=list(range(5)),
                    help="a count (5: seeds 0-4) or a comma list of seeds (default: 5)")
    ap.add_argument("--baseline-seeds", type=int, default=None,
                    help="run the baseline for only the first this many of the seeds (default: all)")
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=RECIPES,
                    help="which of the three to run (default: all, interleaved)")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda (default: %(default)s)")
    ap.add_argument("--fast", default="fast", help="our 99.0%% recipe, by name in speedrun.recipes(); fast995 is "
                    "it with speedrun.HYP_995 (default: %(default)s: chosen by measurement)")
    ap.add_argument("--choice-from", default=None, metavar="JSON",
                    help="use the settings of an earlier speedrun.choose_settings() measurement (its JSON, e.g. a "
                         "committed results/reference/<machine>/fast_choice_*.json) instead of measuring now: for a "
                         "machine whose load would drown a short measurement")
    ap.add_argument("--baseline", default="article", help="the baseline recipe (default: %(default)s)")
    ap.add_argument("--targets", type=float, nargs="+", default=[0.99, 0.995], help="accuracy targets")
    ap.add_argument("--eval-every", type=float, default=0.1, help="evaluate every this fraction of an epoch")
    ap.add_argument("--fine-every", type=float, default=0.02,
                    help="near a target (within 0.5 points), evaluate every this fraction of an epoch")
    ap.add_argument("--article-epochs", type=float, default=5.0,
                    help="budget for the baseline, in epochs (default: the article's own %(default)s)")
    ap.add_argument("--target-s", type=float, nargs=2, default=[TARGET_S["0.99"], TARGET_S["0.995"]],
                    metavar=("S99", "S995"), help="the targets in seconds of training to 99.0%% and to 99.5%% "
                    "(default: the CPU's %(default)s; scripts/device_check.sh gives an H200's 0.25 3)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave as is)")
    ap.add_argument("--merge", action="store_true",
                    help="add these runs to the existing --out file (same machine label) and judge them all")
    ap.add_argument("--quick", action="store_true",
                    help="tiny check of the machinery: 1,024 training / 500 test images, target 50%%, 1 seed, no compile")
    ap.add_argument("--out", default=None, help="JSON path (default: results/bench_time_to_accuracy.json)")
    args = ap.parse_args(argv)
    for name in ("eval_every", "fine_every"):
        v = getattr(args, name)
        if not 0 < v <= 1:
            ap.error(f"--{name.replace('_', '-')} must be a fraction of an epoch in (0, 1], got {v}")
    if any(not 0 < t <= 1 for t in args.targets):
        ap.error(f"--targets are accuracies in (0, 1], e.g. 0.99 0.995; got {args.targets}")
    return args


def regime_of(recipe: speedrun.Recipe, n_train: int, device_type: str, threads: int, key: str) -> str:
    """A claim's regime: the recipe timed (its net, batch, settings, schedule, augmentation) and where."""
    return (f"{recipe.name}: {speedrun.net_label(recipe)}, batch {recipe.batch_size}, "
            f"{speedrun.settings_label(recipe)}, OneCycle {recipe.num_epochs:g} epochs"
            + (f", shifts up to {recipe.translate} px" if recipe.translate else "")
            + f", {n_train:,} images, {device_type}, {threads} threads"
            + ("; vs the article's recipe (Net, Adam, DataLoader) in the same run" if key == "0.99" else ""))


def ratio_target(info: dict) -> float:
    return RATIO_TARGET["amx" if "amx" in claims.machine_label(info) else "other"]


def judge(doc_runs: list[dict], names: dict, info: dict, quick: bool, target_s: dict = TARGET_S) -> dict:
    """The claims' verdicts from all runs (this part's and merged ones)."""
    out = {}
    by = {k: [r for r in doc_runs if r["recipe"] == n] for k, n in names.items()}
    for cid, key in (("10.speedrun_99", "0.99"), ("10.speedrun_995", "0.995")):
        role = speedrun.CLAIM_RECIPES[cid]  # the recipe the claim times
        runs = by.get(role) or []
        if not runs:
            continue
        times = [(r["targets"].get(key) or {}).get("train_s") if r["targets"].get(key) else None for r in runs]
        base = [((r["targets"].get(key) or {}).get("train_s") if r["targets"].get(key) else None)
                for r in by.get("baseline") or []] if key == "0.99" and by.get("baseline") else None
        budget = [r["train_s"] for r in by.get("baseline") or []] if base is not None else None
        rt = ratio_target(info) if base is not None else None
        verdict, nums = speedrun.judge_target(times, target_s[key], base, rt, baseline_budget_s=budget)
        cont = speedrun.merge_contention([r.get("contention") for r in runs + (by.get("baseline") or [])])
        if quick:
            verdict = "inconclusive"
        elif cont and cont["busy"]:
            verdict = claims.BUSY
        out[cid] = (verdict, nums, cont, runs)
    return out


def settings_for_fast(args, prior: dict | None, device) -> dict | None:
    """The per-machine settings of the fast recipes: those of the file being merged into, a --choice-from file, a
    fresh measurement (speedrun.choose_settings), or None (the quick mode, or a named --fast recipe). A
    --choice-from file that is not a choose_settings() result raises ValueError."""
    if prior and prior.get("choice"):
        choice = prior["choice"]
        print(f"settings from the file's first part: {speedrun.settings_label(choice['choice'])} ({choice['why']})")
    elif args.choice_from and args.fast == "fast":
        try:
            choice = json.loads(Path(args.choice_from).read_text())
            choice["choice"] = {k: choice["choice"][k] for k in speedrun.SETTINGS}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"--choice-from {args.choice_from}: not a choose_settings() result ({e})") from None
        choice["source"] = str(args.choice_from)
        print(f"settings from {args.choice_from} (measured {str(choice.get('date_utc', '?'))[:10]}, not now): "
              f"{speedrun.settings_label(choice['choice'])} ({choice.get('why', '')})")
        if choice.get("machine_key") and choice["machine_key"] != speedrun.machine_key(device):
            print(f"  note: measured on {choice['machine_key']!r}, this is {speedrun.machine_key(device)!r}")
    elif args.fast == "fast" and not args.quick:
        print("choosing this machine's settings (bf16/float32, channels_last, compile) by measurement...",
              flush=True)
        choice = speedrun.choose_settings(device, log=print)
        if choice["contention"]["busy"]:
            print("  note: measured on a busy machine; --choice-from an idle measurement is steadier")
        for row in sorted(choice["rows"], key=lambda r: -(r.get("images_per_s") or 0)):
            print(f"  {row['setting']:<36} " + (f"{row['images_per_s']:8,.0f} img/s (IQR "
                  f"{row['iqr_images_per_s']:,.0f}), {row['vs_float32_eager']:.2f}x float32 eager"
                  if row.get("images_per_s") else f"failed: {row['error']}") + ("  <- chosen" if row["chosen"] else ""))
    else:
        choice = None
    return choice


def merged_file(args, out: Path, label: str) -> dict | None:
    """The earlier part of this run that --merge adds to (None: none); ValueError if it is another machine's or
    the other mode's."""
    if not (args.merge and out.exists()):
        return None
    prior = json.loads(out.read_text())
    if prior.get("machine_label") != label or bool(prior.get("quick")) != args.quick:
        raise ValueError(f"--merge: {out} holds a run of {prior.get('machine_label')!r} (quick={prior.get('quick')}), "
                         f"this is {label!r} (quick={args.quick}); write to another --out")
    return prior


def pick_recipes(args, prior: dict | None, device) -> tuple:
    """(baseline, fast, fast995, settings choice) of this run, cut to seconds in the quick mode; ValueError when a
    named recipe does not exist or needs a GPU this machine lacks."""
    base = speedrun.get_recipe(args.baseline, device)
    choice = settings_for_fast(args, prior, device)
    fast = (speedrun.fastest(device, choice["choice"] if choice else None, log=None) if args.fast == "fast"
            else speedrun.get_recipe(args.fast, device))
    if speedrun.skip_reason(fast, device) and fast.requires_cuda:
        raise ValueError(f"recipe {fast.name!r} needs a GPU; on {device} use --fast fast")
    fast = fast.replace(name="fast")
    fast995 = speedrun.ladder_995(fast)[-1]
    if args.quick:  # every code path, seconds not minutes; compilation would dominate, so it is left out
        base = base.replace(num_workers=min(base.num_workers, 2))
        fast, fast995 = (r.replace(compile=False, num_epochs=1.0) for r in (fast, fast995))
    return base, fast, fast995, choice


def evaluation_settings(args, roles: dict, n_train: int) -> dict:
    """Per recipe name: how often it is evaluated (every --eval-every epoch, every --fine-every near a target) and,
    for the article's baseline, its own horizon and stop rule."""
    per_recipe = {}
    for role, r in roles.items():
        spe = n_train // r.batch_size
        kw = dict(eval_every_steps=max(1, round(args.eval_every * spe)),
                  fine_every_steps=max(1, round(args.fine_every * spe)))
        if role == "baseline":  # the article's recipe: its own 5 epochs, 99.0% only, coarse evaluations (Net: ~3 s each)
            kw.update(num_epochs=1.0 if args.quick else args.article_epochs, stop_when="first",
                      fine_every_steps=kw["eval_every_steps"])
        per_recipe[r.name] = kw
    return per_recipe


@cli_entry  # expected errors (data, --out, device): one message with the fix, exit code 2
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = select_device(args.device)
    info = machine_info()
    label = claims.machine_label(info)
    out = Path(args.out) if args.out else results_dir() / (
        "bench_time_to_accuracy_quick.json" if args.quick else "bench_time_to_accuracy.json")
    check_writable(out, "--out")  # before the first run, not after an hour of them
    try:
        prior = merged_file(args, out, label)
        print(f"machine: {describe(info)} (label {label})")
        base, fast, fast995, choice = pick_recipes(args, prior, device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    targets = [0.5] if args.quick else sorted(args.targets)
    seeds = [0] if args.quick else args.seeds
    base_seeds = len(seeds) if args.baseline_seeds is None else args.baseline_seeds
    subset, test_subset = (1024, 500) if args.quick else (None, None)
    n_train = subset or 60000
    target_s = {"0.99": args.target_s[0], "0.995": args.target_s[1]}
    roles = {"baseline": base, "fast": fast, "fast995": fast995}
    role_of = {"article": "baseline", "fast": "fast", "fast995": "fast995"}
    per_recipe = evaluation_settings(args, roles, n_train)
    chosen = [roles[role_of[n]] for n in RECIPES if n in args.recipes]
    print(f"recipes: {', '.join(r.name for r in chosen)} on {device}, seeds {seeds} (baseline: first {base_seeds}), "
          f"targets {', '.join(f'{t:.1%}' for t in targets)}; evaluation every {args.eval_every:g} epoch, every "
          f"{args.fine_every:g} epoch within 0.5 points of a target" + (" (quick mode)" if args.quick else ""))
    for r in chosen:
        print(f"  {r.name}: {r.change}")
    t0 = time.perf_counter()
    runs: list[dict] = list(prior.get("runs", [])) if prior else []
    errors: list[dict] = list(prior.get("errors", [])) if prior else []
    parts = list(prior.get("parts", [])) if prior else []
    parts.append({"recipes": [r.name for r in chosen], "seeds": seeds, "baseline_seeds": base_seeds,
                  "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    def report(final: bool):
        names = {"baseline": base.name, "fast": fast.name, "fast995": fast995.name}
        res = claims.ResultFile("bench_time_to_accuracy", profile="quick" if args.quick else "full")
        for cid, (verdict, nums, cont, rs) in judge(runs, names, info, args.quick, target_s).items():
            key = "0.99" if cid.endswith("_99") else "0.995"
            nums = {"target_acc": float(key), **{k: v for k, v in nums.items() if v is not None}}
            ev = speedrun.target_evidence(nums, per_recipe[base.name]["num_epochs"])
            recipe = roles["fast" if key == "0.99" else "fast995"]
            regime = regime_of(recipe, n_train, device.type, torch.get_num_threads(), key)
            res.claim(cid, verdict=verdict, evidence=ev, numbers=nums, regime=regime, contention=cont)
        res.extra = {"benchmark": "time_to_accuracy", "quick": args.quick, "complete": final, "device": str(device),
                     "targets": targets, "target_s": target_s, "ratio_target": ratio_target(info),
                     "eval_every_epochs": args.eval_every, "fine_every_epochs": args.fine_every,
                     "recipes": {r.name: r.to_dict() for r in roles.values()}, "per_recipe": per_recipe,
                     "choice": choice, "parts": parts, "summary": speedrun.summarize(runs) if runs else [],
                     "elapsed_s": time.perf_counter() - t0, "errors": errors, "runs": runs}
        write_json(out, res.to_dict())  # --out may be any file name
        if final:
            print(f"{len(res.claims)} claim(s) written to {out}")
        return res

    for seed in seeds:  # interleaved: a change in machine load hits every recipe alike
        for r in chosen:
            if r is base and seeds.index(seed) >= base_seeds:
                continue
            try:
                with claims.Contention() as c:
                    run = speedrun.time_to_accuracy(r, [0.99] if r is base and not args.quick else targets,
                                                    seed=seed, device=device, subset=subset, test_subset=test_subset,
                                                    **per_recipe[r.name])
                run["contention"] = c.to_dict()
                runs.append(run)
                print(speedrun.run_line(run) + f"; {c}", flush=True)
            except Exception as e:  # one failed run must not cost the others (a time limit may be near)
                errors.append({"recipe": r.name, "seed": seed, "error": f"{type(e).__name__}: {str(e)[:500]}"})
                print(f"{r.name} seed {seed} failed: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr, flush=True)
            report(False)  # a partial file after every run: a long benchmark cut short still leaves data
    return outcome(report(True), runs, errors, out, t0)


def outcome(res, runs: list[dict], errors: list[dict], out: Path, t0: float) -> int:
    """Print the failed runs, the summary table and the claims; the exit code (1 if a run failed)."""
    if errors:
        print(f"{len(errors)} run(s) failed: " + "; ".join(f"{e['recipe']} seed {e['seed']}: {e['error'][:120]}"
                                                        for e in errors), file=sys.stderr)
    if not runs:
        print(f"error: no run finished; wrote {out}", file=sys.stderr)
        return 1
    print()
    speedrun.show_summary(speedrun.summarize(runs))
    print()
    for entry in res.claims.values():
        print(f"{entry['id']}: {entry['verdict']} -- {entry['evidence']}")
    print(f"total {time.perf_counter() - t0:.0f} s; wrote {out}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
