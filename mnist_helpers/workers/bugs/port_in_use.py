"""Reproduce "Address already in use" (notebook 08_troubleshooting, article section 6).

The article's set-up code fixes ``MASTER_PORT=12355`` and calls ``init_process_group`` with the
``env://`` method: rank 0 then *listens* on that port (it hosts the TCPStore that the ranks meet at).
If anything else holds the port, a previous run that did not exit, say, rank 0 fails at once with
``EADDRINUSE``. ``mnist_helpers.launch`` never fixes a port (torchrun's ``--standalone`` rendezvous
binds port 0 and the OS picks a free one), so this worker brings the bug back on purpose:

    # the bug: a fixed port that another process holds
    python -m torch.distributed.run --standalone --nproc-per-node 1 \\
        -m mnist_helpers.workers.bugs.port_in_use --master-port 12355
    # the fix: no fixed port; torchrun's rendezvous picked one that is free
    python -m torch.distributed.run --standalone --nproc-per-node 1 -m mnist_helpers.workers.bugs.port_in_use

Run with plain Python it is a world of one that still makes a process group (so the port matters).
"""
from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

from mnist_helpers.distributed import cleanup
from mnist_helpers.worker import entry, finish, parser


@entry  # torchrun's @record + the series' error boundary (an expected error: one message with the fix, exit 2)
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__.splitlines()[0])
    ap.add_argument("--master-port", type=int, default=None,
                    help="fix MASTER_PORT like the article does (the bug); default: torchrun's own port")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds for the store and collectives")
    ap.add_argument("--out", default=None, help="rank 0 writes a JSON summary here")
    args = ap.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    # [bug]
    if args.master_port is not None:
        os.environ["MASTER_PORT"] = str(args.master_port)  # the article: MASTER_PORT=12355, a fixed port
        # Under torchrun the ranks would reuse torchrun's own store; the article's code makes its
        # own, with rank 0 listening on MASTER_PORT. That is the code path we reproduce.
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    os.environ.setdefault("MASTER_PORT", "29500")
    port = int(os.environ["MASTER_PORT"])
    dist.init_process_group("gloo", init_method="env://",   # rank 0 listens on MASTER_PORT
                            timeout=datetime.timedelta(seconds=args.timeout))
    # [/bug]
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        value = torch.ones(1)
        dist.all_reduce(value)
        summary = {"world_size": world_size, "master_port": port, "all_reduce": value.item()}
        finish(rank == 0, summary, args.out,
                      f"process group up on MASTER_PORT={port}; all_reduce -> {value.item():g}")
        return 0
    finally:
        cleanup()  # all ranks meet, then leave: a bare destroy can abort a peer's gloo threads (SIGABRT)


if __name__ == "__main__":
    sys.exit(cli())
