"""Check this machine for the usual causes of failed distributed runs (introduced in 08_troubleshooting).

    python -m mnist_helpers.course.doctor                       # every check, one line each, with the fix
    python -m mnist_helpers.course.doctor --nproc 2 --num-workers 4 --batch-size 128 --json

Checks: ports (the default MASTER_PORT 29500 and any MASTER_PORT in the environment; who holds
them), loopback networking (a gloo process group of one on 127.0.0.1), ``GLOO_SOCKET_IFNAME`` /
``NCCL_SOCKET_IFNAME`` naming real interfaces, shared memory (``/dev/shm`` against what DataLoader
workers need), GPU visibility and count (``CUDA_VISIBLE_DEVICES``), NCCL and gloo availability,
thread settings (``OMP_NUM_THREADS`` x processes against the cores this process may use) and the
MNIST files (``mnist_helpers.data.verify_mnist``). Each finding is ``ok``, ``info``, ``warn`` or
``error`` and carries the fix; the exit code is 1 when any finding is an error, 2 when the command
itself cannot run (a bad flag), with the fix (``mnist_helpers.errors``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass

import psutil
import torch
import torch.distributed as dist

from mnist_helpers.data import DataError, verify_mnist
from mnist_helpers.errors import cli_entry
from mnist_helpers.io import MiB
from mnist_helpers.ports import find_port_holders, free_port, port_is_free
from mnist_helpers.resources import gpu_count, usable_cores

LEVELS = ("ok", "info", "warn", "error")
DEFAULT_MASTER_PORT = 29500
MNIST_SAMPLE_BYTES = 28 * 28 * 4 + 8  # one normalised float32 image + its int64 label


@dataclass
class Finding:
    check: str
    level: str     # ok, info, warn, error
    message: str   # what was found
    fix: str = ""  # what to do (empty when nothing is needed)


def check_ports(ports: list[int] | None = None) -> list[Finding]:
    wanted = [DEFAULT_MASTER_PORT]
    if os.environ.get("MASTER_PORT", "").isdigit():
        wanted.append(int(os.environ["MASTER_PORT"]))
    out = []
    for port in sorted(set(ports or wanted)):
        if port_is_free(port):
            out.append(Finding(f"port {port}", "ok", "free"))
            continue
        holders = find_port_holders(port)
        who = "; ".join(f"pid {h['pid']} {h['name'] or ''} {h['cmdline'] or ''}".strip() for h in holders) or "unknown"
        out.append(Finding(f"port {port}", "warn", f"in use by {who}",
                           "a fixed MASTER_PORT here fails with EADDRINUSE: stop that process (kill PID) or use "
                           "torchrun --standalone / mnist_helpers.launch, which pick a free port"))
    return out


def check_interfaces() -> list[Finding]:
    names = sorted(psutil.net_if_addrs())
    out = []
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = os.environ.get(var)
        if value is None:
            continue
        wanted = [v.lstrip("^=") for v in value.split(",") if v]
        # NCCL accepts prefixes ("eth" matches eth0) and exclusions ("^docker"); gloo wants exact names.
        missing = [v for v in wanted if not (v in names or (var.startswith("NCCL") and any(n.startswith(v) for n in names)))]
        if missing and not value.startswith("^"):
            out.append(Finding(var, "error", f"{var}={value} names no interface here (have: {', '.join(names)})",
                               f"unset {var}, or set it to one of {', '.join(names)}"))
        else:
            out.append(Finding(var, "ok", f"{var}={value} matches an interface"))
    if not out:
        out.append(Finding("network interfaces", "info", f"{', '.join(names)}; GLOO_/NCCL_SOCKET_IFNAME unset "
                           "(the backends choose)"))
    return out


def check_loopback_group(timeout_s: float = 20) -> Finding:
    """Make a gloo process group of one on 127.0.0.1 and all-reduce: proves the backend and loopback work."""
    if not dist.is_available():
        return Finding("gloo self-test", "error", "torch.distributed is not available in this build",
                       "install a torch build with distributed support")
    if dist.is_initialized():
        return Finding("gloo self-test", "info", "skipped: a process group exists already in this process")
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=timeout_s))
        t = torch.ones(3)
        dist.all_reduce(t)
        dist.destroy_process_group()
        return Finding("gloo self-test", "ok", "process group of one on 127.0.0.1: all_reduce works")
    except Exception as e:  # noqa: BLE001 - reported as the finding
        msg = str(e).strip().splitlines()[-1][:200]
        return Finding("gloo self-test", "error", f"{type(e).__name__}: {msg}",
                       "read it with TORCH_CPP_LOG_LEVEL=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL; check "
                       "GLOO_SOCKET_IFNAME and that 127.0.0.1 is reachable")


def shm_need_bytes(num_workers: int, batch_size: int, sample_bytes: int = MNIST_SAMPLE_BYTES,
                   prefetch_factor: int = 2, nproc: int = 1) -> int:
    """Shared memory DataLoader workers hold at once: processes x workers x prefetched batches x batch bytes."""
    if num_workers < 0 or batch_size < 1 or nproc < 1:
        raise ValueError("num_workers must be >= 0, batch_size and nproc >= 1")
    return nproc * num_workers * prefetch_factor * batch_size * sample_bytes


def check_shm(num_workers: int = 4, batch_size: int = 128, nproc: int = 1, prefetch_factor: int = 2,
              sample_bytes: int = MNIST_SAMPLE_BYTES, path: str = "/dev/shm") -> Finding:
    """``df /dev/shm`` against what the loader workers would put there (batches travel through it)."""
    if not os.path.isdir(path):
        return Finding("shared memory", "info", f"{path} does not exist (not Linux?): workers use the OS's own")
    usage = shutil.disk_usage(path)
    need = shm_need_bytes(num_workers, batch_size, sample_bytes, prefetch_factor, nproc)
    msg = (f"{path}: {usage.free / MiB:,.0f} MiB free of {usage.total / MiB:,.0f} MiB; {nproc} process(es) x "
           f"{num_workers} workers x {prefetch_factor} batches x {batch_size * sample_bytes / MiB:.2f} MiB = "
           f"{need / MiB:,.1f} MiB in flight")
    fix = ("too small: workers die with 'bus error' / 'DataLoader worker (pid N) is killed by signal: Bus error'. "
           "docker run --shm-size=2g (or --ipc=host), fewer workers or smaller batches, or num_workers=0")
    if need > usage.free:
        return Finding("shared memory", "error", msg, fix)
    if usage.total < 512 * MiB or need > usage.free / 4:
        return Finding("shared memory", "warn", msg + " (little headroom: bigger images or batches will not fit)", fix)
    return Finding("shared memory", "ok", msg)


def check_gpus() -> list[Finding]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    out = []
    n = gpu_count()  # through NVML: torch.cuda.is_available() would start the CUDA driver (and poison fork)
    if n == 0:
        why = ("CUDA_VISIBLE_DEVICES is empty: GPUs hidden on purpose" if visible == "" else
               f"this torch build has no CUDA (torch.version.cuda={torch.version.cuda})" if torch.version.cuda is None
               else "no usable CUDA device or driver")
        out.append(Finding("GPUs", "info", f"none: {why}; runs use the CPU and gloo",
                           "" if visible == "" else "on a GPU machine: check nvidia-smi and the driver"))
    else:  # naming them starts the driver: only where there are GPUs
        try:
            names = ", ".join(torch.cuda.get_device_name(i) for i in range(n))
            out.append(Finding("GPUs", "ok", f"{n} visible ({names}); CUDA_VISIBLE_DEVICES={visible!r}"))
        except RuntimeError as e:  # NVML counts GPUs that CUDA cannot use (a driver too old for this torch, ...)
            out.append(Finding("GPUs", "error", f"{n} seen by NVML, but CUDA fails: {str(e).splitlines()[0][:200]}",
                               f"check the driver: nvidia-smi's 'CUDA Version' must be at least {torch.version.cuda}"))
    gloo = dist.is_available() and dist.is_gloo_available()
    out.append(Finding("gloo", "ok" if gloo else "error", "available" if gloo else "missing",
                       "" if gloo else "install an official torch build"))
    nccl = dist.is_available() and dist.is_nccl_available()
    if n:
        out.append(Finding("nccl", "ok" if nccl else "error",
                           f"available (version {'.'.join(map(str, torch.cuda.nccl.version()))})" if nccl else "missing",
                           "" if nccl else "install a CUDA build of torch; meanwhile use backend='gloo'"))
    else:
        out.append(Finding("nccl", "info", f"{'in this build' if nccl else 'not in this build'}; unused without GPUs"))
    return out


def check_threads(nproc: int = 1) -> Finding:
    """Threads per process x processes against the usable cores.

    With ``OMP_NUM_THREADS`` unset, torchrun gives each of several processes 1 thread (and says so)
    and ``mnist_helpers.launch`` gives each cores // processes; a plain process uses every core.
    """
    cores = usable_cores()
    omp = os.environ.get("OMP_NUM_THREADS")
    fix = f"OMP_NUM_THREADS={max(1, cores // nproc)} (cores // processes); mnist_helpers.launch sets it for you"
    if not (omp and omp.isdigit()):
        if nproc == 1:
            return Finding("threads", "ok", f"OMP_NUM_THREADS unset: torch uses {torch.get_num_threads()} thread(s) "
                           f"on {cores} usable core(s)")
        return Finding("threads", "info", f"OMP_NUM_THREADS unset: with {nproc} processes torchrun gives each 1 "
                       f"thread ({nproc} on {cores} usable cores); mnist_helpers.launch gives each "
                       f"{max(1, cores // nproc)}", "" if nproc >= cores else fix)
    total = int(omp) * nproc
    msg = f"OMP_NUM_THREADS={omp} x {nproc} process(es) = {total} threads on {cores} usable core(s)"
    if total > cores:
        return Finding("threads", "warn", msg + ": oversubscribed, processes will slow each other down", fix)
    if total < cores:
        return Finding("threads", "info", msg + ": some cores idle", fix)
    return Finding("threads", "ok", msg)


def check_data(root=None) -> Finding:
    try:
        rdir = verify_mnist(root)
    except DataError as e:
        lines = str(e).splitlines()
        return Finding("MNIST data", "error", "; ".join(ln.strip() for ln in lines[:-1])[:300], lines[-1])
    return Finding("MNIST data", "ok", f"{rdir}: four files, md5 verified")


def run_checks(nproc: int = 1, num_workers: int = 4, batch_size: int = 128, data_root=None,
               self_test: bool = True) -> list[Finding]:
    """Every check, in order; each returns findings rather than raising."""
    findings = [*check_ports(), *check_interfaces()]
    if self_test:
        findings.append(check_loopback_group())
    findings += [check_shm(num_workers, batch_size, nproc), *check_gpus(), check_threads(nproc), check_data(data_root)]
    return findings


def report(findings: list[Finding]) -> str:
    """One line per finding (``[WARN] check: message``), its fix on the next line for warnings and errors."""
    lines = []
    for f in findings:
        lines.append(f"[{f.level.upper()}] {f.check}: {f.message}")
        if f.fix and f.level in ("warn", "error"):
            lines.append(f"    fix: {f.fix}")
    errors = sum(f.level == "error" for f in findings)
    warns = sum(f.level == "warn" for f in findings)
    lines.append(f"{len(findings)} checks: {errors} error(s), {warns} warning(s)")
    return "\n".join(lines)


@cli_entry  # expected errors: one message with the fix, exit code 2
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnist_helpers.course.doctor", description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=1, help="processes per node you plan to launch")
    ap.add_argument("--num-workers", type=int, default=4, help="DataLoader workers per process you plan to use")
    ap.add_argument("--batch-size", type=int, default=128, help="per process")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--no-self-test", action="store_true", help="skip the gloo process group of one")
    ap.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = ap.parse_args(argv)
    if args.nproc < 1 or args.num_workers < 0 or args.batch_size < 1:
        ap.error("--nproc and --batch-size must be >= 1, --num-workers >= 0")
    findings = run_checks(args.nproc, args.num_workers, args.batch_size, args.data_root, not args.no_self_test)
    print(json.dumps([asdict(f) for f in findings], indent=1) if args.json else report(findings))
    return 1 if any(f.level == "error" for f in findings) else 0


if __name__ == "__main__":
    sys.exit(main())
