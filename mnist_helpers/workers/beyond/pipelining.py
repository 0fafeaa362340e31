"""Pipeline parallelism with ``torch.distributed.pipelining`` on gloo: the stage that does not work here
(introduced in 11_beyond_data_parallel).

Rank r holds stage r of ``ResMLP`` (input layer and the first half of the blocks on rank 0, the rest and the head on
the last rank); ``ScheduleGPipe`` splits each batch into ``--microbatches`` and passes activations forward and
gradients back with point-to-point sends. On torch 2.14.1 with gloo on a CPU the first ``schedule.step()`` never
returns (a known problem: pytorch/PiPPy#1130), so launch it with a timeout. Each rank prints where it is, so the
log shows where it hangs. With NCCL on GPUs the same code runs.

    # from a notebook: a bounded wait, then every process is stopped
    mnist_helpers.launch.torchrun("mnist_helpers.workers.beyond.pipelining", ["--steps", "1"], nproc=2, device="cpu", timeout=20)
    # by hand (stop it with Ctrl-C)
    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.beyond.pipelining --steps 1
"""
from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from mnist_helpers.worker import entry, finish, parser, process_group
from mnist_helpers.workers.beyond.common import build


class Stage(nn.Module):
    def __init__(self, model, rank: int, world: int):
        super().__init__()
        per = -(-len(model.blocks) // world)
        self.inp = model.inp if rank == 0 else None
        self.blocks = nn.ModuleList(list(model.blocks)[rank * per:(rank + 1) * per])
        self.head = model.head if rank == world - 1 else None

    def forward(self, x):
        if self.inp is not None:
            x = self.inp(torch.flatten(x, 1))
        for b in self.blocks:
            x = b(x)
        return self.head(x) if self.head is not None else x


def main(width: int = 64, blocks: int = 2, batch_size: int = 32, microbatches: int = 4, steps: int = 1, schedule_name="gpipe",
         out: str | None = None) -> dict:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    with process_group("gloo", always_group=True) as ctx:
        rank, world = ctx.rank, ctx.world_size
        stage = PipelineStage(Stage(build(width, blocks), rank, world), rank, world, ctx.device)
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
        schedule = kind(stage, microbatches, loss_fn=lambda out, y: F.cross_entropy(out, y))
        torch.manual_seed(0)
        X, y = torch.randn(batch_size, 1, 28, 28), torch.randint(0, 10, (batch_size,))
        seconds = []
        for s in range(steps):
            print(f"[rank {rank}] step {s}: schedule.step() started", flush=True)
            t0 = time.perf_counter()
            inputs = (X,) if rank == 0 else ()                                     # the first stage feeds the batch
            targets = {"target": y, "losses": []} if rank == world - 1 else {}  # the last one computes the loss
            schedule.step(*inputs, **targets)
            seconds.append(time.perf_counter() - t0)
            print(f"[rank {rank}] step {s}: done in {seconds[-1]:.2f} s", flush=True)
        result = {"world_size": world, "steps": steps, "schedule": schedule_name, "step_seconds": seconds}
        return finish(ctx.is_main, result, out)


@entry  # expected errors: one message with the fix, exit code 2
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    ap.add_argument("--out", default=None, help="rank 0 writes the results JSON here")
    args = ap.parse_args(argv)
    if min(args.width, args.blocks, args.batch_size, args.microbatches, args.steps) < 1:
        ap.error("every size must be a positive integer")
    main(args.width, args.blocks, args.batch_size, args.microbatches, args.steps, args.schedule, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
