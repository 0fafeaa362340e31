"""Train MNIST with DistributedDataParallel, processes made by ``mp.spawn``: step 2 of the progression.

    single.py     one process, one device
    ddp_spawn.py  + DistributedDataParallel, processes made by mp.spawn  (this file; changes marked  # DDP:)
    ddp_train.py  + launched by torchrun, which sets RANK/LOCAL_RANK     (changes marked  # torchrun:)

This is the source article's section 5.2 style (``setup(rank, world_size)``, ``mp.spawn``), with two
fixes: the port is a free one the OS picks (the article's fixed 12355 fails when something holds it),
and the backend is chosen for the machine (``nccl`` when every process gets a GPU, else ``gloo``).
Every block this step adds or changes starts with one ``# DDP:`` comment. Shown in 12_ddp_in_depth (appendix A),
which shows the file and its diff; in a terminal:
``diff mnist_helpers/workers/progression/single.py mnist_helpers/workers/progression/ddp_spawn.py``. Run it from a
terminal (not from a notebook cell: ``mp.spawn`` pickles ``main`` by name, which a notebook cannot provide):

    python -m mnist_helpers.workers.progression.ddp_spawn --nproc 2 --epochs 1 --out results/spawn.json

``--nproc`` defaults to one process per GPU, or 2 on a machine without GPUs.
"""
from __future__ import annotations

import argparse
import json
import os  # DDP: MASTER_ADDR and MASTER_PORT for the rendezvous
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
# DDP: the process group and its collectives, the process starter, the wrapper that all-reduces gradients in
# backward(), and the sampler that gives each process its own shard of the data.
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from mnist_helpers.distributed import params_digest
from mnist_helpers.errors import cli_entry
from mnist_helpers.io import write_json
from mnist_helpers.resources import machine_info
from mnist_helpers.train import (TrainConfig, Training, build_training, check_run, epoch_line, load_snapshot,
                                 load_test_set, make_train_batches, save_snapshot, train_one_epoch)
# DDP: the core's helpers: the rank's identity, the backend choice, exact evaluation, gathering, a free port.
from mnist_helpers.data import mnist_datasets
from mnist_helpers.distributed import DistContext, choose_backend, evaluate_exact, gather_objects, wait_for_peers
from mnist_helpers.ports import free_port


class Trainer:
    """Same shape as pytorch/examples' DDP tutorial: _run_epoch, _save_snapshot, train.

    The per-batch step (their ``_run_batch``) is the loop body of ``mnist_helpers.train.train_one_epoch``,
    shared with ``fit()`` so that mixed precision and gradient accumulation behave the same everywhere.
    """

    def __init__(self, cfg: TrainConfig, tr: Training, batches, test_set, snapshot: Path | None,
                 ctx: DistContext):  # DDP: the trainer knows its rank and world size
        self.cfg, self.tr, self.batches, self.snapshot = cfg, tr, batches, snapshot
        self.X_test, self.y_test = test_set
        self.module = tr.model  # the bare model: what a snapshot saves and loads
        # DDP: wrapping broadcasts rank 0's weights to every rank; in backward() DDP's hooks all-reduce (average)
        # the gradients bucket by bucket, so every replica takes the same optimizer step.
        self.ctx = ctx
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None  # this process's GPU; None on CPU
        self.tr.model = DDP(self.module, device_ids=ids)
        self.epochs_run, self.steps_run, self.history = 0, 0, []
        if snapshot is not None and snapshot.exists():
            self._load_snapshot()

    def _restore_state(self, snap: dict) -> None:
        """Model, optimizer, scheduler, scaler, counters and history from a snapshot (RNG: the caller's job)."""
        self.module.load_state_dict(snap["model"])
        self.tr.optimizer.load_state_dict(snap["optimizer"])
        if self.tr.scheduler and snap.get("scheduler"):
            self.tr.scheduler.load_state_dict(snap["scheduler"])
        if self.tr.scaler and snap.get("scaler"):
            self.tr.scaler.load_state_dict(snap["scaler"])
        self.epochs_run, self.steps_run = snap["epoch"], snap["steps"]
        self.history = json.loads(snap["history"])

    def _load_snapshot(self) -> None:
        # weights_only=True (loading can never execute code), onto the CPU (where RNG states live; load_state_dict
        # moves the rest to the model's device), then the format and this run's settings are checked.
        snap = load_snapshot(self.snapshot, self.cfg, self.ctx.world_size)  # DDP: same world size
        self._restore_state(snap)
        torch.set_rng_state(snap["rng"]["torch"])
        random.setstate(snap["rng"]["python"])
        np.random.set_state(("MT19937", snap["rng"]["numpy"].numpy(), *snap["rng"]["numpy_rest"]))
        if self.ctx.is_main:  # DDP: rank 0 prints
            print(f"[rank 0] resumed from {self.snapshot} at epoch {self.epochs_run}", flush=True)

    def _save_snapshot(self) -> None:
        np_state = np.random.get_state()
        snap = {"model": self.module.state_dict(), "optimizer": self.tr.optimizer.state_dict(),
                "scheduler": self.tr.scheduler.state_dict() if self.tr.scheduler else None,
                "scaler": self.tr.scaler.state_dict() if self.tr.scaler else None,
                "epoch": self.epochs_run, "steps": self.steps_run, "history": json.dumps(self.history),
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                        "numpy": torch.from_numpy(np_state[1].copy()), "numpy_rest": list(np_state[2:])}}
        save_snapshot(snap, self.snapshot, self.cfg, self.ctx.world_size)  # DDP: records the world size

    def _run_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)  # a new shuffle every epoch (else every epoch repeats one order)
        left = None if self.cfg.max_steps is None else self.cfg.max_steps - self.steps_run
        # DDP: with grad_accum, no_sync() skips the all-reduce on all but the last micro-batch of a step; after the
        # epoch every rank scores its own slice of the test set and the sums are all-reduced: each image once.
        no_sync = self.tr.model.no_sync
        stats = train_one_epoch(self.tr, self.batches, self.cfg, max_steps=left, no_sync=no_sync)
        self.steps_run += stats["steps"]
        ev = evaluate_exact(self.tr.model, self.X_test, self.y_test, self.ctx, self.cfg.test_batch_size,
                            self.cfg.amp)
        images = stats["images"] * self.ctx.world_size  # every rank ran the same number of equal steps
        self.history.append({"epoch": epoch, "seconds": stats["seconds"], "images": images,
                             "steps": stats["steps"], "images_per_s": images / stats["seconds"],
                             "train_loss": stats["loss"], "test_loss": ev["loss"], "test_acc": ev["acc"],
                             "test_count": ev["count"]})
        if self.ctx.is_main:  # DDP: rank 0 prints
            print(epoch_line(epoch, {**stats, "images_per_s": images / stats["seconds"]}, ev), flush=True)

    def train(self) -> None:
        for epoch in range(self.epochs_run + 1, self.cfg.num_epochs + 1):
            if self.cfg.max_steps is not None and self.steps_run >= self.cfg.max_steps:
                break
            self._run_epoch(epoch)
            self.epochs_run = epoch
            if self.snapshot is not None and self.ctx.is_main:  # DDP: the replicas are identical: rank 0 saves
                self._save_snapshot()


# DDP: each rank trains on its own disjoint shard of every epoch. The article's way: a DistributedSampler under the
# DataLoader, shuffled with seed + epoch, so _run_epoch's set_epoch(epoch) gives every epoch a new order.
def prepare_batches(cfg: TrainConfig, device: torch.device, rank: int, world_size: int):
    """Shuffled training batches: in-memory tensors, or a DataLoader with ``--loader dataloader``."""
    if cfg.loader == "dataloader" and world_size > 1:
        dataset, _ = mnist_datasets(cfg.data_root)
        dataset = Subset(dataset, range(cfg.subset)) if cfg.subset else dataset
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed)
        loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, num_workers=cfg.num_workers,
                            pin_memory=cfg.pin_memory and device.type == "cuda",
                            persistent_workers=cfg.num_workers > 0)
        loader.set_epoch = sampler.set_epoch
        return loader
    return make_train_batches(cfg, device, rank, world_size)  # in memory: TensorBatches shards the same way


def load_train_objs(cfg: TrainConfig, device: torch.device, steps_per_epoch: int):
    """Model, optimizer, scheduler and scaler (seeded by ``cfg.seed``), and the test set."""
    return build_training(cfg, device, steps_per_epoch), load_test_set(cfg, device)


# DDP: the article's setup(): where rank 0 hosts the rendezvous (a free port the parent picked, not a fixed 12355),
# this process's device (one GPU per rank with nccl), then join the process group.
def setup(rank: int, world_size: int, port: int, backend: str) -> DistContext:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    return DistContext(rank, rank, world_size, backend, device)  # one node, so local rank = rank


# DDP: leave the process group however training ended. The ranks meet first (gloo sometimes aborted a rank whose
# peer left while it was still inside a collective; wait_for_peers skips the meeting while an error propagates).
def cleanup() -> None:
    wait_for_peers()
    dist.destroy_process_group()


# DDP: mp.spawn calls main(rank, *args) in every process it starts.
def main(rank: int, world_size: int, port: int, backend: str,
         cfg: TrainConfig, out: str | None = None, snapshot: str | None = None) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # DDP: join the group, then train inside try/finally so that the group is left however training ends; rank 0
    # alone prints, each rank prepares its own shard, and the parameter digests of every rank are gathered.
    ctx = setup(rank, world_size, port, backend)
    try:
        if ctx.is_main:
            print(f"[rank 0] world_size {ctx.world_size} | backend {ctx.backend} | device {ctx.device} "
                  f"| global batch {cfg.batch_size * ctx.world_size}", flush=True)
        t0 = time.perf_counter()
        batches = prepare_batches(cfg, ctx.device, ctx.rank, ctx.world_size)
        tr, test_set = load_train_objs(cfg, ctx.device, steps_per_epoch=len(batches))
        trainer = Trainer(cfg, tr, batches, test_set, Path(snapshot) if snapshot else None, ctx)
        trainer.train()
        digests = gather_objects(params_digest(trainer.tr.model))  # every rank's digest, in rank order
        result = {"world_size": ctx.world_size, "backend": ctx.backend, "device": str(ctx.device),
                  "config": cfg.to_dict(), "history": trainer.history,
                  "final_test_acc": trainer.history[-1]["test_acc"] if trainer.history else None,
                  "param_digests": digests, "wall_seconds": time.perf_counter() - t0, "machine": machine_info()}
        if ctx.is_main and out:  # DDP: rank 0 writes
            write_json(out, result)
        return result
    finally:
        cleanup()


@cli_entry  # expected errors (bad data, paths, snapshot): one message with the fix, exit code 2
def cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnist_helpers.workers.progression.ddp_spawn",  # DDP: its own name
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    TrainConfig.add_arguments(ap)
    ap.add_argument("--out", default=None, help="rank 0 writes the results JSON here")  # DDP: rank 0 writes
    ap.add_argument("--snapshot", default=None, help="save after every epoch, resume if present")
    ap.add_argument("--nproc", type=int, default=None, help="processes (default: one per GPU, else 2)")  # DDP: how many
    args = ap.parse_args(argv)
    try:
        cfg = TrainConfig.from_namespace(args)
    except ValueError as e:
        ap.error(str(e))
    # DDP: how many processes, checked before spawning (a child's error comes with a long traceback); the backend
    # (nccl if every process gets its own GPU, else gloo); the cores shared out between the processes, as
    # torchrun does (each child reads OMP_NUM_THREADS when it starts); then mp.spawn, which pickles `main` by its
    # module and name: each child imports this module and calls main(rank, ...).
    world_size = (torch.cuda.device_count() or 2) if args.nproc is None else args.nproc
    if world_size < 1:
        ap.error(f"--nproc must be a positive integer, got {world_size}")
    check_run(cfg, world_size, args.out, args.snapshot)
    backend = choose_backend(world_size)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    mp.spawn(main, args=(world_size, free_port(), backend, cfg, args.out, args.snapshot), nprocs=world_size)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
