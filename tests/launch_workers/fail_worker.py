"""Test worker for tests/core/test_launch.py: rank 1 raises ``ValueError("boom on rank 1")``.

``@record`` writes the traceback to ``TORCHELASTIC_ERROR_FILE`` so torchrun can report the root cause.
"""
import argparse
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.parse_args()
    import os
    rank = int(os.environ["RANK"])
    print(f"[rank {rank}] starting", flush=True)
    if rank == 1:
        raise ValueError("boom on rank 1")
    time.sleep(30)  # the healthy rank waits; torchrun stops it once rank 1 fails


if __name__ == "__main__":
    main()
