"""Test worker: a worker of the progression on nodes that share no filesystem, played on one machine.

``python own_disk.py MODULE ARGS...`` runs ``MODULE.cli(ARGS)`` with ``{rank}`` in every argument replaced by this
process's RANK, so that ``--snapshot /tmp/x/node{rank}/snap.pt`` gives each rank a disk of its own: rank 0 writes
its snapshot where no other rank can see it, as on a cluster whose ``--snapshot`` folder is local to each node.
"""
import importlib
import os
import sys

if __name__ == "__main__":
    module, args = sys.argv[1], sys.argv[2:]
    rank = os.environ.get("RANK", "0")
    sys.exit(importlib.import_module(module).cli([a.replace("{rank}", rank) for a in args]))
