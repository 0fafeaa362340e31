"""The source article's section 5.2 DDP script, as written, runnable on a CPU (12_ddp_in_depth, appendix B).

Only torch and torchvision, like the article: its ``Net`` (5.1), ``setup(rank, world_size)`` with
MASTER_ADDR/MASTER_PORT and ``init_process_group``, a ``DistributedSampler`` under a ``DataLoader`` at
batch 64 per process, ``DDP(model, device_ids=[rank])``, ``sampler.set_epoch(epoch)`` every epoch, Adam 1e-3,
``destroy_process_group()``, and ``mp.spawn(train, nprocs=world_size)``. Lines the lab changed or added are
marked ``# lab:``: a free port instead of the fixed 12355 (which fails while anything holds it), gloo and the CPU
when there are fewer GPUs than processes (the article assumes one GPU per process and NCCL), flags for the data
folder, epochs, a step limit and the loader's workers, and a results file that records what every rank saw (its
first sampler indices each epoch, its final weights' digest). Run it as a script (``mp.spawn`` pickles ``train``
by name, which a notebook cell cannot provide):

    python mnist_helpers/workers/demos/article_ddp.py --world-size 2 --epochs 2 --data-root data
    python -m mnist_helpers.workers.demos.article_ddp --world-size 2 --epochs 1 --max-steps 20 --out /tmp/a.json
"""
import argparse
import hashlib  # lab: digests of every rank's final weights
import json  # lab: the results file
import os
import socket  # lab: a free port
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def setup(rank, world_size, port, backend):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)  # lab: the article's "12355", replaced by a port nobody holds
    dist.init_process_group(backend, rank=rank, world_size=world_size)  # lab: "nccl", or gloo on CPU


def cleanup():
    dist.destroy_process_group()


def train(rank, world_size, port, backend, args):
    setup(rank, world_size, port, backend)
    use_cuda = backend == "nccl"  # lab: the article always uses GPU `rank`
    if use_cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    dataset = datasets.MNIST(args.data_root, train=True, download=False, transform=transform)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=args.num_workers,
                        pin_memory=use_cuda)  # lab: the article's pin_memory=True, which only means something on GPUs

    model = Net().to(device)
    model = DDP(model, device_ids=[rank] if use_cuda else None)  # lab: no device_ids on CPU
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    seen = []  # lab: what this rank trained on, for the results file
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle every epoch; without it every epoch repeats the first one's order
        seen.append(list(sampler)[:8])  # lab: the first indices this rank gets this epoch
        model.train()
        t0 = time.time()
        total_loss, steps = 0.0, 0
        for batch_idx, (data, target) in enumerate(loader):
            if args.max_steps is not None and batch_idx >= args.max_steps:  # lab: a short run for the quick profile
                break
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            total_loss, steps = total_loss + loss.item(), steps + 1
        if rank == 0:
            print(f"Epoch {epoch}: loss {total_loss / max(steps, 1):.4f}, {time.time() - t0:.1f} s, {steps} steps "
                  f"of {len(loader)} per process", flush=True)

    # lab: every rank's record, gathered; rank 0 writes the results file
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    record = {"rank": rank, "first_indices_per_epoch": seen, "shard_size": len(sampler), "steps": steps,
              "param_digest": digest[:16], "last_epoch_loss": total_loss / max(steps, 1)}
    records = [None] * world_size
    dist.all_gather_object(records, record)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"world_size": world_size, "backend": backend, "ranks": records}, f)
    cleanup()


def free_port():  # lab: ask the OS for a port nobody holds
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # lab:
    ap.add_argument("--world-size", type=int, default=None, help="processes (default: one per GPU, else 2)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--max-steps", type=int, default=None, help="stop each epoch after this many steps")
    ap.add_argument("--num-workers", type=int, default=4)
    ap.add_argument("--data-root", default=os.environ.get("MNIST_DATA_ROOT", "data"), help="folder with MNIST/raw")
    ap.add_argument("--out", default=None, help="rank 0 writes what every rank saw here (JSON)")
    args = ap.parse_args()
    world_size = args.world_size or torch.cuda.device_count() or 2  # lab: the article: torch.cuda.device_count()
    backend = "nccl" if torch.cuda.device_count() >= world_size else "gloo"  # lab: gloo without a GPU per process
    mp.spawn(train, args=(world_size, free_port(), backend, args), nprocs=world_size, join=True)
