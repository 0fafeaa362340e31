"""The distributed core (introduced in 00_setup_and_data, taught in 06_ddp_fundamentals).

A worker calls ``init_distributed()`` once. Under torchrun it reads ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` from the environment (torchrun never passes ``--local_rank`` on the command line) and
joins the process group; run with plain Python it is a world of one and no process group is made.

Backend: ``nccl`` when every process on this node has a GPU of its own, else ``gloo`` (CPU, or fewer
GPUs than processes). Evaluation is exact: each rank scores a disjoint shard (no padding duplicates,
unlike DistributedSampler) and the sums are all-reduced.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from mnist_helpers.errors import ConfigError, PortInUseError, SnapshotError
from mnist_helpers.resources import gpu_count


@dataclass(frozen=True)
class DistContext:
    rank: int            # global rank, 0 .. world_size-1
    local_rank: int      # rank on this node: picks the GPU
    world_size: int      # number of processes in the job
    backend: str | None  # nccl, gloo, or None for a world of one
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0 prints, writes results and saves snapshots."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or dist.is_initialized()


def env_rank() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment; (0, 0, 1) without torchrun."""
    def read(name, default):
        raw = os.environ.get(name)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None
    return read("RANK", 0), read("LOCAL_RANK", 0), read("WORLD_SIZE", 1)


def choose_backend(local_world_size: int | None = None) -> str:
    """``nccl`` if CUDA works and every local process gets its own GPU, otherwise ``gloo``."""
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = gpu_count()  # NVML's count: asking torch.cuda.is_available() would start the CUDA driver
    if gpus and gpus >= local_world_size:
        return "nccl"
    return "gloo"


def cuda_gpus() -> int:
    """How many CUDA GPUs this process can use (0 without CUDA), counted without starting the CUDA driver
    (:func:`mnist_helpers.resources.gpu_count`). Tests monkeypatch this one function to play a machine with 1 or 2
    GPUs."""
    return gpu_count()


def comparison_device(max_processes: int = 1, gpus: int | None = None) -> str:
    """The one device for every run of a comparison whose largest run has ``max_processes`` processes.

    ``"cuda"`` when each of those processes gets a CUDA GPU of its own (one process per GPU, nccl), else ``"cpu"``
    (gloo) for *every* run, the 1-process ones included: a table never sets a 1-process GPU run beside a
    2-process CPU run. ``gpus`` defaults to :func:`cuda_gpus`.
    """
    if max_processes < 1:
        raise ValueError(f"max_processes must be >= 1, got {max_processes}")
    gpus = cuda_gpus() if gpus is None else gpus
    return "cuda" if gpus >= max_processes else "cpu"


def _non_cuda_accelerator() -> str | None:
    from mnist_helpers.train import accelerator

    kind = accelerator()
    return kind if kind not in (None, "cuda") else None


def init_distributed(backend: str = "auto", timeout_s: float | None = None) -> DistContext:
    """Join the process group torchrun prepared (or none for a world of one) and pick this process's device."""
    rank, local_rank, world_size = env_rank()
    if backend == "auto":
        backend = choose_backend()
    if backend not in ("nccl", "gloo", "mpi"):
        raise ConfigError(f"backend must be auto, nccl, gloo or mpi; got {backend!r}")
    if backend == "nccl":
        check_nccl(local_rank)
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        other = _non_cuda_accelerator()
        if other and rank == 0:  # Apple MPS, Intel XPU: the DDP lessons are written for NCCL on CUDA GPUs
            print(f"distributed: gloo on the CPU; this machine's {other} accelerator is not used by the DDP "
                  "lessons (they need CUDA GPUs for nccl)", flush=True)
    if world_size == 1 and "MASTER_ADDR" not in os.environ:
        return DistContext(rank, local_rank, world_size, None, device)
    kwargs = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    if backend == "nccl":
        kwargs["device_id"] = device  # binds the communicator to this GPU early (no device guessing)
    try:
        dist.init_process_group(backend=backend, **kwargs)
    except RuntimeError as e:  # DistNetworkError: the rendezvous port is taken (a previous run, another job)
        if "EADDRINUSE" in str(e) or "address already in use" in str(e).lower():
            raise port_in_use(os.environ.get("MASTER_ADDR", "?"), os.environ.get("MASTER_PORT", "?")) from e
        raise
    return DistContext(dist.get_rank(), local_rank, dist.get_world_size(), backend, device)


def check_nccl(local_rank: int = 0) -> None:
    """ConfigError, with the command that works, unless this process has a CUDA GPU of its own for nccl."""
    gpus = gpu_count()
    if gpus == 0:
        raise ConfigError("--backend nccl needs one CUDA GPU per process, and this machine has none "
                          "(torch.cuda.device_count() is 0)", "use --backend gloo (or auto, which picks gloo here)")
    if local_rank >= gpus:
        raise ConfigError(f"--backend nccl: local rank {local_rank} has no GPU of its own ({gpus} GPU(s) on this node)",
                          f"one process per GPU (torchrun --nproc-per-node {gpus}), or --backend gloo")


def port_in_use(addr: str, port) -> PortInUseError:
    """The expected error for a taken MASTER_PORT, naming who holds it (``ports.find_port_holders``)."""
    from mnist_helpers.ports import find_port_holders

    holders = find_port_holders(int(port)) if str(port).isdigit() else []
    who = "; ".join(f"pid {h['pid']} ({h['cmdline'] or h['name'] or '?'})" for h in holders) or "another process"
    return PortInUseError(f"MASTER_PORT {port} on {addr} is in use by {who}",
                          "stop that process (kill PID), or let torchrun pick a free port: "
                          "torchrun --standalone ..., or MASTER_PORT=$(python -c 'from mnist_helpers.ports import "
                          "free_port; print(free_port())')")


def cleanup() -> None:
    """Leave the process group: all ranks meet once more, then destroy it.

    The meeting matters with gloo (torch 2.14.1): a rank that tears its group down and exits while a peer is still
    inside a collective, or whose gloo threads still hold work at interpreter shutdown, sometimes died with
    "terminate called without an active exception" (SIGABRT) after a successful run (about 1 launch in 10 on a
    busy 2-core machine). Skipped while an exception is propagating (a peer may be gone: no waiting then)."""
    if dist.is_available() and dist.is_initialized():
        wait_for_peers()
        dist.destroy_process_group()


def wait_for_peers(timeout_s: float = 60) -> None:
    """Every rank meets once more before leaving the group (``cleanup``'s first half, which the workers of 06 call
    before their own ``dist.destroy_process_group()``). Skipped while an exception is propagating, or alone."""
    if dist.is_initialized() and sys.exc_info()[0] is None and dist.get_world_size() > 1:
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))
            else:
                dist.barrier()
        except Exception:  # a peer already failed: leave anyway; its error is the one to report
            pass


def shard(n: int, rank: int, world_size: int) -> slice:
    """This rank's contiguous, disjoint part of ``range(n)``; the parts cover it exactly (sizes differ by <= 1)."""
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a few numbers over all ranks (float64, so counts up to 2**53 stay exact)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def evaluate_exact(model: nn.Module, X: torch.Tensor, y: torch.Tensor, ctx: DistContext,
                   batch_size: int = 1024, amp: str = "none") -> dict:
    """Test accuracy over every image exactly once across ranks: ``{"loss", "acc", "correct", "count"}``."""
    from mnist_helpers.train import evaluate

    module = getattr(model, "module", model)
    if dist.is_initialized():
        # BatchNorm running statistics are buffers that each rank updated with its own last batch;
        # score every shard with rank 0's, so the result equals one process evaluating rank 0's model.
        for buf in module.buffers():
            dist.broadcast(buf, src=0)
    part = shard(len(X), ctx.rank, ctx.world_size)
    local = evaluate(module, X[part], y[part], batch_size, amp)
    loss_sum, correct, count = all_reduce_sum([local["loss_sum"], local["correct"], local["count"]], ctx.device)
    return {"loss": loss_sum / count, "acc": correct / count, "correct": int(correct), "count": int(count)}


def params_digest(model: nn.Module) -> str:
    """sha256 of every parameter's bytes: equal digests mean bit-identical replicas."""
    h = hashlib.sha256()
    for p in getattr(model, "module", model).parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def gather_objects(obj) -> list:
    """Every rank's ``obj``, in rank order (a list of one without a process group)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def agree_on_snapshot(path) -> bool:
    """Does this run resume from ``path``? The same answer on every rank, or SnapshotError on every rank.

    Rank 0 alone writes the snapshot, so on nodes that share no filesystem only rank 0's node has it: ranks that
    each asked ``path.exists()`` would split, some resuming and some starting afresh (wrong training, or a hang in
    mismatched collectives). So every rank says what it sees (``train.snapshot_seen``: no file, or the snapshot's
    step and a hash of its bytes) and one ``all_gather_object`` shows every rank all the answers: True when all see
    the same file, False when none sees one, otherwise the same SnapshotError everywhere, naming which ranks see
    what. (The other remedy, rank 0 loading and broadcasting the state, would hide a missing snapshot from a rank 0
    that moved to another node after a restart: that run would silently start from scratch.)"""
    from mnist_helpers.train import snapshot_seen

    views = gather_objects(snapshot_seen(path))
    if all(v == views[0] for v in views):
        return views[0] is not None
    raise snapshot_disagreement(path, views)


def snapshot_disagreement(path, views: list) -> SnapshotError:
    """The error for ranks that see different files at ``path`` (``views[rank]``: None or (steps, sha256))."""
    groups: dict = {}
    for rank, view in enumerate(views):
        groups.setdefault(view, []).append(rank)

    def seen(view) -> str:
        if view is None:
            return "no file"
        steps, digest = view
        return (f"a snapshot of step {steps}" if steps >= 0 else "an unreadable file") + f" (sha256 {digest})"

    said = "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {seen(v)}" for v, r in groups.items())
    return SnapshotError(f"--snapshot {path} is not the same file on every rank ({said}); rank 0 alone writes it, "
                         "so the nodes must share the folder (or a file written moments ago is not visible yet)",
                         "put --snapshot on a filesystem every node shares (a Kubernetes volume, the cluster's "
                         "shared home), or copy the same file to every node")


def exit_now(code: int | None = 0) -> None:
    """End a worker process at once, after flushing its output, skipping C++ static destructors. ``None`` is 0:
    torchrun's ``@record`` returns it for a ``SystemExit(0)`` (``--help``).

    On torch 2.14.1 (CUDA build on a CPU) a worker that has finished, written its results and destroyed
    its process group sometimes aborts at interpreter shutdown ("terminate called without an active
    exception", SIGABRT): seen in about one run in two of the profiling and AllReduce benchmark workers
    under load. Their ``__main__`` ends here instead; an exception still propagates before this point,
    so real failures are reported as before.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if code is None else code)
