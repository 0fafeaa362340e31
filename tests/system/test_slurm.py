"""scripts/slurm/train.sbatch under a real Slurm: a one-node cluster started here (scripts/slurm/local_cluster.sh).

As root with apt-get (CI), the fixture installs Debian's slurmctld, slurmd, slurm-client and munge when missing,
starts munged, slurmctld and slurmd with their state in a temp dir, and stops them at the end. Elsewhere (not root,
no apt-get, apt fails) the tests skip with the reason. Two jobs: the series' batch script with 2 torchrun workers
(world size 2, gloo) to completion, and one stopped with SIGUSR1 (what Slurm sends before the time limit): the
workers snapshot the step they stop at, and a resubmission resumes from it.

MNIST_SLURM_REFERENCE=results/reference/slurm_local_LABEL_DATE.json additionally writes what the jobs did
(machine, Slurm version, commands, states, results) for notebook 07 to show on machines without Slurm.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from mnist_helpers.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "scripts" / "slurm" / "local_cluster.sh"
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
QUICK = ["--model", "fastnet", "--subset", "256", "--batch-size", "64", "--test-subset", "500"]
pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]
REFERENCE: dict = {}


def _cluster(*args, timeout=120):
    return subprocess.run(["bash", str(CLUSTER), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def slurm(mnist_root):
    """Environment for sbatch/squeue/scontrol of a one-node Slurm on this machine, stopped after the module."""
    if not shutil.which("bash"):
        pytest.skip("bash is needed for scripts/slurm/local_cluster.sh")
    t0 = time.perf_counter()
    r = _cluster("install", timeout=240)  # apt-get update and install from Debian's mirror: under a minute
    if r.returncode == 3:
        pytest.skip(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0, r.stdout + r.stderr
    REFERENCE["install_s"] = round(time.perf_counter() - t0, 1)
    state = Path(tempfile.mkdtemp(prefix="slurm-"))  # short: the munge socket path must fit 108 bytes
    try:
        t0 = time.perf_counter()
        r = _cluster("start", str(state), timeout=120)
        if r.returncode == 3:
            pytest.skip(r.stdout.strip().splitlines()[-1])
        assert r.returncode == 0, r.stdout + r.stderr
        REFERENCE["start_s"] = round(time.perf_counter() - t0, 1)
        conf = str(state / "slurm.conf")
        REFERENCE["slurm"] = subprocess.run(["sinfo", "--version"], env={**os.environ, "SLURM_CONF": conf},
                                            capture_output=True, text=True, timeout=30).stdout.strip()
        REFERENCE["paths"] = {str(REPO) + "/": ""}
        pids = {name: int((state / f"{name}.pid").read_text()) for name in ("munged", "slurmctld", "slurmd")}
        venv_bin = str(Path(sys.executable).parent)  # torchrun and the package, for the jobs
        env = {**os.environ, "SLURM_CONF": conf, "PATH": f"{venv_bin}:{os.environ['PATH']}",
               "MNIST_DATA_ROOT": str(mnist_root), "OMP_NUM_THREADS": "1"}
        yield env
    finally:
        r = _cluster("stop", str(state), timeout=120)
        left = [n for n, p in locals().get("pids", {}).items() if Path(f"/proc/{p}").exists()
                and "Z" not in Path(f"/proc/{p}/stat").read_text().split(")")[-1][:3]]
        shutil.rmtree(state, ignore_errors=True)
        assert r.returncode == 0 and not left, f"stop left {left} running: {r.stdout}{r.stderr}"
        out = os.environ.get("MNIST_SLURM_REFERENCE")
        if out and "resume" in REFERENCE:
            from mnist_helpers.io import write_json
            from mnist_helpers.resources import machine_info
            paths = REFERENCE.pop("paths")
            text = json.dumps(REFERENCE)
            for path, name in paths.items():  # the repo and the test's temp dirs: not the reader's
                text = text.replace(path, name)
            write_json(REPO / out, {"what": "tests/system/test_slurm.py: scripts/slurm/train.sbatch on a one-node Slurm "
                                            "started by scripts/slurm/local_cluster.sh",
                                    "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
                                    "machine": machine_info(), **json.loads(text)})


def submit(env, tmp_path, worker_args, *, nproc=2, snapshot=None, snapshot_every=100, minutes=3, stop_check_every=10):
    """sbatch the series' script, its #SBATCH directives overridden for one node; returns (job id, command)."""
    cpus = len(os.sched_getaffinity(0))
    cmd = ["sbatch", "--parsable", "--nodes=1", f"--cpus-per-task={cpus}", f"--time={minutes}",
           f"--output={tmp_path}/%x-%j.out", str(SBATCH), *worker_args]
    job_env = {**env, "NPROC_PER_NODE": str(nproc), "RDZV_PORT": str(free_port()),
               "SNAPSHOT": str(snapshot or tmp_path / "snap.pt"), "SNAPSHOT_EVERY": str(snapshot_every),
               "STOP_CHECK_EVERY": str(stop_check_every)}
    r = subprocess.run(cmd, env=job_env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0], cmd


def job_info(env, job_id) -> dict:
    """`scontrol show job -o` as a dict (the record stays MinJobAge=600 s after the end: no accounting here)."""
    r = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)


def wait_job(env, job_id, timeout=150, until=None) -> dict:
    """Poll until the job has ended (or until(info) is true); returns its last scontrol record."""
    t_end = time.monotonic() + timeout
    while True:
        info = job_info(env, job_id)
        if info["JobState"] not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING") or (until and until(info)):
            return info
        if time.monotonic() > t_end:
            subprocess.run(["scancel", job_id], env=env)
            pytest.fail(f"job {job_id} still {info['JobState']} after {timeout} s")
        time.sleep(0.25)


def job_processes(marker: str) -> list[str]:
    """Command lines of processes that mention `marker` (this job's snapshot path): none may outlive the job."""
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmd:
            found.append(f"{p.name}: {cmd}")
    return found


def test_sbatch_runs_two_workers_to_completion(slurm, tmp_path):
    out = tmp_path / "result.json"
    t0 = time.perf_counter()
    job_id, cmd = submit(slurm, tmp_path, [*QUICK, "--out", str(out)])
    info = wait_job(slurm, job_id)
    log = Path(info["StdOut"]).read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log[-3000:]
    node = socket.gethostname().split(".")[0]  # the one node; `scontrol show hostnames` found it
    assert f"job {job_id}: 1 nodes x 2 processes, rendezvous at {node}:" in log
    # no GPU allocated (gloo), and the srun step told the job's CPUs per task (srun >= 22.05 does not inherit it)
    assert f"(0 GPUs and {len(os.sched_getaffinity(0))} CPUs per node)" in log
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["backend"] == "gloo" and result["final_test_acc"] is not None
    assert result["steps"] == 2  # 256 images, 2 processes x 64 per step
    REFERENCE["paths"][str(tmp_path)] = "OUT"
    REFERENCE["job"] = {"command": " ".join(["NPROC_PER_NODE=2", *cmd[:-len(QUICK) - 2], *QUICK]),
                        "job_state": info["JobState"], "exit_code": info["ExitCode"], "run_time": info["RunTime"],
                        "node": info["NodeList"], "wall_s": round(time.perf_counter() - t0, 1),
                        "output": log.strip().splitlines()[:6],
                        "result": {k: result[k] for k in ("world_size", "backend", "steps", "final_test_acc")}}


def test_usr1_stops_the_job_and_a_resubmission_resumes(slurm, tmp_path):
    """SIGUSR1 to the batch shell (as --signal=B:USR1@120 sends before the time limit) creates the stop file: the
    workers stop together at a step, rank 0 snapshots that very step (not a periodic one: those fall every 7 steps,
    checks every 5), the script prints the resume command; resubmitted with that SNAPSHOT, training continues
    from the step it stopped at."""
    snapshot = tmp_path / "snap.pt"
    long_run = ["--model", "fastnet", "--subset", "12800", "--batch-size", "64", "--test-subset", "100",
                "--epochs", "20"]  # 100 steps per epoch, 2000 in all: far more than we wait for
    job_id, _ = submit(slurm, tmp_path, long_run, snapshot=snapshot, snapshot_every=7, stop_check_every=5)
    info = wait_job(slurm, job_id, until=lambda i: snapshot.exists())
    assert info["JobState"] == "RUNNING" and snapshot.exists(), f"no snapshot while running: {info['JobState']}"
    squeue = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i %T %D %C"], env=slurm, capture_output=True,
                            text=True, timeout=30).stdout.split()
    assert squeue == [job_id, "RUNNING", "1", str(len(os.sched_getaffinity(0)))]
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], env=slurm, check=True, timeout=30)
    info = wait_job(slurm, job_id)
    log = Path(info["StdOut"]).read_text()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "138:0", log[-3000:]  # 128 + SIGUSR1
    assert f"job {job_id}: SIGUSR1: asking the workers to snapshot and stop" in log, log[-3000:]
    assert "not stopped within" not in log and f"SNAPSHOT={snapshot} sbatch" in log, log[-3000:]
    assert not job_processes(str(snapshot)), "torchrun or a worker outlived the job"
    assert not Path(f"{snapshot}.stop").exists(), "the stop file would stop the resubmission"

    import torch
    snap = torch.load(snapshot, weights_only=True)
    step = snap["steps"]
    assert 5 <= step < 2000 and step % 5 == 0, step  # the stop's own snapshot, at a check
    assert f"[rank 0] stop requested ({snapshot}.stop exists): snapshot of step {step} written" in log, log[-3000:]
    out = tmp_path / "resumed.json"
    job2, _ = submit(slurm, tmp_path, [*long_run, "--max-steps", str(step + 4), "--out", str(out)],
                     snapshot=snapshot, snapshot_every=7, stop_check_every=5)
    info2 = wait_job(slurm, job2)
    log2 = Path(info2["StdOut"]).read_text()
    assert info2["JobState"] == "COMPLETED" and info2["ExitCode"] == "0:0", log2[-3000:]
    result = json.loads(out.read_text())
    assert result["resumed_at_step"] == step and result["steps"] == step + 4 and result["world_size"] == 2
    assert f"resumed from {snapshot}" in log2
    REFERENCE["paths"][str(tmp_path)] = "OUT"
    REFERENCE["stop"] = {"squeue": " ".join(squeue), "signal": f"scancel --batch --signal=USR1 {job_id}",
                         "job_state": info["JobState"],
                         "exit_code": info["ExitCode"], "snapshot_step": step,
                         "output": [line for line in log.strip().splitlines()
                                    if "job " in line or "SNAPSHOT=" in line or "stop requested" in line]}
    REFERENCE["resume"] = {"job_state": info2["JobState"], "exit_code": info2["ExitCode"],
                           "resumed_at_step": result["resumed_at_step"], "steps": result["steps"],
                           "final_test_acc": result["final_test_acc"]}
