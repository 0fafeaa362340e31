"""Reproduce the article's ``--local_rank`` argument bug (notebook 08_troubleshooting, article 5.3).

The article reads the GPU index with ``parser.add_argument("--local_rank", type=int, default=0)``.

- Under the deprecated ``python -m torch.distributed.launch`` the script receives
  ``--local-rank=N`` (dashed since torch 2.0) and argparse stops with
  ``error: unrecognized arguments: --local-rank=0``.
- Under ``torchrun`` no argument arrives at all: every process keeps the default 0 and would put
  itself on ``cuda:0`` (silently; see ``workers/demos/local_rank_bug.py`` of 12 for that side).

``--fix`` reads ``LOCAL_RANK`` from the environment, which both launchers set:

    python -m torch.distributed.launch --nproc-per-node 1 mnist_helpers/workers/bugs/local_rank.py        # the bug
    python -m torch.distributed.launch --nproc-per-node 1 mnist_helpers/workers/bugs/local_rank.py --fix  # the fix
    torchrun --standalone --nproc-per-node 2 mnist_helpers/workers/bugs/local_rank.py --fix
"""
import argparse
import os
import sys


def article_parser(fix: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fix", action="store_true")
    if not fix:
        # [bug]
        parser.add_argument("--local_rank", type=int, default=0)  # the article, verbatim
        # [/bug]
    else:
        # [fix]
        parser.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int, default=None)  # both spellings
        # [/fix]
    return parser


if __name__ == "__main__":
    fix = "--fix" in sys.argv[1:]
    args = article_parser(fix).parse_args()  # the bug: exits with "unrecognized arguments: --local-rank=N"
    if not fix:
        print(f"local_rank from the argument: {args.local_rank}", flush=True)
    else:
        # [fix:env]
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # the fix: the environment, which both launchers set
        # [/fix:env]
        print(f"local_rank from the environment: {local_rank} (argument said {args.local_rank}); "
              f"device would be cuda:{local_rank}", flush=True)
