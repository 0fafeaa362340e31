"""Train MNIST on one device: step 1 of the worker progression (12_ddp_in_depth, appendix A).

Three workers, each a small diff of the previous one with every changed line marked (the idea of
pytorch/examples' ddp-tutorial-series), so you can see exactly what distribution adds:

    single.py     one process, one device                              (this file)
    ddp_spawn.py  + DistributedDataParallel, processes made by mp.spawn  (lines marked  # DDP:)
    ddp_train.py  + launched by torchrun, which sets RANK/LOCAL_RANK     (lines marked  # torchrun:)

Read the steps with ``diff mnist_helpers/workers/progression/single.py mnist_helpers/workers/progression/ddp_spawn.py``.
Run it:

    python -m mnist_helpers.workers.progression.single --epochs 1 --out results/single.json

Every ``TrainConfig`` field is a flag. ``--out`` writes the results JSON (the same keys as
``ddp_train``), ``--snapshot PATH`` saves after every epoch and resumes from it when present.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from mnist_helpers.distributed import params_digest
from mnist_helpers.errors import cli_entry
from mnist_helpers.io import write_json
from mnist_helpers.resources import machine_info
from mnist_helpers.train import (TrainConfig, Training, build_training, check_run, epoch_line, load_snapshot,
                                 load_test_set, make_train_batches, save_snapshot, train_one_epoch)
from mnist_helpers.train import evaluate, select_device


class Trainer:
    """Same shape as pytorch/examples' DDP tutorial: _run_epoch, _save_snapshot, train.

    The per-batch step (their ``_run_batch``) is the loop body of ``mnist_helpers.train.train_one_epoch``,
    shared with ``fit()`` so that mixed precision and gradient accumulation behave the same everywhere.
    """

    def __init__(self, cfg: TrainConfig, tr: Training, batches, test_set, snapshot: Path | None):
        self.cfg, self.tr, self.batches, self.snapshot = cfg, tr, batches, snapshot
        self.X_test, self.y_test = test_set
        self.module = tr.model  # the bare model: what a snapshot saves and loads
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
        snap = load_snapshot(self.snapshot, self.cfg, 1)
        self._restore_state(snap)
        torch.set_rng_state(snap["rng"]["torch"])
        random.setstate(snap["rng"]["python"])
        np.random.set_state(("MT19937", snap["rng"]["numpy"].numpy(), *snap["rng"]["numpy_rest"]))
        print(f"[rank 0] resumed from {self.snapshot} at epoch {self.epochs_run}", flush=True)

    def _save_snapshot(self) -> None:
        np_state = np.random.get_state()
        snap = {"model": self.module.state_dict(), "optimizer": self.tr.optimizer.state_dict(),
                "scheduler": self.tr.scheduler.state_dict() if self.tr.scheduler else None,
                "scaler": self.tr.scaler.state_dict() if self.tr.scaler else None,
                "epoch": self.epochs_run, "steps": self.steps_run, "history": json.dumps(self.history),
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                        "numpy": torch.from_numpy(np_state[1].copy()), "numpy_rest": list(np_state[2:])}}
        save_snapshot(snap, self.snapshot, self.cfg, 1)

    def _run_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)  # a new shuffle every epoch (else every epoch repeats one order)
        left = None if self.cfg.max_steps is None else self.cfg.max_steps - self.steps_run
        stats = train_one_epoch(self.tr, self.batches, self.cfg, max_steps=left)
        self.steps_run += stats["steps"]
        ev = evaluate(self.tr.model, self.X_test, self.y_test, self.cfg.test_batch_size, self.cfg.amp)
        images = stats["images"]
        self.history.append({"epoch": epoch, "seconds": stats["seconds"], "images": images,
                             "steps": stats["steps"], "images_per_s": images / stats["seconds"],
                             "train_loss": stats["loss"], "test_loss": ev["loss"], "test_acc": ev["acc"],
                             "test_count": ev["count"]})
        print(epoch_line(epoch, {**stats, "images_per_s": images / stats["seconds"]}, ev), flush=True)

    def train(self) -> None:
        for epoch in range(self.epochs_run + 1, self.cfg.num_epochs + 1):
            if self.cfg.max_steps is not None and self.steps_run >= self.cfg.max_steps:
                break
            self._run_epoch(epoch)
            self.epochs_run = epoch
            if self.snapshot is not None:
                self._save_snapshot()


def prepare_batches(cfg: TrainConfig, device: torch.device):
    """Shuffled training batches: in-memory tensors, or a DataLoader with ``--loader dataloader``."""
    return make_train_batches(cfg, device)


def load_train_objs(cfg: TrainConfig, device: torch.device, steps_per_epoch: int):
    """Model, optimizer, scheduler and scaler (seeded by ``cfg.seed``), and the test set."""
    return build_training(cfg, device, steps_per_epoch), load_test_set(cfg, device)


def main(cfg: TrainConfig, out: str | None = None, snapshot: str | None = None) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = select_device(cfg.device)
    print(f"[rank 0] world_size 1 | device {device} | batch {cfg.batch_size}", flush=True)
    t0 = time.perf_counter()
    batches = prepare_batches(cfg, device)
    tr, test_set = load_train_objs(cfg, device, steps_per_epoch=len(batches))
    trainer = Trainer(cfg, tr, batches, test_set, Path(snapshot) if snapshot else None)
    trainer.train()
    digests = [params_digest(trainer.tr.model)]
    result = {"world_size": 1, "backend": None, "device": str(device),
              "config": cfg.to_dict(), "history": trainer.history,
              "final_test_acc": trainer.history[-1]["test_acc"] if trainer.history else None,
              "param_digests": digests, "wall_seconds": time.perf_counter() - t0, "machine": machine_info()}
    if out:
        write_json(out, result)
    return result


@cli_entry  # expected errors (bad data, paths, snapshot): one message with the fix, exit code 2
def cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnist_helpers.workers.progression.single",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    TrainConfig.add_arguments(ap)
    ap.add_argument("--out", default=None, help="write the results JSON here")
    ap.add_argument("--snapshot", default=None, help="save after every epoch, resume if present")
    args = ap.parse_args(argv)
    try:
        cfg = TrainConfig.from_namespace(args)
    except ValueError as e:
        ap.error(str(e))
    check_run(cfg, 1, args.out, args.snapshot)  # before training: data, output paths, snapshot
    main(cfg, args.out, args.snapshot)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
