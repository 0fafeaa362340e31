"""Distributed checkpoints (DCP): save sharded state from N ranks, load it into M (introduced in 11_beyond_data_parallel).

``--mode save``: every rank shards ``ResMLP`` with FSDP2, trains ``--steps`` AdamW steps, and all ranks write the
model and optimizer state together with ``torch.distributed.checkpoint`` (``dcp.save``, or ``dcp.async_save``
with ``--async-save``): one file of shards per rank plus a ``.metadata`` file that says which rank wrote which slice
of which tensor. Each rank also ``torch.save``s its own ``model.state_dict()`` under ``<checkpoint>_torch_save/``, to
show what that gives for a sharded model (each file holds one rank's DTensor shards).
``--mode load``: M ranks (any M) shard a fresh model M ways and ``dcp.load`` into it: DCP reads each rank's slices
from whichever files hold them (resharding). ``load_one_process(path)`` does it with no process group at all.
Both modes report a sha256 of every full tensor, so a round trip can be checked for exact equality.

    # from a notebook
    mnist_helpers.launch.torchrun("mnist_helpers.workers.beyond.dcp_checkpoint", ["--mode", "save", "--path", "ckpt"], nproc=2, device="cpu")
    # by hand: save from 2 ranks, load into 4, then into one plain process
    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.beyond.dcp_checkpoint --mode save --path /tmp/ckpt --out s.json
    torchrun --standalone --nproc-per-node=4 -m mnist_helpers.workers.beyond.dcp_checkpoint --mode load --path /tmp/ckpt --out l.json
    python -m mnist_helpers.workers.beyond.dcp_checkpoint --mode load --path /tmp/ckpt
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F

from mnist_helpers.data import load_mnist
from mnist_helpers.worker import entry, finish, parser, process_group
from mnist_helpers.workers.beyond.common import build, global_batch


def digest(t: torch.Tensor) -> str:
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:16]


def sharded_model(width: int, blocks: int):
    from torch.distributed.fsdp import fully_shard

    model = build(width, blocks)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def files_on_disk(path) -> list[dict]:
    return [{"file": str(p.relative_to(path)), "bytes": p.stat().st_size}
            for p in sorted(Path(path).rglob("*")) if p.is_file()]


def save(path: str, width: int, blocks: int, steps: int, batch_size: int, async_save: bool, data_root=None) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rank, world = dist.get_rank(), dist.get_world_size()
    model = sharded_model(width, blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    X, y, _, _ = load_mnist(data_root, subset=(batch_size * world * steps, 1))
    for s in range(steps):
        Xg, yg = global_batch(X, y, s, batch_size, world)
        optimizer.zero_grad(set_to_none=True)
        F.nll_loss(model(Xg[rank::world]), yg[rank::world]).backward()
        optimizer.step()
    model_sd, optim_sd = get_state_dict(model, optimizer)  # DTensor shards, keyed by the parameters' names
    state = {"model": model_sd, "optim": optim_sd}
    if async_save:  # returns at once; the write happens in a background thread while training could go on
        dcp.async_save(state, checkpoint_id=path).result()
    else:
        dcp.save(state, checkpoint_id=path)
    naive = Path(str(path).rstrip("/") + "_torch_save")
    naive.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), naive / f"rank{rank}.pt")  # the naive way: pickles this rank's DTensors
    local = {k: list(v.to_local().shape) for k, v in model.state_dict().items()}
    full = {k: list(v.shape) for k, v in model.state_dict().items()}
    dist.barrier()
    return {"mode": "save", "digests": {k: digest(v) for k, v in model.state_dict().items()},
            "local_shapes_rank0": local if rank == 0 else None, "full_shapes": full,
            "files": files_on_disk(path), "torch_save_files": files_on_disk(naive), "async_save": async_save}


def load(path: str, width: int, blocks: int) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = sharded_model(width, blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model_sd, optim_sd = get_state_dict(model, optimizer)  # the shapes (and shards) this world wants
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)  # each rank reads just its slices, whoever wrote them
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    sd = model.state_dict()
    return {"mode": "load", "digests": {k: digest(v) for k, v in sd.items()},
            "local_shapes_rank0": {k: list(v.to_local().shape) for k, v in sd.items()},
            "optimizer_steps": int(max(float(s["step"]) for s in optimizer.state.values()))}


def load_one_process(path: str, width: int, blocks: int) -> dict:
    """Load the model part of a DCP checkpoint into a plain, unsharded model, in this process (no process group)."""
    model = build(width, blocks, seed=1)  # a different seed: the load must overwrite every weight
    state = {"model": model.state_dict()}
    import warnings

    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized, assuming ... a single process": yes
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=path)  # no process group: DCP reads every slice itself
    model.load_state_dict(state["model"])
    return {"mode": "load, one process", "digests": {k: digest(v) for k, v in model.state_dict().items()}}


def main(mode: str, path: str, width: int = 128, blocks: int = 2, steps: int = 2, batch_size: int = 32,
         async_save: bool = False, data_root=None, out: str | None = None) -> dict:
    import os

    if mode == "load" and "RANK" not in os.environ:  # plain python: one process, no group
        return finish(True, {**load_one_process(path, width, blocks), "world_size": 1}, out)
    with process_group("gloo", always_group=True) as ctx:
        result = save(path, width, blocks, steps, batch_size, async_save, data_root) if mode == "save" \
            else load(path, width, blocks)
        result["world_size"] = ctx.world_size
        return finish(ctx.is_main, result, out, f"{mode}: {len(result['digests'])} tensors, world size {ctx.world_size}")


@entry  # expected errors: one message with the fix, exit code 2
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--mode", choices=("save", "load"), default=None, help="save (N ranks) or load (any number)")
    ap.add_argument("--path", default=None, help="the checkpoint folder (created by save, read by load)")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2, help="AdamW steps before saving")
    ap.add_argument("--batch-size", type=int, default=32, help="images per process per step")
    ap.add_argument("--async-save", action="store_true", help="dcp.async_save instead of dcp.save")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--out", default=None, help="rank 0 writes the results JSON here")
    args = ap.parse_args(argv)
    if args.mode is None or args.path is None:
        ap.error("give --mode save|load and --path FOLDER, e.g. --mode save --path /tmp/ckpt")
    if args.mode == "load" and not (Path(args.path) / ".metadata").is_file():
        ap.error(f"{args.path} is not a DCP checkpoint (no .metadata file); run --mode save first")
    main(args.mode, args.path, args.width, args.blocks, args.steps, args.batch_size, args.async_save,
         args.data_root, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
