"""torchrun --max-restarts after a killed worker: success rates per configuration (notebook 07_scaling_and_multinode,
claim 07.restarts).

Every configuration of ``mnist_helpers.lessons.n07.scaling.RESTART_CONFIGS`` (``--standalone`` and an explicit c10d
endpoint, each with torch's default TCP-store sharing and with it off, as the launcher runs it) ``--trials`` times,
interleaved. Each trial launches the worker ``mnist_helpers.workers.bugs.restart_kill`` (plain torch: rank 1 sends
itself SIGKILL on the first attempt) under ``--max-restarts 2`` and counts a success when the restarted group
finishes. Prints the rates as a table and the machine's load while they ran; tests/workers/test_bugs_restart_kill.py runs the
launcher's two configurations on every test run.

    python scripts/bench_restarts.py --trials 5
    python scripts/bench_restarts.py --trials 10 --write               # results/restarts.json (claim 07.restarts)
    python scripts/bench_restarts.py --trials 10 --write --reference   # and keep it as this machine's reference
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnist_helpers.course import claims  # noqa: E402 - after the sys.path line above
from mnist_helpers.course.display import show  # noqa: E402
from mnist_helpers.errors import cli_entry  # noqa: E402
from mnist_helpers.io import write_json  # noqa: E402
from mnist_helpers.lessons.n07.scaling import RESTART_CONFIGS, RESTARTS_TABLE, record_restarts, restart_rates  # noqa: E402


@cli_entry  # expected errors: one message with the fix, exit code 2
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5, help="trials per configuration")
    ap.add_argument("--timeout", type=float, default=90, help="seconds for one trial")
    ap.add_argument("--out", default=None, help="JSON with every trial")
    ap.add_argument("--write", action="store_true",
                    help="also write results/restarts.json (claim 07.restarts; profile full)")
    ap.add_argument("--reference", action="store_true", help="with --write: keep it as this machine's reference")
    args = ap.parse_args(argv)
    if args.trials < 1:
        ap.error(f"--trials must be a positive integer, got {args.trials}")
    from tqdm.auto import tqdm

    with claims.Contention() as busy, tqdm(total=args.trials * len(RESTART_CONFIGS), desc="restart trials") as bar:
        rows = restart_rates(args.trials, timeout=args.timeout, progress=bar)
    show(rows, **RESTARTS_TABLE)
    print(busy)
    if args.out:
        write_json(args.out, {"rows": rows})
    if args.write:
        res = claims.ResultFile("restarts", profile="full")
        entry = record_restarts(rows, res, contention=busy)
        res.extra["rows"] = rows
        print(f"07.restarts: {entry['verdict']} ({entry['evidence']})")
        res.write()
        if args.reference:
            print(f"reference: {res.keep_as_reference()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
