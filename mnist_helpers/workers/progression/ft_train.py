"""Fault-tolerant DDP training: snapshots every N steps, exact resume mid-epoch (07_scaling_and_multinode).

A subclass of ``ddp_train.Trainer`` (the worker 12 shows, appendix A) that adds what a long job on many machines
needs when a process dies and ``torchrun --max-restarts`` starts the whole group again:

- a snapshot every ``--snapshot-every`` steps and at the end of every epoch, written atomically by
  rank 0 (``io.atomic_save``: temp file, fsync, rename), so a kill mid-write never leaves a
  torn file;
- resume of model, optimizer, scheduler, scaler, epoch, global step, every rank's RNG state, and the
  sampler position inside the epoch (the batches of the epoch's permutation already trained are
  skipped), so the resumed run continues the same sequence of updates;
- ``--stop-file PATH``: a stop asked for from outside (a scheduler's signal before a time limit or a
  preemption: ``scripts/slurm/train.sbatch`` creates the file). Every ``--stop-check-every`` steps the
  ranks look for the file and agree by one all-reduce, so all of them stop after the same step; rank 0
  writes a snapshot of that step and every worker exits with 0: nothing trained is lost, and the same
  command resumes there once the file is gone;
- ``--die-at-step K``: rank ``--die-rank`` sends itself SIGKILL (``kill -9``) after step K on the
  first attempt only (a run that resumed from a snapshot never dies), to demonstrate and test recovery.

    # one node, 2 processes, snapshot every 20 steps, restart up to 3 times
    torchrun --standalone --nproc-per-node=2 --max-restarts=3 -m mnist_helpers.workers.progression.ft_train \\
        --epochs 2 --snapshot /tmp/ft.pt --snapshot-every 20 --out /tmp/ft.json
    # the same, killing rank 1 after step 30 of the first attempt
    ... -m mnist_helpers.workers.progression.ft_train ... --die-at-step 30
    # stop cleanly when /tmp/ft.stop appears (`touch /tmp/ft.stop` from another shell)
    ... -m mnist_helpers.workers.progression.ft_train ... --snapshot /tmp/ft.pt --stop-file /tmp/ft.stop

Every ``TrainConfig`` field is a flag, as for ``ddp_train``. The results JSON adds ``restarts``
(torchrun's restart count for the run that finished), ``resumed_at_step`` and ``stopped_at_step`` (the
step a stop file ended the run at, or null).
"""
from __future__ import annotations

import itertools
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.distributed import all_reduce_sum, evaluate_exact, gather_objects, params_digest
from mnist_helpers.resources import machine_info
from mnist_helpers.train import TrainConfig, check_run, epoch_line, load_snapshot, save_snapshot, train_one_epoch
from mnist_helpers.worker import entry, finish, parser, process_group
from mnist_helpers.workers.progression.ddp_train import Trainer, backend_for, load_train_objs, prepare_batches


def _rng_state() -> dict:
    """This process's RNG states as plain bytes and ints: picklable for ``all_gather_object`` (which
    cannot carry tensors over gloo) and loadable by ``torch.load(weights_only=True)``."""
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state().numpy().tobytes(), "python": random.getstate(),
            "numpy": np_state[1].astype(np.uint32).tobytes(), "numpy_rest": [int(np_state[2]), int(np_state[3]),
                                                                            float(np_state[4])],
            "cuda": torch.cuda.get_rng_state().numpy().tobytes() if torch.cuda.is_available() else None}


def _set_rng_state(s: dict) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(s["torch"]), dtype=torch.uint8))
    random.setstate(s["python"])
    np.random.set_state(("MT19937", np.frombuffer(s["numpy"], dtype=np.uint32).copy(), *s["numpy_rest"]))
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(s["cuda"]), dtype=torch.uint8))


class FaultTolerantTrainer(Trainer):
    """``Trainer`` plus step snapshots and mid-epoch resume."""

    def __init__(self, cfg, tr, batches, test_set, snapshot, ctx, snapshot_every: int = 0,
                 die_at_step: int | None = None, die_rank: int = 1, stop_file: Path | None = None,
                 stop_check_every: int = 10):
        self.snapshot_every, self.die_at_step, self.die_rank = snapshot_every, die_at_step, die_rank
        self.stop_file, self.stop_check_every = stop_file, stop_check_every
        self.step_in_epoch, self.partial = 0, {"loss_sum": 0.0, "images": 0}
        self.resumed_at_step = self.stopped_at_step = None
        super().__init__(cfg, tr, batches, test_set, snapshot, ctx)  # loads our snapshot if present

    # ---------------------------------------------------------------- snapshots
    def _save_snapshot(self) -> None:
        rng = gather_objects(_rng_state())  # a collective: every rank calls it, rank 0 writes
        if not self.ctx.is_main:
            return
        tr = self.tr
        snap = {"model": self.module.state_dict(), "optimizer": tr.optimizer.state_dict(),
                "scheduler": tr.scheduler.state_dict() if tr.scheduler else None,
                "scaler": tr.scaler.state_dict() if tr.scaler else None,
                "epoch": self.epochs_run, "steps": self.steps_run, "step_in_epoch": self.step_in_epoch,
                "partial": dict(self.partial), "history": json.dumps(self.history),
                "world_size": self.ctx.world_size, "rng": rng}
        save_snapshot(snap, self.snapshot, self.cfg, self.ctx.world_size)

    def _load_snapshot(self) -> None:
        # weights_only=True, then the format and this run's settings (world size included) are checked
        snap = load_snapshot(self.snapshot, self.cfg, self.ctx.world_size)
        self._restore_state(snap)  # ddp_train's: model, optimizer, scheduler, scaler, counters, history
        self.step_in_epoch, self.partial = snap["step_in_epoch"], dict(snap["partial"])
        _set_rng_state(snap["rng"][self.ctx.rank])  # one state per rank: load_snapshot refused another world size
        self.resumed_at_step = self.steps_run
        if self.ctx.is_main:
            print(f"[rank 0] resumed from {self.snapshot}: epoch {self.epochs_run + 1}, step {self.steps_run} "
                  f"({self.step_in_epoch} into the epoch)", flush=True)

    def _snapshot_this_step(self) -> None:
        """A snapshot in the middle of an epoch: the partial loss sums include this step."""
        saved, self.partial = self.partial, self._now
        self._save_snapshot()
        self.partial = saved

    def _stop_requested(self) -> bool:
        """Does any rank see the stop file? One all-reduce, so that every rank gets the same answer at the same
        step: a rank that saw the file a step later would otherwise leave the others waiting in a collective."""
        seen = self.stop_file.exists()
        return all_reduce_sum([float(seen)], self.ctx.device)[0] > 0

    # ---------------------------------------------------------------- training
    def _after_step(self, counted: dict, running_loss: float) -> None:
        self.steps_run += 1
        self.step_in_epoch += 1
        self._now = {"loss_sum": self.partial["loss_sum"] + running_loss * counted["images"],
                     "images": self.partial["images"] + counted["images"]}
        snapshotted = self.snapshot is not None and self.snapshot_every and self.steps_run % self.snapshot_every == 0
        if snapshotted:
            self._snapshot_this_step()
        if self.stop_file is not None and self.steps_run % self.stop_check_every == 0 and self._stop_requested():
            self.stopped_at_step = self.steps_run  # remaining() yields no more batches: the epoch ends here
            if self.snapshot is not None and not snapshotted:
                self._snapshot_this_step()
            if self.ctx.is_main:
                saved = (f"snapshot of step {self.steps_run} written to {self.snapshot}; the same command resumes "
                         f"there once {self.stop_file} is gone" if self.snapshot is not None else
                         f"stopped after step {self.steps_run}, no --snapshot: nothing saved")
                print(f"[rank 0] stop requested ({self.stop_file} exists): {saved}", flush=True)
        # First attempt only: a resumed run never dies again. (TORCHELASTIC_RESTART_COUNT is counted per
        # agent, and with several nodes ranks can move between agents on a restart.)
        if self.die_at_step == self.steps_run and self.resumed_at_step is None and self.ctx.rank == self.die_rank:
            print(f"[rank {self.ctx.rank}] kill -9 myself after step {self.steps_run}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def _run_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)  # the same permutation as before the crash: seed + epoch
        counted = {"images": 0}

        def remaining():  # the sampler position: skip the batches this epoch already trained on
            for X, y in itertools.islice(self.batches, self.step_in_epoch, None):
                counted["images"] += len(X)
                yield X, y
                if self.stopped_at_step is not None:
                    return

        left = None if self.cfg.max_steps is None else self.cfg.max_steps - self.steps_run
        no_sync = self.tr.model.no_sync if isinstance(self.tr.model, DDP) else None
        stats = train_one_epoch(self.tr, remaining(), self.cfg, max_steps=left, no_sync=no_sync,
                                on_step=lambda step, loss: self._after_step(counted, loss))
        if self.stopped_at_step is not None:
            return  # stopped mid-epoch: no evaluation (the job is being stopped), no history entry
        images_local = self.partial["images"] + stats["images"]
        loss = (self.partial["loss_sum"] + stats["loss"] * stats["images"]) / max(images_local, 1)
        ev = evaluate_exact(self.tr.model, self.X_test, self.y_test, self.ctx, self.cfg.test_batch_size, self.cfg.amp)
        images = stats["images"] * self.ctx.world_size  # throughput of this attempt's part of the epoch
        ips = images / stats["seconds"] if stats["seconds"] > 0 else float("nan")
        self.history.append({"epoch": epoch, "seconds": stats["seconds"], "images": images_local * self.ctx.world_size,
                             "steps": self.step_in_epoch, "images_per_s": ips, "train_loss": loss,
                             "test_loss": ev["loss"], "test_acc": ev["acc"], "test_count": ev["count"]})
        if self.ctx.is_main:
            print(epoch_line(epoch, {**stats, "loss": loss, "images_per_s": ips}, ev), flush=True)

    def train(self) -> None:
        for epoch in range(self.epochs_run + 1, self.cfg.num_epochs + 1):
            if self.cfg.max_steps is not None and self.steps_run >= self.cfg.max_steps:
                break
            self._run_epoch(epoch)
            if self.stopped_at_step is not None:
                break
            self.epochs_run, self.step_in_epoch = epoch, 0
            self.partial = {"loss_sum": 0.0, "images": 0}
            if self.snapshot is not None:
                self._save_snapshot()


def main(cfg: TrainConfig, out=None, snapshot=None, snapshot_every: int = 0, die_at_step=None, die_rank: int = 1,
         backend: str = "auto", timeout=None, test_subset: int | None = None, stop_file=None,
         stop_check_every: int = 10) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    with process_group(backend_for(cfg.device, backend), timeout) as ctx:  # --device honoured as in ddp_train
        check_run(cfg, ctx.world_size, out if ctx.is_main else None, snapshot)  # before training
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if ctx.is_main:
            print(f"[rank 0] world_size {ctx.world_size} | backend {ctx.backend or 'none'} | attempt {restarts + 1}",
                  flush=True)
        t0 = time.perf_counter()
        batches = prepare_batches(cfg, ctx.device, ctx.rank, ctx.world_size)
        tr, test_set = load_train_objs(cfg, ctx.device, steps_per_epoch=len(batches))
        if test_subset:  # tests and quick demos: score the first N test images only
            test_set = tuple(t[:test_subset] for t in test_set)
        trainer = FaultTolerantTrainer(cfg, tr, batches, test_set, Path(snapshot) if snapshot else None, ctx,
                                       snapshot_every, die_at_step, die_rank, Path(stop_file) if stop_file else None,
                                       stop_check_every)
        trainer.train()
        result = {"world_size": ctx.world_size, "backend": ctx.backend, "device": str(ctx.device),
                  "config": cfg.to_dict(), "history": trainer.history,
                  "final_test_acc": trainer.history[-1]["test_acc"] if trainer.history else None,
                  "steps": trainer.steps_run, "restarts": restarts, "resumed_at_step": trainer.resumed_at_step,
                  "stopped_at_step": trainer.stopped_at_step,
                  "param_digests": gather_objects(params_digest(trainer.tr.model)),
                  "wall_seconds": time.perf_counter() - t0, "machine": machine_info()}
        return finish(ctx.is_main, result, out)


@entry  # expected errors: one message with the fix, exit code 2
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    TrainConfig.add_arguments(ap)
    ap.add_argument("--out", default=None, help="rank 0 writes the results JSON here")
    ap.add_argument("--snapshot", default=None, help="snapshot file: resumed from if present")
    ap.add_argument("--snapshot-every", type=int, default=0, help="also snapshot every N steps (0: per epoch only)")
    ap.add_argument("--die-at-step", type=int, default=None,
                    help="demo: SIGKILL one rank after this step (unless resumed from a snapshot)")
    ap.add_argument("--die-rank", type=int, default=1, help="the rank that --die-at-step kills")
    ap.add_argument("--stop-file", default=None,
                    help="stop cleanly (snapshot, exit 0) once this file exists; with --snapshot, beside it")
    ap.add_argument("--stop-check-every", type=int, default=10,
                    help="look for --stop-file every N steps (one tiny all-reduce each time)")
    ap.add_argument("--test-subset", type=int, default=None, help="score only the first N test images (quick runs)")
    ap.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl", "mpi"])
    ap.add_argument("--timeout", type=float, default=None, help="seconds before a stuck collective fails")
    args = ap.parse_args(argv)
    if args.snapshot_every < 0:
        ap.error(f"--snapshot-every must be >= 0, got {args.snapshot_every}")
    if args.die_at_step is not None and not args.snapshot:
        ap.error("--die-at-step needs --snapshot PATH, or the restarted run would start from scratch")
    if args.stop_file and not args.snapshot:
        ap.error("--stop-file needs --snapshot PATH: a stopped run resumes from the snapshot it writes")
    if args.stop_check_every < 1:
        ap.error(f"--stop-check-every must be >= 1, got {args.stop_check_every}")
    try:
        cfg = TrainConfig.from_namespace(args)
    except ValueError as e:
        ap.error(str(e))
    if args.test_subset is not None and not 1 <= args.test_subset <= 10000:
        ap.error(f"--test-subset must be between 1 and 10000, got {args.test_subset}")
    main(cfg, args.out, args.snapshot, args.snapshot_every, args.die_at_step, args.die_rank, args.backend,
         args.timeout, args.test_subset, args.stop_file, args.stop_check_every)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
