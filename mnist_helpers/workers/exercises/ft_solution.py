# exercise: begin
# | """Exercise 07-3, the starter: a DDP script that saves no snapshot and never resumes. Copy it, then write in
# | save_snapshot(), load_snapshot() and the three places marked TODO (notebook 07, exercise 07-3).
# |
# |     torchrun --standalone --nproc-per-node=2 --max-restarts=1 work/ft_exercise.py \
# |         --epochs 2 --subset 512 --batch-size 32 --snapshot /tmp/ft.pt --snapshot-every 3 --out /tmp/ft.json
# | """
"""Exercise 07-3, a solution: the starter with its snapshot and its resume written in. The starter the learner
copies (FT_STARTER) is read out of this file: each `# exercise:` region holds its lines as `# |` comments.

The same script as notebook 07's train_ft.py. The check launches it on 2 processes, once uninterrupted and once with
rank 1 killed (kill -9) after the first snapshot under torchrun --max-restarts, and compares the final weights:

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 -m mnist_helpers.workers.exercises.ft_solution \
        --epochs 2 --subset 512 --batch-size 32 --snapshot /tmp/ft.pt --snapshot-every 3 --out /tmp/ft.json
"""
# exercise: end
import argparse
import itertools  # FT: skip the batches of an epoch that were trained before the crash
import json
import os  # DDP: torchrun passes RANK, WORLD_SIZE and LOCAL_RANK in the environment
import random  # FT: Python's RNG state goes into the snapshot too (numpy's would, if the script used numpy)
import time

import torch
import torch.distributed as dist  # DDP: the process group and its collectives
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from mnist_helpers.data import load_mnist               # MNIST as tensors (md5-checked files)
from mnist_helpers.distributed import params_digest     # sha256 of the weights: equal digests = equal bits
from mnist_helpers.models import Net                    # the article's Net
from mnist_helpers.ports import free_port               # DDP: a free TCP port, for a world of one without torchrun

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64, help="per process")  # DDP: global batch = 64 x processes
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--subset", type=int, default=60_000, help="training images")
parser.add_argument("--test-images", type=int, default=10_000)
parser.add_argument("--device", default="cpu", help="cpu or cuda")
parser.add_argument("--out", default=None, help="results JSON")
parser.add_argument("--checkpoint", default=None, help="save the trained weights here")  # DDP: rank 0 writes it
# FT: where the snapshot lives (resumed from if it exists) and how often rank 0 rewrites it
parser.add_argument("--snapshot", default=None, help="snapshot file: resumed from if present")
parser.add_argument("--snapshot-every", type=int, default=10, help="optimizer steps between snapshots")
args = parser.parse_args()


def evaluate(model, X, y, device):
    """(correct, images scored) over the test set, 1,000 images at a time."""
    # DDP: each rank scores every world_size-th image, then the counts are summed: every image once
    X, y = X[dist.get_rank()::dist.get_world_size()], y[dist.get_rank()::dist.get_world_size()]
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(X), 1000):
            correct += (model(X[i:i + 1000].to(device)).argmax(1) == y[i:i + 1000].to(device)).sum().item()
    # DDP: sum the two counts over all ranks
    totals = torch.tensor([correct, len(X)], device=device)
    dist.all_reduce(totals)
    return totals.tolist()


# FT: everything the next step depends on, written by rank 0 to a temporary file that os.replace then renames over
# the old snapshot (atomic: a kill mid-write leaves the previous snapshot whole, never a torn one). Every rank was
# seeded alike and draws alike, so rank 0's RNG states are every rank's (ft_train gathers one per rank instead)
def save_snapshot(path, model, optimizer, scheduler, epoch, step_in_epoch):
    # exercise: begin
    # | # TODO: write what the next step depends on: model.module's weights, the optimizer's and the scheduler's state,
    # | # epoch and step_in_epoch, the RNG states; atomically (a temporary file, then os.replace)
    # | pass
    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "epoch": epoch, "step_in_epoch": step_in_epoch,
             "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}
    torch.save(state, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)
    # exercise: end


# FT: every rank loads the snapshot onto its own device (map_location) into model.module, optimizer and scheduler
def load_snapshot(path, model, optimizer, scheduler, device):
    # exercise: begin
    # | # TODO: torch.load it with map_location=device, load the three state dicts, return the snapshot (a dict)
    # | return None
    snap = torch.load(path, map_location=device)
    model.module.load_state_dict(snap["model"])
    optimizer.load_state_dict(snap["optimizer"])
    scheduler.load_state_dict(snap["scheduler"])
    return snap
    # exercise: end


# DDP: each process gets its GPU's index (torchrun's LOCAL_RANK); on a CPU every process uses the CPU
def main(local_rank):
    device = torch.device("cuda", local_rank) if args.device == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    X, y, X_test, y_test = load_mnist(subset=(args.subset, args.test_images))
    train_set = TensorDataset(X, y)
    # DDP: each rank draws its own shard of every epoch; no shuffle=True beside a sampler
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    # DDP: wrap the model: backward() now all-reduces (averages) the gradients across ranks
    model = DDP(Net().to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)  # FT: a schedule, state to save
    # FT: resume from the snapshot, if there is one
    snap, start_epoch, start_step = None, 0, 0
    # exercise: begin
    # | # TODO: if args.snapshot exists, load it (load_snapshot) and take start_epoch and start_step from it
    if args.snapshot and os.path.exists(args.snapshot):
        snap = load_snapshot(args.snapshot, model, optimizer, scheduler, device)
        start_epoch, start_step = snap["epoch"], snap["step_in_epoch"]
        if dist.get_rank() == 0:
            print(f"resumed from {args.snapshot}: epoch {start_epoch}, {start_step} steps into it", flush=True)
    # exercise: end
    start = time.perf_counter()
    first_indices = []  # DDP: what this rank draws first in each epoch (the notebook compares them)
    for epoch in range(start_epoch, args.epochs):  # FT: from the snapshot's epoch
        sampler.set_epoch(epoch)  # DDP: a new shuffle every epoch
        first_indices.append(list(sampler)[:5])
        model.train()
        # FT: the sampler position: the same order as before the crash (seed + epoch), minus the batches already
        # trained; then the RNG states of that moment, so that dropout draws the masks an uninterrupted run draws
        # exercise: begin
        # | skip = 0  # TODO: in the epoch the snapshot was taken in, the steps already done in it
        skip = start_step if epoch == start_epoch else 0
        # exercise: end
        batches = itertools.islice(loader, skip, None)
        # exercise: begin
        # | # TODO: in that epoch, after skipping, restore the snapshot's RNG states
        if snap is not None and epoch == start_epoch:
            torch.set_rng_state(snap["torch_rng"].cpu())
            random.setstate(snap["python_rng"])
        # exercise: end
        for step, (X_b, y_b) in enumerate(batches, start=skip + 1):  # step: steps done in this epoch
            X_b, y_b = X_b.to(device), y_b.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(X_b), y_b)
            loss.backward()
            optimizer.step()
            # FT: a snapshot every --snapshot-every steps (counted over the whole run), by rank 0 only
            if args.snapshot and (epoch * len(loader) + step) % args.snapshot_every == 0 and dist.get_rank() == 0:
                save_snapshot(args.snapshot, model, optimizer, scheduler, epoch, step)
        # FT: the learning rate decays once per epoch
        scheduler.step()
        correct, count = evaluate(model, X_test, y_test, device)
        if dist.get_rank() == 0:  # DDP: one rank prints
            print(f"epoch {epoch}: {time.perf_counter() - start:.1f} s, test accuracy {correct / count:.2%} "
                  f"({count:,} images)")
    seconds = time.perf_counter() - start
    result = {"device": str(device), "seconds": seconds, "correct": correct, "count": count,
              "digest": params_digest(model)}
    # DDP: every rank's own facts, gathered; rank 0 writes the file
    mine = {"rank": dist.get_rank(), "shard_size": len(sampler), "steps_per_epoch": len(loader),
            "first_indices": first_indices, "digest": result["digest"]}
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    result.update(world_size=dist.get_world_size(), backend=dist.get_backend(), ranks=ranks)
    # FT: where this attempt started (None: from scratch), and torchrun's count of restarts before it
    result.update(resumed_at_step=start_epoch * len(loader) + start_step if snap else None,
                  steps=args.epochs * len(loader), restarts=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
    # DDP: the checkpoint: rank 0 saves model.module's weights (the replicas are equal; no "module." prefix), the
    # barrier holds the others until the file is whole, then every rank loads it onto its own device
    if args.checkpoint:
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), args.checkpoint)
        dist.barrier()
        restored = Net().to(device)
        restored.load_state_dict(torch.load(args.checkpoint, map_location=device))
        result["checkpoint_digest"] = params_digest(restored)
    if args.out and dist.get_rank() == 0:
        json.dump(result, open(args.out, "w"))


if __name__ == "__main__":
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
        dist.barrier()  # leave together: no rank quits while another is still inside a collective
    finally:
        dist.destroy_process_group()
