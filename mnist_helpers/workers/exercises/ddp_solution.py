# exercise: begin
# | """Exercise 06-1, the starter: a single-device training script. Copy it, then turn the copy into a DDP script that
# | torchrun launches on several processes (notebook 06, exercise 06-1; section 2's list says what changes).
# |
# |     python work/ddp_exercise.py --epochs 2 --subset 2000 --test-images 1001              # as it is: one process
# |     torchrun --standalone --nproc-per-node=2 work/ddp_exercise.py --epochs 2 --subset 2000 --test-images 1001 \
# |         --report work/ddp_report                                                         # once it is a DDP script
# |
# | The REPORT block at the end writes, per process, the images it trained on, its final weights' digest and its test
# | result; the check launches your script on 2 processes and compares them. Leave that block as it is.
# | """
"""Exercise 06-1, a solution: the starter turned into a DDP script, each change marked # DDP:. The starter the
learner copies (DDP_STARTER) is read out of this file: each `# exercise:` region holds its lines as `# |` comments.

It runs under torchrun and alone with plain Python (a world of one). The check launches it on 2 processes and
compares what each process trained on, its final weights and its test count:

    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.exercises.ddp_solution \
        --epochs 2 --subset 2000 --test-images 1001 --report /tmp/ddp_report
    python -m mnist_helpers.workers.exercises.ddp_solution --epochs 1 --subset 2000     # a world of one
"""
# exercise: end
import argparse
import json
import os
import time
from pathlib import Path

import torch
# exercise: begin
import torch.distributed as dist  # DDP: the process group and its collectives
# exercise: end
import torch.nn.functional as F
# exercise: begin
from torch.nn.parallel import DistributedDataParallel as DDP
# exercise: end
from torch.utils.data import DataLoader, TensorDataset
# exercise: begin
from torch.utils.data.distributed import DistributedSampler
# exercise: end

from mnist_helpers.data import load_mnist               # MNIST as tensors (md5-checked files)
from mnist_helpers.distributed import params_digest     # sha256 of the weights: equal digests = equal bits
from mnist_helpers.models import Net                    # the article's Net
# exercise: begin
from mnist_helpers.ports import free_port               # DDP: a free TCP port, for a world of one without torchrun
# exercise: end

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
# exercise: begin
# | parser.add_argument("--batch-size", type=int, default=128)
parser.add_argument("--batch-size", type=int, default=64, help="per process")  # DDP: global batch = 64 x processes
# exercise: end
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--subset", type=int, default=60_000, help="training images")
parser.add_argument("--test-images", type=int, default=10_000)
parser.add_argument("--device", default="cpu", help="cpu or cuda")
parser.add_argument("--out", default=None, help="results JSON")
parser.add_argument("--report", default=None, help="folder: each process writes its facts there (the check)")
args = parser.parse_args()


def evaluate(model, X, y, device):
    """(correct, images scored) over the test set, 1,000 images at a time."""
    # exercise: begin
    # DDP: each rank scores every world_size-th image, then the counts are summed: every image once
    X, y = X[dist.get_rank()::dist.get_world_size()], y[dist.get_rank()::dist.get_world_size()]
    # exercise: end
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(X), 1000):
            correct += (model(X[i:i + 1000].to(device)).argmax(1) == y[i:i + 1000].to(device)).sum().item()
    # exercise: begin
    # | return correct, len(X)
    # DDP: sum the two counts over all ranks
    totals = torch.tensor([correct, len(X)], device=device)
    dist.all_reduce(totals)
    return totals.tolist()
    # exercise: end


# exercise: begin
# | def main():
# |     device = torch.device(args.device)
def main(local_rank):  # DDP: each process gets its GPU's index (torchrun's LOCAL_RANK)
    device = torch.device("cuda", local_rank) if args.device == "cuda" else torch.device("cpu")
# exercise: end
    torch.manual_seed(0)
    X, y, X_test, y_test = load_mnist(subset=(args.subset, args.test_images))
    train_set = TensorDataset(X, y, torch.arange(len(X)))  # each image with its index: what the REPORT lists
    # exercise: begin
    # | loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    # | model = Net().to(device)
    # DDP: each rank draws its own shard of every epoch; no shuffle=True beside a sampler
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    # DDP: wrap the model: backward() now all-reduces (averages) the gradients across ranks
    model = DDP(Net().to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    # exercise: end
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = time.perf_counter()
    seen = []  # per epoch, the indices of the images this process trained on, in the order drawn
    for epoch in range(args.epochs):
        # exercise: begin
        sampler.set_epoch(epoch)  # DDP: a new shuffle every epoch
        # exercise: end
        model.train()
        seen.append([])
        for X_b, y_b, index in loader:
            seen[-1] += index.tolist()
            X_b, y_b = X_b.to(device), y_b.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(X_b), y_b)
            loss.backward()
            optimizer.step()
        correct, count = evaluate(model, X_test, y_test, device)
        # exercise: begin
        # | print(f"epoch {epoch}: {time.perf_counter() - start:.1f} s, test accuracy {correct / count:.2%} "
        # |       f"({count:,} images)")
        if dist.get_rank() == 0:  # DDP: one rank prints
            print(f"epoch {epoch}: {time.perf_counter() - start:.1f} s, test accuracy {correct / count:.2%} "
                  f"({count:,} images)")
        # exercise: end

    # exercise: begin
    # | if args.out:
    if args.out and dist.get_rank() == 0:  # DDP: one rank writes
    # exercise: end
        json.dump({"correct": correct, "count": count, "digest": params_digest(model),
                   "seconds": time.perf_counter() - start}, open(args.out, "w"))

    # REPORT: leave this block as it is. Every process writes its own facts, one file each (RANK: torchrun sets it;
    # 0 when the script runs alone); the check compares the files of the processes
    if args.report:
        rank = int(os.environ.get("RANK", 0))
        Path(args.report).mkdir(parents=True, exist_ok=True)
        facts = {"rank": rank, "seen": seen, "digest": params_digest(model), "correct": correct, "count": count}
        (Path(args.report) / f"rank{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    # exercise: begin
    # | main()
    # DDP: join the group; torchrun set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Plain `python`
    # sets none of them: then this process is a world of one, rank 0, with the same code path
    if "LOCAL_RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        main(local_rank)
        dist.barrier()  # DDP: leave together: no rank quits while another is still inside a collective
    finally:
        dist.destroy_process_group()
    # exercise: end
