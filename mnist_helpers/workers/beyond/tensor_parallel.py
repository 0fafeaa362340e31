"""Tensor parallelism with DTensor: one Linear pair split across ranks (introduced in 11_beyond_data_parallel).

The pair is ``common.Block`` (``up``: width -> 4 width, GELU, ``down``: 4 width -> width, plus the residual), a
transformer MLP. ``ColwiseParallel`` splits ``up``'s output features (rows of its weight) across the ranks, so each
rank computes its own slice of the 4w hidden units with no communication; ``RowwiseParallel`` splits ``down``'s input
features to match and sums the partial outputs with one all-reduce. Every rank gets the same full input and must
produce exactly the unsharded block's output and gradients: the worker checks both against an unsharded copy.
With 4 ranks it also builds the 2-D mesh a cluster would use (2 data-parallel groups x 2 tensor-parallel ranks).

    # from a notebook
    mnist_helpers.launch.torchrun("mnist_helpers.workers.beyond.tensor_parallel", ["--width", "64"], nproc=2, device="cpu")
    # by hand
    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.beyond.tensor_parallel --width 256 --out tp.json
    python -m mnist_helpers.workers.beyond.tensor_parallel --width 64   # a mesh of one: nothing is split
"""
from __future__ import annotations

import copy
import sys

import torch

from mnist_helpers.worker import entry, finish, parser, process_group
from mnist_helpers.workers.beyond.common import Block


def main(width: int = 64, batch_size: int = 16, out: str | None = None) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    with process_group("gloo", always_group=True) as ctx:
        world = ctx.world_size
        if (4 * width) % world or width % world:
            raise ValueError(f"--width {width}: width and 4 x width must divide by the world size {world}")
        torch.manual_seed(0)
        reference = Block(width)                 # unsharded: what the split pair must reproduce
        block = copy.deepcopy(reference)
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        torch.manual_seed(1)
        X = torch.randn(batch_size, width)       # same seed: every rank holds the same full input
        y_tp, y_ref = block(X), reference(X)
        y_tp.square().mean().backward()
        y_ref.square().mean().backward()
        grad_diff = max(float((p.grad.full_tensor() - q.grad).abs().max())
                        for p, q in zip(block.parameters(), reference.parameters()))
        result = {"world_size": world, "width": width,
                  "output_max_diff": float((y_tp - y_ref).abs().max()), "grad_max_diff": grad_diff,
                  "placements": {n: str(p.placements) for n, p in block.named_parameters()},
                  "local_shapes": {n: list(p.to_local().shape) for n, p in block.named_parameters()},
                  "full_shapes": {n: list(p.shape) for n, p in block.named_parameters()}}
        if world == 4:  # the cluster layout: data parallel across groups, tensor parallel inside one
            mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            result["mesh_2d"] = {"shape": list(mesh2.mesh.shape), "ranks": mesh2.mesh.tolist(),
                                 "dp_group_of_rank0": mesh2["dp"].mesh.tolist(),
                                 "tp_group_of_rank0": mesh2["tp"].mesh.tolist()} if ctx.rank == 0 else None
        return finish(ctx.is_main, result, out, f"tensor parallel over {world} rank(s): output diff "
                      f"{result['output_max_diff']:.1e}, gradient diff {grad_diff:.1e}")


@entry  # expected errors: one message with the fix, exit code 2
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--width", type=int, default=64, help="the block's width (divisible by the world size)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default=None, help="rank 0 writes the results JSON here")
    args = ap.parse_args(argv)
    if args.width < 1 or args.batch_size < 1:
        ap.error("--width and --batch-size must be positive integers")
    main(args.width, args.batch_size, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
