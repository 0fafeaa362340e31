"""Test worker for tests/core/test_launch.py: records its pid, then prints a heartbeat forever.

    sleep_worker.py --pid-dir DIR    each rank writes DIR/<rank>.pid once it is running
"""
import argparse
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid-dir", required=True)
    parser.add_argument("--out")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", 0))
    pid_file = Path(args.pid_dir) / f"{rank}.pid"
    # Write-then-rename so the test never reads a half-written pid.
    pid_file.with_suffix(".tmp").write_text(str(os.getpid()))
    pid_file.with_suffix(".tmp").rename(pid_file)
    while True:
        print(f"[rank {rank}] heartbeat", flush=True)
        time.sleep(0.5)


if __name__ == "__main__":
    main()
