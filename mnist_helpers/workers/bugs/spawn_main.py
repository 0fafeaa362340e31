"""Reproduce "Can't get attribute 'train' on <module '__main__'>" from mp.spawn (notebook 08_troubleshooting).

``torch.multiprocessing.spawn`` starts fresh interpreters and sends them the function to run *by
name* (pickled as module + attribute). A function defined in a notebook lives in the kernel's
``__main__``, which has no file: the children cannot import it and die while unpickling. A script
run from a file works, because spawn re-imports the file in each child. To see the notebook's
situation from a terminal, pass this file's text with ``-c`` (``__main__`` then has no file either):

    python -c "$(cat mnist_helpers/workers/bugs/spawn_main.py)"          # the bug
    python -c "$(cat mnist_helpers/workers/bugs/spawn_main.py)" --fix    # the fix: the function imported by name

The fix imports ``train`` from this module's importable name, ``mnist_helpers.workers.bugs.spawn_main``
(in a notebook: move the function into a ``.py`` module, or launch a worker script with torchrun).
"""
import argparse

import torch.multiprocessing as mp


def train(rank: int, world_size: int) -> None:
    print(f"hello from spawned rank {rank} of {world_size}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--fix", action="store_true", help="spawn a function imported from a module by name")
    ap.add_argument("--nprocs", type=int, default=2)
    args = ap.parse_args()
    if not args.fix:
        # [bug]
        target = train  # pickled as __main__:train, which a child cannot find
        # [/bug]
    else:
        # [fix]
        from mnist_helpers.workers.bugs.spawn_main import train as target  # pickled as mnist_helpers...:train
        # [/fix]
    mp.spawn(target, args=(args.nprocs,), nprocs=args.nprocs, join=True)
