"""Draw the series' diagrams into notebooks/figures/ (`make diagrams`).

Five pictures of how data-parallel training works, drawn with matplotlib (Agg, no display needed):

    dp_step.png               one data-parallel step: N ranks, a shard each, gradients averaged, the same update
    ring_allreduce.png        ring all-reduce on 4 ranks: reduce-scatter, then all-gather, chunk by chunk
    distributed_sampler.png   DistributedSampler: 10 indices over 3 ranks, shuffled, padded to 12, set_epoch
    torchrun_roles.png        torchrun: nodes, an agent per node, the c10d rendezvous, workers and their variables
    ddp_zero_fsdp_memory.png  memory per GPU: DDP vs ZeRO-1 vs FSDP (ZeRO-3), replicated vs sharded on 4 ranks

    python scripts/make_diagrams.py                 # writes notebooks/figures/*.png
    python scripts/make_diagrams.py --out /tmp/fig  # somewhere else (tests/course/test_diagrams.py does)

The output is deterministic: the same matplotlib gives byte-identical files (no date or version in the PNG's
metadata). The sampler diagram shows what torch's own ``DistributedSampler`` returns, computed when it is drawn.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "notebooks" / "figures"
DPI = 100
# Okabe-Ito: distinguishable with the common colour-vision deficiencies
RANK_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7"]
GREY, DARK, LIGHT = "#7f7f7f", "#222222", "#f2f2f2"
COMM = "#D55E00"  # communication

plt.rcParams.update({
    "font.family": "DejaVu Sans", "font.size": 10, "svg.hashsalt": "mnist-scale-lab",
    "axes.spines.top": False, "axes.spines.right": False,
})


def _canvas(w: float, h: float, title: str):
    """A figure with one axis in data units = inches, no ticks: boxes are placed by hand."""
    fig = plt.figure(figsize=(w, h), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, w)
    ax.set_ylim(0, h)
    ax.axis("off")
    ax.text(w / 2, h - 0.3, title, ha="center", va="center", fontsize=13, weight="bold", color=DARK)
    return fig, ax


def _box(ax, x, y, w, h, text, face="white", edge=DARK, size=9, weight="normal", lw=1.2, color=DARK, style=None):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=style or "round,pad=0.02,rounding_size=0.06",
                                fc=face, ec=edge, lw=lw))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight=weight, color=color,
            linespacing=1.3)


def _arrow(ax, x0, y0, x1, y1, color=DARK, lw=1.3, style="-|>", ls="-", rad=0.0, shrink=1.0):
    ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle=style, mutation_scale=12, color=color, lw=lw,
                                 linestyle=ls, connectionstyle=f"arc3,rad={rad}", shrinkA=shrink, shrinkB=shrink))


def _save(fig, path: Path) -> Path:
    # no Software/date entries: a rerun with the same matplotlib writes the same bytes
    fig.savefig(path, dpi=DPI, metadata={"Software": None}, facecolor="white")
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- (a) one data-parallel step

def dp_step(path: Path) -> Path:
    n = 3
    W, H = 10.0, 6.6
    fig, ax = _canvas(W, H, "One data-parallel step (DDP), N = 3 ranks")
    col_w, gap = 2.5, 0.55
    x0 = (W - n * col_w - (n - 1) * gap) / 2
    _box(ax, x0, 5.6, W - 2 * x0, 0.45, "the same weights on every rank (DDP broadcasts rank 0's at construction)",
         face=LIGHT, size=9.5)
    ys = [(4.5, "shard {r} of the global batch\n(DistributedSampler: 1/N of it)"),
          (3.55, "forward on its shard\nloss$_{r}$"),
          (2.6, "backward\nlocal gradient $g_{r}$")]
    for r in range(n):
        x = x0 + r * (col_w + gap)
        c = RANK_COLORS[r]
        ax.text(x + col_w / 2, 5.37, f"rank {r}", ha="center", va="center", weight="bold", color=c)
        for i, (y, text) in enumerate(ys):
            _box(ax, x, y, col_w, 0.7, text.format(r=r), edge=c, lw=1.6)
            if i:
                _arrow(ax, x + col_w / 2, y + 0.95, x + col_w / 2, y + 0.72)
        _arrow(ax, x + col_w / 2, 2.6, x + col_w / 2, 2.17, color=COMM)
        _arrow(ax, x + col_w / 2, 1.53, x + col_w / 2, 1.15, color=COMM)
        _box(ax, x, 0.45, col_w, 0.7, "optimizer.step() with $g$\n-> the same new weights", edge=c, lw=1.6)
    _box(ax, x0, 1.55, W - 2 * x0, 0.6,
         r"all-reduce (average):  $g = (g_0 + g_1 + g_2)\,/\,3$   on every rank",
         face="#fbe3d6", edge=COMM, size=10.5, weight="bold", color=DARK)
    ax.text(W / 2, 0.18, "DDP starts the all-reduce during backward, bucket by bucket, as gradients become ready; "
            "g equals the gradient of the whole global batch", ha="center", va="center", fontsize=8.5, color=GREY)
    return _save(fig, path)


# --------------------------------------------------------------------------- (b) ring all-reduce

def _ring_states(n: int = 4):
    """Which ranks' contributions each chunk holds on each rank, after every step of the ring algorithm.

    Rank r sends to rank r+1. Reduce-scatter step s: rank r sends chunk (r - s) mod n, the receiver adds it to its
    own copy. After n-1 steps rank r holds the full sum of chunk (r + 1) mod n. All-gather step s: rank r sends the
    complete chunk (r + 1 - s) mod n, the receiver replaces its copy. Returns [(label, state, sent)] where state[r][c]
    is a frozenset of ranks and sent[r] the chunk rank r sent in that step."""
    state = [[frozenset([r]) for _ in range(n)] for r in range(n)]
    steps = [("start: each rank has its own gradient, in 4 chunks", [row[:] for row in state], None)]
    for s in range(n - 1):
        sent = [(r - s) % n for r in range(n)]
        new = [row[:] for row in state]
        for r in range(n):
            new[(r + 1) % n][sent[r]] = state[(r + 1) % n][sent[r]] | state[r][sent[r]]
        state = new
        steps.append((f"reduce-scatter, step {s + 1}: send one chunk, add the one received", [row[:] for row in state],
                      sent))
    for s in range(n - 1):
        sent = [(r + 1 - s) % n for r in range(n)]
        new = [row[:] for row in state]
        for r in range(n):
            new[(r + 1) % n][sent[r]] = state[r][sent[r]]
        state = new
        steps.append((f"all-gather, step {s + 1}: pass a finished chunk on", [row[:] for row in state], sent))
    return steps


def ring_allreduce(path: Path) -> Path:
    n = 4
    steps = _ring_states(n)
    W, H = 11.0, 8.0
    fig, ax = _canvas(W, H, "Ring all-reduce on 4 ranks: reduce-scatter, then all-gather")
    # the ring itself, on the left
    import math
    cx, cy, rad = 1.25, 4.9, 0.75
    pos = [(cx + rad * math.sin(2 * math.pi * r / n), cy + rad * math.cos(2 * math.pi * r / n)) for r in range(n)]
    for r, (x, y) in enumerate(pos):
        ax.add_patch(plt.Circle((x, y), 0.24, fc=RANK_COLORS[r], ec=DARK))
        ax.text(x, y, str(r), ha="center", va="center", color="white", weight="bold")
        x1, y1 = pos[(r + 1) % n]
        _arrow(ax, x, y, x1, y1, color=COMM, rad=-0.3, shrink=19, lw=1.6)
    ax.text(cx, cy - 1.35, "rank r sends to r+1\nand receives from r-1", ha="center", va="top", fontsize=8.5)
    ax.text(cx, 2.75, "Each rank sends\n2(N-1)/N of the tensor\nin 2(N-1) steps:\nunder 2x the tensor,\nwhatever N.\n\n"
            r"$A_{012}$: chunk A summed" "\nover ranks 0, 1, 2\n\n"
            "bold edge: the chunk\nthis rank sends next", ha="center", va="top", fontsize=8.5, color=DARK)
    # the grid: one row per step, one column per rank, 4 chunks per cell
    gx, col_w = 2.75, 2.0
    row_h, top = 0.98, H - 1.05
    letters = "ABCD"
    for r in range(n):
        ax.text(gx + r * col_w + col_w / 2 - 0.1, top + 0.25, f"rank {r}", ha="center", weight="bold",
                color=RANK_COLORS[r])
    for i, (label, state, _) in enumerate(steps):
        y = top - (i + 1) * row_h + 0.25
        ax.text(gx - 0.05, y + 0.62, label, ha="left", va="bottom", fontsize=8.5, color=GREY)
        nxt = steps[i + 1][2] if i + 1 < len(steps) else None
        for r in range(n):
            for c in range(n):
                x = gx + r * col_w + c * 0.45
                have = state[r][c]
                full = len(have) == n
                face = "#fbe3d6" if full else ("white" if len(have) == 1 else "#fdf1ea")
                edge_w = 2.6 if nxt is not None and nxt[r] == c else 0.9
                ax.add_patch(Rectangle((x, y), 0.42, 0.52, fc=face, ec=COMM if edge_w > 1 else DARK, lw=edge_w))
                text = rf"$\Sigma {letters[c]}$" if full else rf"${letters[c]}_{{{''.join(map(str, sorted(have)))}}}$"
                ax.text(x + 0.21, y + 0.26, text, ha="center", va="center", fontsize=8.5)
    return _save(fig, path)


# --------------------------------------------------------------------------- (c) DistributedSampler

def _sampler_indices(n: int, world: int, epoch: int, seed: int = 0):
    """torch's DistributedSampler, asked for each rank's indices (no process group needed when rank is given)."""
    import torch
    from torch.utils.data.distributed import DistributedSampler

    g = torch.Generator()
    g.manual_seed(seed + epoch)  # what DistributedSampler.__iter__ does with shuffle=True
    order = torch.randperm(n, generator=g).tolist()
    per_rank = []
    for r in range(world):
        s = DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=True, seed=seed)
        s.set_epoch(epoch)
        per_rank.append(list(s))
    total = -(-n // world) * world
    padded = order + order[: total - n]
    if [padded[r::world] for r in range(world)] != per_rank:
        raise RuntimeError("this torch's DistributedSampler no longer pads and strides as drawn: update the diagram")
    return order, padded, per_rank


def distributed_sampler(path: Path) -> Path:
    n, world = 10, 3
    W, H = 11.0, 9.3
    fig, ax = _canvas(W, H, "DistributedSampler: 10 samples over 3 ranks (shuffle=True, seed=0)")
    cell, x0 = 0.5, 3.1

    def square(i, y, value, face, hatched=False):
        ax.add_patch(Rectangle((x0 + i * cell, y), cell * 0.9, cell * 0.9, fc=face, ec=DARK, lw=1,
                               hatch="///" if hatched else None))
        ax.text(x0 + i * cell + cell * 0.45, y + cell * 0.45, str(value), ha="center", va="center", fontsize=10,
                weight="bold", color=DARK)

    def label(y, text, **kw):
        ax.text(x0 - 0.15, y + cell * 0.45, text, ha="right", va="center", fontsize=9, **kw)

    for e, top in ((0, H - 0.85), (1, H - 4.8)):
        order, padded, per_rank = _sampler_indices(n, world, e)
        ax.text(0.25, top, f"sampler.set_epoch({e})", fontsize=11, weight="bold", family="monospace", va="center")
        y = top - 0.75
        label(y, f"torch.randperm(10), seed 0 + epoch {e}")
        for i, v in enumerate(order):
            square(i, y, v, "white")
        y -= 0.65
        label(y, "padded to 12 = 3 x 4 (the first 2 again)")
        for i, v in enumerate(padded):
            square(i, y, v, LIGHT, hatched=i >= n)
        for r in range(world):  # rank r takes positions r, r+3, r+6, r+9: drawn under the positions it takes
            y -= 0.6
            label(y, f"rank {r}", color=RANK_COLORS[r], weight="bold")
            for i in range(r, len(padded), world):
                square(i, y, padded[i], RANK_COLORS[r] + "66", hatched=i >= n)
            ax.text(x0 + len(padded) * cell + 0.3, y + cell * 0.45, f"-> {per_rank[r]}", va="center",
                    fontsize=9.5, family="monospace", color=RANK_COLORS[r])
        dup = ", ".join(map(str, padded[n:]))
        ax.text(x0, y - 0.35, f"samples {dup} are seen twice this epoch (hatched): a padded evaluation counts them twice",
                fontsize=8.5, color=GREY, va="center")
    ax.text(W / 2, 0.45, "rank r takes every 3rd position, starting at r.  set_epoch(epoch) reseeds the shuffle: "
            "without it every epoch\nhas the order of epoch 0.  All ranks compute the same permutation because "
            "they share the seed.", ha="center", va="center", fontsize=9.5, color=DARK)
    return _save(fig, path)


# --------------------------------------------------------------------------- (d) torchrun roles

def torchrun_roles(path: Path) -> Path:
    W, H = 11.0, 6.9
    fig, ax = _canvas(W, H, "torchrun on 2 nodes x 2 processes: agents, rendezvous, workers")
    ax.text(W / 2, H - 0.75, "The agents meet at the rendezvous, agree on who takes part and hand out ranks; "
            "each worker gets RANK, LOCAL_RANK,\nWORLD_SIZE, MASTER_ADDR and MASTER_PORT in its environment "
            "(rank 0's node is the master).", ha="center", va="center", fontsize=9, color=DARK)
    node_w, node_h, y0 = 4.9, 4.1, 1.3
    agents = []
    for k in range(2):
        x = 0.4 + k * (node_w + 0.4)
        ax.add_patch(FancyBboxPatch((x, y0), node_w, node_h, boxstyle="round,pad=0.02,rounding_size=0.12",
                                    fc="#fafafa", ec=GREY, lw=1.2, ls="--"))
        ax.text(x + 0.15, y0 + node_h - 0.25, f"node {k}" + ("  (host NODE0)" if k == 0 else ""), weight="bold",
                va="center", fontsize=10.5)
        ax_, ay = x + 0.3, y0 + 2.45
        _box(ax, ax_, ay, 2.5, 0.8, f"torchrun agent\n(node rank {k})", face="#e8f0f8", edge="#0072B2", lw=1.5)
        agents.append((ax_, ay))
        ax.text(x + 2.95, y0 + 2.6, "starts its workers,\nwatches them, restarts\nall on a failure\n(--max-restarts)",
                fontsize=8, color=GREY, va="center")
        for j in range(2):
            rank = 2 * k + j
            wx = x + 0.3 + j * 2.35
            _box(ax, wx, y0 + 0.3, 2.05, 1.45, f"worker (your script)\nRANK={rank}\nLOCAL_RANK={j}\nWORLD_SIZE=4",
                 edge=RANK_COLORS[rank], lw=1.8, size=9)
            _arrow(ax, ax_ + 1.25, ay, wx + 1.02, y0 + 1.77)
    # the rendezvous store: on node 0, hosted by its agent
    rx, ry, rw, rh = 3.25, y0 + 3.2, 1.95, 0.72
    _box(ax, rx, ry, rw, rh, "c10d rendezvous\nNODE0:29400\n(a store in this agent)", face="#fbe3d6", edge=COMM,
         size=8, lw=1.5)
    (a0x, a0y), (a1x, a1y) = agents
    _arrow(ax, a0x + 2.5, a0y + 0.55, rx, ry + 0.2, color=COMM, ls="--", style="<|-|>")
    _arrow(ax, a1x, a1y + 0.55, rx + rw, ry + 0.2, color=COMM, ls="--", style="<|-|>")
    # the process group among workers
    ax.plot([0.9, W - 0.9], [1.0, 1.0], color=DARK, lw=1.2, ls=":")
    ax.text(W / 2, 0.78, "the 4 workers form one process group (init_process_group: NCCL on GPUs, gloo on CPUs) "
            "and all-reduce gradients over it", ha="center", va="center", fontsize=8.5)
    ax.text(W / 2, 0.3, "on every node:  torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d "
            "--rdzv-endpoint=NODE0:29400 --rdzv-id=job1 -m ...", ha="center", va="center", fontsize=8.5,
            family="monospace")
    return _save(fig, path)


# --------------------------------------------------------------------------- (e) DDP vs ZeRO-1 vs FSDP memory

def ddp_zero_fsdp_memory(path: Path) -> Path:
    n_params, world = 34_389_002, 4  # notebook 11's ResMLP(width=1024, blocks=4)
    mib = n_params * 4 / 2**20  # one fp32 copy of the parameters
    parts = [("parameters (fp32)", 1.0, "#0072B2"), ("gradients (fp32)", 1.0, "#E69F00"),
             ("AdamW state (2 x fp32)", 2.0, "#009E73")]
    sharded = {"DDP": (), "ZeRO-1": (2,), "FSDP (ZeRO-3)": (0, 1, 2)}
    fig, ax = plt.subplots(figsize=(10.0, 5.6), dpi=DPI)
    fig.subplots_adjust(left=0.08, right=0.73, top=0.86, bottom=0.14)
    x, ticks, labels = 0.0, [], []
    for strategy, shards in sharded.items():
        for r in range(world):
            bottom = 0.0
            for i, (name, size, color) in enumerate(parts):
                h = size * mib / (world if i in shards else 1)
                ax.bar(x, h, bottom=bottom, width=0.8, color=color, ec="white" if i not in shards else DARK,
                       hatch="//" if i in shards else None, lw=0.8)
                bottom += h
            ticks.append(x)
            labels.append(f"rank {r}")
            x += 1
        ax.text(x - 2.5, bottom + 25, f"{strategy}\n{bottom:,.0f} MiB per rank", ha="center", va="bottom",
                fontsize=10, weight="bold")
        x += 0.8
    ax.set_xticks(ticks, labels, fontsize=8, rotation=0)
    ax.set_ylabel("MiB per rank")
    ax.set_ylim(0, 4 * mib * 1.28)
    fig.suptitle("Memory per GPU: DDP vs ZeRO-1 vs FSDP on 4 ranks", fontsize=13, weight="bold")
    ax.set_title(f"AdamW in fp32, {n_params / 1e6:.1f} M parameters (notebook 11's ResMLP): the formula, "
                 "activations not included", fontsize=9, color=GREY)
    handles = [Rectangle((0, 0), 1, 1, fc=c, ec="white") for _, _, c in parts]
    handles.append(Rectangle((0, 0), 1, 1, fc="white", ec=DARK, hatch="//"))
    names = [p[0] for p in parts] + ["hatched: sharded, each rank\nholds a different 1/4"]
    fig.legend(handles, names, loc="upper left", bbox_to_anchor=(0.745, 0.84), frameon=False, fontsize=9)
    fig.text(0.745, 0.40, "DDP: everything replicated.\n\nZeRO-1: each rank keeps the\noptimizer state of 1/4 of "
             "the\nparameters and broadcasts\nwhat it updated.\n\nFSDP / ZeRO-3: parameters,\ngradients and "
             "state sharded;\neach layer is all-gathered\njust before it runs.", fontsize=8.5, va="top")
    return _save(fig, path)


DIAGRAMS = {
    "dp_step.png": dp_step,
    "ring_allreduce.png": ring_allreduce,
    "distributed_sampler.png": distributed_sampler,
    "torchrun_roles.png": torchrun_roles,
    "ddp_zero_fsdp_memory.png": ddp_zero_fsdp_memory,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(OUT), help="folder to write the PNGs into (default: notebooks/figures)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in DIAGRAMS.items():
        path = draw(out / name)
        print(f"{path}: {path.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
