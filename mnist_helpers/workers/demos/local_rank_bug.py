"""The article's ``--local_rank`` argument under torchrun (12_ddp_in_depth, article section 5.3).

The article picks the GPU with ``parser.add_argument("--local_rank", type=int, default=0)``. That
was the contract of the old ``torch.distributed.launch``; torchrun never passes such an argument
and puts ``LOCAL_RANK`` in each process's environment instead. So under torchrun the argument keeps
its default: every process parses 0 and would put itself on ``cuda:0``. Each rank records its
command line, what the article's parser returns, what the environment says, and the other
variables torchrun sets (what ``init_process_group`` reads). The article's parser is the one
notebook 08 reproduces (``workers/bugs/local_rank.py``, ``article_parser``), imported, not copied;
08 shows the other side: the deprecated ``torch.distributed.launch`` passes ``--local-rank=N`` and
that parser stops with "unrecognized arguments".

    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.demos.local_rank_bug
"""
from __future__ import annotations

import os
import sys

from mnist_helpers.workers.bugs.local_rank import article_parser

TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


def article_local_rank(argv: list[str]) -> int:
    """The article's parser (08's reproduction), with parse_known_args: this demo has flags of its own."""
    args, _ = article_parser(fix=False).parse_known_args(argv)
    return args.local_rank


def run(ctx, args) -> dict:
    argv = sys.argv[1:]
    from_article = article_local_rank(argv)
    from_env = int(os.environ["LOCAL_RANK"])
    return {"rank": ctx.rank, "pid": os.getpid(), "argv": argv,
            "local_rank_in_argv": any(a.startswith(("--local_rank", "--local-rank")) for a in argv),
            "article_local_rank": from_article, "article_device": f"cuda:{from_article}",
            "env_local_rank": from_env, "correct_device": f"cuda:{from_env}",
            "env": {k: os.environ.get(k) for k in TORCHRUN_ENV}}


def summarize(ranks: list[dict]) -> dict:
    return {"world_size": len(ranks),
            "any_local_rank_argument": any(r["local_rank_in_argv"] for r in ranks),
            "article_devices": [r["article_device"] for r in ranks],
            "correct_devices": [r["correct_device"] for r in ranks],
            "article_distinct_devices": len({r["article_device"] for r in ranks}),
            "correct_distinct_devices": len({r["correct_device"] for r in ranks}),
            "env_set_by_torchrun": sorted(k for k in TORCHRUN_ENV if all(r["env"][k] is not None for r in ranks))}


if __name__ == "__main__":
    from mnist_helpers.workers.demos.common import cli

    sys.exit(cli(default=("local_rank_bug",)))
