"""Test worker for tests/core/test_launch.py: every rank all-reduces ``rank + 1``; rank 0 writes the result.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/launch_workers/ok_worker.py --out r.json
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)  # sum over ranks: 1 + 2 + ... + world_size
        print(f"[rank {rank}] all_reduce -> {value.item():g}", flush=True)
        print(f"plain line from rank {rank}", flush=True)
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump({"world_size": world_size, "value": value.item(),
                           "master_port": int(os.environ["MASTER_PORT"])}, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
