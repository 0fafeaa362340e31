# exercise: begin
# | """Exercise 08-3, the starter: a DDP script that hangs at its last log line. Copy it, find the collective that only
# | one rank calls, and fix it so that every rank finishes and rank 0 logs the loss averaged over the ranks (notebook 08,
# | exercise 08-3; section 4 shows the bug).
# |
# |     torchrun --standalone --nproc-per-node=2 work/hang_exercise.py --timeout 10 --report work/hang_report
# |
# | `--timeout` is the process group's: a collective that waits longer than that fails with an error, instead of the
# | 30 minutes gloo waits by default. The REPORT block writes each process's own losses; leave it as it is.
# | """
"""Exercise 08-3, a solution: the starter with its log all_reduce called by every rank; only the print stays under
`if rank == 0`. The check launches it on 2 processes under a short --timeout (notebook 08, exercise 08-3). The
starter the learner copies (HANG_STARTER) is read out of this file: each `# exercise:` region holds its lines as
`# |` comments.

    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.exercises.hang_solution --timeout 10 \
        --report work/hang_report

`--timeout` is the process group's: a collective that waits longer than that fails with an error, instead of the
30 minutes gloo waits by default. The REPORT block writes each process's own losses; leave it as it is.
"""
# exercise: end
import argparse
import datetime
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.ports import free_port  # a free TCP port, for a world of one without torchrun

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--timeout", type=float, default=60.0, help="seconds a collective may wait before it fails")
parser.add_argument("--out", default=None, help="results JSON (rank 0)")
parser.add_argument("--report", default=None, help="folder: each process writes its losses there (the check)")
args = parser.parse_args()


def main():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(20, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(rank)  # each rank its own batches
    for step in range(args.steps):
        X, y = torch.randn(32, 20, generator=data), torch.randint(0, 3, (32,), generator=data)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(X), y)
        loss.backward()  # DDP all-reduces the gradients: every rank takes part
        optimizer.step()
    # the last step's loss, averaged over the ranks, for the log line
    logged = loss.detach().clone()
    # exercise: begin
    # | if rank == 0:
    # |     dist.all_reduce(logged)
    # |     logged /= world_size
    dist.all_reduce(logged)  # every rank joins the collective: rank 0 alone would wait for the others forever
    logged /= world_size
    if rank == 0:  # only the print is rank 0's
    # exercise: end
        print(f"final loss {logged.item():.4f} (mean over {world_size} ranks)", flush=True)

    if args.out and rank == 0:
        json.dump({"logged": logged.item(), "world_size": world_size}, open(args.out, "w"))

    # REPORT: leave this block as it is. Every process writes its own last loss and the value it would log, one file
    # each; the check compares them
    if args.report:
        Path(args.report).mkdir(parents=True, exist_ok=True)
        facts = {"rank": rank, "loss": loss.item(), "logged": logged.item()}
        (Path(args.report) / f"rank{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    if "LOCAL_RANK" not in os.environ:  # plain `python`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    try:
        main()
        dist.barrier()  # leave together: no rank quits while another is still inside a collective
    finally:
        dist.destroy_process_group()
