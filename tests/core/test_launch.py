"""Tests for mnist_helpers.launch: real torchrun processes, gloo on CPU, free ports, short timeouts."""
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from mnist_helpers.launch import (LaunchError, LaunchOptions, build_command, check_devices, find_root_cause,
                                  finished_then_aborted, torchrun)
from mnist_helpers.ports import free_port

WORKERS = Path(__file__).resolve().parents[1] / "launch_workers"
pytestmark = pytest.mark.timeout(120)


def run_workers(name, args=(), **kwargs):
    """torchrun() on a test worker, 2 processes, no MNIST needed."""
    kwargs.setdefault("nproc", 2)
    kwargs.setdefault("timeout", 60)
    return torchrun(str(WORKERS / name), args, provision=False, **kwargs)


def wait_for_pids(pid_dir: Path, n: int, timeout: float = 30) -> list[int]:
    """The pids the sleep workers wrote, once all n are there."""
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(pid_dir.glob("*.pid"))
        if len(files) == n:
            return [int(f.read_text()) for f in files]
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    raise AssertionError(f"workers did not start within {timeout} s: {os.listdir(pid_dir)}")


def mentioning(marker: str) -> list[psutil.Process]:
    """The live (not zombie) processes whose command line mentions ``marker``."""
    return [p for p in psutil.process_iter(["cmdline", "status"])
            if p.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or [])]


def assert_all_gone(pids, marker: str, timeout: float = 10):
    """No worker pid is alive (zombies count as gone) and no process mentions ``marker``."""
    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def leftovers():
        return [p.pid for p in mentioning(marker)]

    deadline = time.monotonic() + timeout  # orphans may take a moment to be reaped
    while time.monotonic() < deadline and (any(map(alive, pids)) or leftovers()):
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)], "a worker survived"
    assert not leftovers(), "torchrun or a worker survived"


def test_build_command_shapes(tmp_path):
    single = build_command("mnist_helpers.workers.progression.ddp_train", ["--num_epochs", 1], nproc=2)
    assert single[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in single and "--rdzv-endpoint" not in " ".join(single)
    assert single[single.index("--nproc-per-node") + 1] == "2"
    assert single[-4:] == ["-m", "mnist_helpers.workers.progression.ddp_train", "--num_epochs", "1"]

    script = tmp_path / "train.py"
    multi = build_command(str(script), nproc=4, nnodes=2, node_rank=1, rdzv_endpoint="node0:29400",
                          rdzv_id="job7", local_addr="10.0.0.2", max_restarts=3)
    assert "--standalone" not in multi
    for flag in ["--rdzv-backend=c10d", "--rdzv-endpoint=node0:29400", "--rdzv-id=job7"]:
        assert flag in multi
    for flag, value in [("--nnodes", "2"), ("--node-rank", "1"), ("--local-addr", "10.0.0.2"),
                        ("--max-restarts", "3"), ("--nproc-per-node", "4")]:
        assert multi[multi.index(flag) + 1] == value
    assert multi[-1] == str(script) and "-m" not in multi[3:]  # a script path, not a module
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        build_command("m", nnodes=2)


@pytest.mark.process  # starts torchrun and 2 workers
def test_two_processes_return_results_with_rank_prefixes(capsys):
    result = run_workers("ok_worker.py")
    assert result["world_size"] == 2
    assert result["value"] == 3.0  # all_reduce(sum) of rank + 1 over ranks 0 and 1
    lines = capsys.readouterr().out.splitlines()
    command = shlex.split(lines[0][2:])
    assert lines[0].startswith("$ OMP_NUM_THREADS=1 ") and "torch.distributed.run" in command
    for rank in (0, 1):
        assert f"[rank {rank}] all_reduce -> 3" in lines  # the worker's own prefix, not doubled
        assert f"[rank {rank}] plain line from rank {rank}" in lines  # prefixed by torchrun
    assert all(re.match(r"\[(rank \d+|torchrun)\] ", line) for line in lines[1:] if line)


@pytest.mark.process  # starts torchrun and 2 workers
def test_failing_rank_raises_with_root_cause():
    with pytest.raises(LaunchError) as info:
        run_workers("fail_worker.py")
    err = info.value
    assert err.rank == 1
    assert "boom on rank 1" in str(err) and "rank 1" in str(err)
    assert err.root_cause.startswith("ValueError: boom on rank 1")
    assert "ChildFailedError" not in str(err)
    assert "fail_worker.py" in err.root_cause and err.returncode != 0
    assert "[rank 1] ValueError: boom on rank 1" in err.output


@pytest.mark.process  # starts torchrun and 2 workers
def test_timeout_stops_every_process(tmp_path):
    start = time.monotonic()
    # 10 s leaves a loaded machine time to start the workers (they write pids within ~3 s).
    with pytest.raises(LaunchError, match="timed out after 10 s") as info:
        run_workers("sleep_worker.py", ["--pid-dir", tmp_path], timeout=10)
    assert time.monotonic() - start < 40  # clean-up is seconds, not torchrun's 30 s default
    assert "[rank 1] heartbeat" in info.value.output
    assert_all_gone(wait_for_pids(tmp_path, 2, timeout=0), str(tmp_path))


@pytest.mark.process  # starts torchrun and 2 workers
@pytest.mark.parametrize("target", ["kernel_group", "kernel_only"])
def test_keyboard_interrupt_stops_every_process(tmp_path, target):
    """Jupyter's interrupt sends SIGINT to the kernel's process group (torchrun gets it too);
    kernel_only checks the launcher cleans up even when torchrun never saw the signal."""
    child = subprocess.Popen([sys.executable, str(WORKERS / "interrupt_launcher.py"), str(tmp_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)  # a group of its own, like a Jupyter kernel
    try:
        pids = wait_for_pids(tmp_path, 2)
        if target == "kernel_group":
            os.killpg(child.pid, signal.SIGINT)
        else:
            child.send_signal(signal.SIGINT)
        output, _ = child.communicate(timeout=90)  # ~5 s when idle; generous for a loaded CI machine
    finally:
        child.kill()
    assert child.returncode != 0 and "KeyboardInterrupt" in output
    assert_all_gone(pids, str(tmp_path))


@pytest.mark.process  # starts torchrun and 2 workers
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper needs Linux's prctl")
@pytest.mark.parametrize("target", ["kernel_group", "kernel_only", "torchrun"])
def test_sigkill_leaves_no_orphan(tmp_path, target):
    """SIGKILL, which no handler sees: of the kernel's whole process group (Jupyter's restart, a notebook
    timeout), of the kernel alone, or of torchrun (whose workers run in sessions of their own). The reaper
    between the launcher and torchrun (mnist_helpers/reaper.py) stops every worker all the same, and the
    launcher's temporary folder (torchrun's logs) does not stay behind either."""
    tmp_root = tmp_path / "tmp"
    tmp_root.mkdir()
    child = subprocess.Popen([sys.executable, str(WORKERS / "interrupt_launcher.py"), str(tmp_path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                             env={**os.environ, "TMPDIR": str(tmp_root)})
    try:
        pids = wait_for_pids(tmp_path, 2)
        assert list(tmp_root.glob("mnist_launch_*")), "the launcher made its temporary folder elsewhere"
        if target == "kernel_group":
            os.killpg(child.pid, signal.SIGKILL)
        elif target == "kernel_only":
            child.kill()
        else:
            agent = next(p for p in psutil.Process(child.pid).children(recursive=True)
                         if "torch.distributed.run" in " ".join(p.cmdline()) and "reaper" not in " ".join(p.cmdline()))
            agent.kill()
        assert_all_gone(pids, str(tmp_path), timeout=30)  # ~1 s when idle (a stop grace of 10 s at most)
        deadline = time.monotonic() + 10
        while list(tmp_root.glob("mnist_launch_*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not list(tmp_root.glob("mnist_launch_*")), "the launcher's temporary folder was left behind"
    finally:
        child.kill()
        child.wait()
        for p in mentioning(str(tmp_path)):  # a failed run leaves nothing behind either
            p.kill()


@pytest.mark.process  # starts torchrun and 2 workers
def test_busy_master_port_does_not_matter():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port()))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_workers("ok_worker.py", env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert result["world_size"] == 2 and result["master_port"] != port


@pytest.mark.process  # starts torchrun and 2 workers
def test_cuda_request_without_gpus_gives_a_runnable_command(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "results.json"
    with pytest.raises(ValueError, match="no usable CUDA device") as info:
        run_workers("ok_worker.py", device="cuda", options=LaunchOptions(out=out))
    suggested = [ln.strip() for ln in str(info.value).splitlines() if "torch.distributed.run" in ln]
    assert len(suggested) == 1 and "--nproc-per-node 2" in suggested[0]
    assert "mnist_launch_" not in suggested[0]  # no launcher temp paths in a pasteable command
    log_dir = {"PET_LOG_DIR": str(tmp_path / "logs")}  # torchrun's default would stay in /tmp
    done = subprocess.run(suggested[0], shell=True, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **log_dir})
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"world_size": 2' in out.read_text()


def test_device_checks_without_launching():
    def suggest(n, dev):
        return f"cmd --nproc-per-node {n} on {dev}"

    with pytest.raises(ValueError) as info:  # as on a one-GPU machine
        check_devices("cuda", 2, 1, suggest)
    assert "cmd --nproc-per-node 1 on cuda" in str(info.value)
    assert "cmd --nproc-per-node 2 on cpu" in str(info.value)
    assert check_devices("auto", 1, 1, suggest) == "cuda"
    with pytest.warns(UserWarning, match="compete for cores"):
        check_devices("cpu", (os.cpu_count() or 1) + 1, 0, suggest)
    with pytest.raises(ValueError, match="device must be"):
        check_devices("tpu", 1, 0, suggest)


ROOT_CAUSE_SECTION = """[torchrun] Root Cause (first observed failure):
[torchrun] [0]:
[torchrun]   rank      : 3 (local_rank: 1)
[torchrun]   exitcode  : {code} (pid: 4242)
[torchrun]   error_file: <N/A>
[torchrun]   traceback : {traceback}
[torchrun] =======================================================
"""


def test_root_cause_without_error_file(tmp_path):
    no_file = tmp_path / "missing.json"
    killed = ROOT_CAUSE_SECTION.format(code=-9, traceback="Signal 9 (SIGKILL) received by PID 4242")
    assert find_root_cause(killed, no_file) == (
        3, -9, "Signal 9 (SIGKILL) received by PID 4242 (often the out-of-memory killer)")
    printed = ("[rank 3] Traceback (most recent call last):\n"
               '[rank 3]   File "train.py", line 7, in <module>\n'
               "[rank 3]     step()\n"
               "[rank 3] RuntimeError: shapes do not match\n"
               "[rank 0] Traceback (most recent call last):\n"  # another rank, stopped later
               "[rank 0] KeyboardInterrupt\n")
    unrecorded = printed + ROOT_CAUSE_SECTION.format(code=1, traceback="To enable traceback see: ...")
    rank, code, cause = find_root_cause(unrecorded, no_file)
    assert (rank, code) == (3, 1)
    assert cause.splitlines()[0] == "RuntimeError: shapes do not match" and "train.py" in cause


def test_a_failure_of_rank_0_is_named_rank_0_not_torchrun(tmp_path):
    """Rank 0 is a rank like any other: its failure is reported as "rank 0 failed", and only a failure with no rank
    (torchrun itself) as "torchrun". (A test of ``rank`` for truth instead of ``is not None`` blamed torchrun.)"""
    from mnist_helpers.launch import raise_on_failure

    printed = ("[rank 0] Traceback (most recent call last):\n"
               '[rank 0]   File "train.py", line 7, in <module>\n'
               "[rank 0] RuntimeError: shapes do not match\n")
    section = ROOT_CAUSE_SECTION.format(code=1, traceback="To enable traceback see: ...").replace(
        "rank      : 3 (local_rank: 1)", "rank      : 0 (local_rank: 0)")
    for output, who, rank in ((printed + section, "rank 0", 0), ("torchrun: error: bad flag\n", "torchrun", None)):
        with pytest.raises(LaunchError) as err:
            raise_on_failure(1, ["torchrun", "w.py"], output, tmp_path / "missing.json", 60)
        assert str(err.value).startswith(f"{who} failed (exit code 1)"), str(err.value)
        assert err.value.rank == rank


def test_a_rank_aborted_after_a_peers_expected_error_names_the_peers_error(tmp_path):
    """gloo can abort a rank (SIGABRT, "terminate called ...") when its peer exits with an expected error; torchrun
    then sees the abort first. The launcher names the peer's error, and says what happened to the aborted rank."""
    output = ("[rank 0] error: the snapshot is not the same file on every rank\n"
              "[rank 0]   fix: put --snapshot on a filesystem every node shares\n"
              "[rank 3] terminate called after throwing an instance of 'gloo::IoException'\n"
              + ROOT_CAUSE_SECTION.format(code=-6, traceback="Signal 6 (SIGABRT) received by PID 4242"))
    rank, code, cause = find_root_cause(output, tmp_path / "missing.json")
    assert rank == 0 and code is None
    assert cause.startswith("error: the snapshot is not the same file on every rank\n  fix: put --snapshot")
    assert "rank 3 was then stopped by Signal 6 (SIGABRT)" in cause
    alone = ("[rank 3] terminate called after throwing an instance of 'gloo::IoException'\n"
             + ROOT_CAUSE_SECTION.format(code=-6, traceback="Signal 6 (SIGABRT) received by PID 4242"))
    rank, code, cause = find_root_cause(alone, tmp_path / "missing.json")
    assert (rank, code) == (3, -6) and "terminate called" in cause  # no peer error: the abort is the cause
    own = ("[rank 0] error: the snapshot is not the same file on every rank\n"
           "[rank 0]   fix: put --snapshot on a filesystem every node shares\n"
           "[rank 0] terminate called without an active exception\n"
           + ROOT_CAUSE_SECTION.format(code=-7, traceback="Signal 7 (SIGBUS) received by PID 4242").replace(
               "rank      : 3 (local_rank: 1)", "rank      : 0 (local_rank: 0)"))
    rank, code, cause = find_root_cause(own, tmp_path / "missing.json")  # the rank that reported then died at exit
    assert rank == 0 and cause.startswith("error: the snapshot is not the same file on every rank")
    assert "rank 0 then died at exit by Signal 7 (SIGBUS)" in cause


def test_an_abort_at_exit_after_complete_results_is_not_a_failure(tmp_path):
    """gloo (torch 2.14.1) can abort a finished worker at interpreter exit; with rank 0's results complete the
    launcher returns them (and says so). Anything else about the failure keeps it a failure."""
    results = tmp_path / "out.json"
    results.write_text('{"correct": 1754, "count": 2000}')
    section = ROOT_CAUSE_SECTION.format(code=-6, traceback="Signal 6 (SIGABRT) received by PID 4242")
    aborted = ("[rank 3] epoch 1: 11.2 s, test accuracy 87.65% (2,000 images)\n"
               "[rank 3] terminate called without an active exception\n" + section)
    assert finished_then_aborted(1, aborted, results) == ([3], {"correct": 1754, "count": 2000})
    for status in (0, "timeout"):
        assert finished_then_aborted(status, aborted, results) is None
    # as measured (two launchers at once, 2 of 40 runs): the aborted rank's stdout after its stderr line, and the
    # peer stopped by torchrun
    peer = ROOT_CAUSE_SECTION.format(code=-15, traceback="Signal 15 (SIGTERM) received by PID 4243").replace(
        "rank      : 3 (local_rank: 1)", "rank      : 2 (local_rank: 0)").replace("Root Cause (first observed "
                                                                                    "failure)", "Failures")
    interleaved = ("[rank 3] epoch 0: 0.9 s, test accuracy 71.20% (500 images)\n"
                   "[rank 3] terminate called without an active exception\n"
                   "[rank 3] epoch 1: 1.7 s, test accuracy 82.00% (500 images)\n"
                   "[torchrun] E1207 15:00:08.803000 7175 api.py:1002] failed (exitcode: -6) local_rank: 1 (pid: 1)\n"
                   + peer + section)
    assert finished_then_aborted(1, interleaved, results) == ([3], {"correct": 1754, "count": 2000})
    cases = {
        "SIGTERM alone": (peer, results),
        "a peer killed": (interleaved.replace("exitcode  : -15", "exitcode  : -9"), results),
        "a second abort of another kind": (interleaved.replace(
            "[rank 3] epoch 0", "[rank 3] terminate called after throwing an instance of 'gloo::IoException'\n"
            "[rank 3] epoch 0"), results),
        "no results": (aborted, tmp_path / "missing.json"),
        "results cut short": (aborted, tmp_path / "cut.json"),
        "another signal": (aborted.replace("exitcode  : -6", "exitcode  : -9"), results),
        "last words differ": (aborted.replace("without an active exception", "after throwing an instance of "
                                              "'gloo::IoException'"), results),
        "a traceback": ("[rank 0] Traceback (most recent call last):\n[rank 0] RuntimeError: boom\n" + aborted,
                        results),
        "an expected error": ("[rank 1] error: the snapshot is not the same file on every rank\n" + aborted, results),
        "the aborted rank said nothing": (section, results),
    }
    (tmp_path / "cut.json").write_text('{"correct": 17')
    for name, (output, path) in cases.items():
        assert finished_then_aborted(1, output, path) is None, name
