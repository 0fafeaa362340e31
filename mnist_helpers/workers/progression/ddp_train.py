"""Train MNIST with DistributedDataParallel under torchrun: one script for one process, one node or many.

The series' DDP worker: what notebooks 00, 02, 08 and 12 launch, and what ``ft_train.py`` (07, Slurm, Kubernetes)
builds on. It is the learner's progression carried to the whole of ``TrainConfig``: 06 turns a single-device script
into a DDP one (``train_single.py`` -> ``train_ddp.py``, every change marked ``# DDP:``), 07 adds snapshots and
resume (``train_ft.py``, ``# FT:``); this file marks the same steps ``# DDP:`` (what distribution adds to one
process's training) and ``# torchrun:`` (what being started by torchrun, or alone, asks of the script).
12_ddp_in_depth, appendix A, shows it whole and starts it both ways.

torchrun starts the processes and gives each one ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` in its environment (never a ``--local_rank`` argument); run with
plain Python the script is a world of one without a process group. Launch it from a notebook with
``mnist_helpers.launch.torchrun("mnist_helpers.workers.progression.ddp_train", [...], nproc=2)``, or by hand:

    # one process, no torchrun (world size 1, no process group)
    python -m mnist_helpers.workers.progression.ddp_train --epochs 1 --out results/run.json
    # one node, 2 processes (gloo on CPU, nccl when each process has a GPU)
    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.progression.ddp_train --epochs 1
    # the same 2 processes started by mp.spawn, the article's section 5.2 way (no torchrun)
    python -m mnist_helpers.workers.progression.ddp_train --spawn 2 --epochs 1
    # two nodes, 4 GPUs each: run on both nodes, HOST being node 0's address
    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 \\
        --rdzv-id=mnist1 -m mnist_helpers.workers.progression.ddp_train --epochs 1

Every ``TrainConfig`` field is a flag (``--batch-size`` is per process). Extra flags:
``--out PATH`` (rank 0 writes the results JSON), ``--snapshot PATH`` (saved atomically by rank 0 after every
epoch; a restarted job resumes from it; with several nodes it must be on a filesystem they all share: ranks that
see different files all stop with a SnapshotError), ``--backend``, ``--timeout`` (seconds for collectives),
``--spawn N`` (start N processes on this machine with ``mp.spawn`` instead of torchrun).
Workers never download: the launcher provisions MNIST first (``make data`` by hand).
"""
from __future__ import annotations

import argparse
import datetime  # torchrun: the --timeout for collectives
import json
import os  # DDP: MASTER_ADDR and MASTER_PORT for the rendezvous
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
# DDP: the process group and its collectives, the wrapper that all-reduces gradients in
# backward(), and the sampler that gives each process its own shard of the data.
import torch.distributed as dist
# torchrun: torchrun starts the processes; @record reports a failing rank's traceback to torchrun. mp.spawn is the
# way without torchrun (--spawn).
import torch.multiprocessing as mp
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from mnist_helpers.distributed import params_digest
from mnist_helpers.errors import cli_entry
from mnist_helpers.io import write_json
from mnist_helpers.resources import machine_info
from mnist_helpers.train import (TrainConfig, Training, build_training, check_run, epoch_line, load_snapshot,
                                 load_test_set, make_train_batches, save_snapshot, select_device, train_one_epoch)
# DDP: the core's helpers: the rank's identity, the backend choice, exact evaluation, gathering.
from mnist_helpers.data import mnist_datasets
from mnist_helpers.distributed import DistContext, choose_backend, evaluate_exact, gather_objects, wait_for_peers
# torchrun: the core's checks with a clear message for a missing GPU, a taken port or a snapshot that not every
# node sees, and its world-of-one set-up for `python -m` alone; a free port only for --spawn (torchrun picks its own).
from mnist_helpers.distributed import agree_on_snapshot, check_nccl, init_distributed, port_in_use
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
        if dist.is_initialized():  # torchrun: `python -m ...` without torchrun is a world of one: no group, no DDP
            ids = [ctx.device.index] if ctx.device.type == "cuda" else None  # this process's GPU; None on CPU
            self.tr.model = DDP(self.module, device_ids=ids)
        self.epochs_run, self.steps_run, self.history = 0, 0, []
        # torchrun: nodes may share no filesystem: resume only if every rank sees the same snapshot (else all stop)
        if snapshot is not None and agree_on_snapshot(snapshot):
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
        no_sync = self.tr.model.no_sync if isinstance(self.tr.model, DDP) else None  # torchrun: or a world of one
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


# torchrun: torchrun started this process and put its place in the environment: RANK, WORLD_SIZE, LOCAL_RANK (its
# index on this node: its GPU; never a --local_rank argument) and MASTER_ADDR/MASTER_PORT (the rendezvous, which
# init_process_group reads: init_method="env://"). Run with plain Python there is no RANK: a world of one.
def setup(backend: str, timeout: float | None) -> DistContext:
    if "RANK" not in os.environ:
        return init_distributed(backend, timeout)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    backend = choose_backend() if backend == "auto" else backend
    if backend == "nccl":
        check_nccl(local_rank)  # one GPU per process, or a message with the command that works
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    kwargs = {"timeout": datetime.timedelta(seconds=timeout)} if timeout else {}
    try:
        dist.init_process_group(backend, **kwargs)
    except RuntimeError as e:  # the rendezvous port is taken (a previous run, another job): say by whom
        if "EADDRINUSE" in str(e) or "address already in use" in str(e).lower():
            raise port_in_use(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) from e
        raise
    return DistContext(rank, local_rank, world_size, backend, device)


# torchrun: the backend asked for with --device: cpu keeps every process on the CPU (gloo), cuda needs a GPU per
# process (nccl); auto leaves the choice to the backend (nccl when every process has a GPU, else gloo).
def backend_for(device: str, backend: str) -> str:
    if device == "auto":
        return backend
    select_device(device)  # a clear error when that device is not here
    return ("gloo" if device == "cpu" else "nccl") if backend == "auto" else backend


# DDP: leave the process group however training ended. The ranks meet first (gloo sometimes aborted a rank whose
# peer left while it was still inside a collective; wait_for_peers skips the meeting while an error propagates).
def cleanup() -> None:
    wait_for_peers()
    if dist.is_initialized():  # torchrun: a world of one (plain `python -m ...`) has no group to leave
        dist.destroy_process_group()


# torchrun: one call per process, which torchrun started: no rank, world size or port to pass in.
def main(cfg: TrainConfig, out: str | None = None, snapshot: str | None = None,
         backend: str = "auto", timeout: float | None = None) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # DDP: join the group, then train inside try/finally so that the group is left however training ends; rank 0
    # alone prints, each rank prepares its own shard, and the parameter digests of every rank are gathered.
    ctx = setup(backend_for(cfg.device, backend), timeout)  # torchrun: nothing to pass in; every rank checks the run before training
    try:
        check_run(cfg, ctx.world_size, out if ctx.is_main else None, snapshot)
        if ctx.is_main:
            print(f"[rank 0] world_size {ctx.world_size} | backend {ctx.backend or 'none'} | device {ctx.device} "
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


# torchrun: without torchrun, mp.spawn starts the processes (the article's section 5.2 way). The parent picks a free
# port; each child puts in its own environment what torchrun would have put there, then runs main() like a torchrun
# worker. mp.spawn pickles _spawned by its module and name: each child imports this module (never a notebook's cell).
def _spawned(rank: int, world_size: int, port: int, cfg: TrainConfig, out: str | None, snapshot: str | None,
             backend: str, timeout: float | None) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="localhost", MASTER_PORT=str(port))
    main(cfg, out, snapshot, backend, timeout)


def spawn(nproc: int, cfg: TrainConfig, out: str | None = None, snapshot: str | None = None,
          backend: str = "auto", timeout: float | None = None) -> None:
    """``nproc`` processes on this machine with ``mp.spawn``, each one a torchrun worker's equal."""
    check_run(cfg, nproc, out, snapshot)  # before spawning: a child's error comes with a long traceback
    # the cores shared out between the processes, as torchrun does (each child reads OMP_NUM_THREADS when it starts)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    mp.spawn(_spawned, args=(nproc, free_port(), cfg, out, snapshot, backend, timeout), nprocs=nproc)


@record  # torchrun: on failure torchrun reports this rank's traceback as the root cause
@cli_entry  # expected errors (bad data, paths, snapshot): one message with the fix, exit code 2
def cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnist_helpers.workers.progression.ddp_train",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    TrainConfig.add_arguments(ap)
    ap.add_argument("--out", default=None, help="rank 0 writes the results JSON here")  # DDP: rank 0 writes
    ap.add_argument("--snapshot", default=None, help="save after every epoch, resume if present")
    # torchrun: no --nproc (torchrun's --nproc-per-node, or --spawn); the backend may be forced, collectives time out.
    ap.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl", "mpi"])
    ap.add_argument("--timeout", type=float, default=None, help="seconds before a stuck collective fails")
    ap.add_argument("--spawn", type=int, default=None, metavar="N",
                    help="start N processes with mp.spawn instead of torchrun (one machine)")
    args = ap.parse_args(argv)
    try:
        cfg = TrainConfig.from_namespace(args)
    except ValueError as e:
        ap.error(str(e))
    if args.spawn is not None:
        if args.spawn < 1:
            ap.error(f"--spawn must be a positive number of processes, got {args.spawn}")
        if "RANK" in os.environ:
            ap.error("--spawn starts its own processes: run it with python, not under torchrun")
        spawn(args.spawn, cfg, args.out, args.snapshot, args.backend, args.timeout)
        return 0
    # torchrun: torchrun made the processes (and set OMP_NUM_THREADS=1 in each unless it was set): call main once.
    main(cfg, args.out, args.snapshot, args.backend, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
