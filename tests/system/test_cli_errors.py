"""Every command fails like a good CLI: one message that names the problem and the fix, exit code 2, no
traceback, and no output file left behind (mnist_helpers.errors).

A table of bad inputs runs against the real commands (workers, ``mnist_helpers.data``, ``mnist_helpers.course.doctor``,
the scripts); nearly all of them must fail before any training. To stay fast on two cores, most cases run
in child processes forked from one interpreter that imported torch once: each runs its command as
``__main__`` with its own argv and environment, as ``python -m`` does, without 1.5 s of start-up each. The
cases marked ``fresh`` (and the launcher test) run as plain ``python -m`` / ``python scripts/...`` processes.
Corrupt data sets are made in ``tmp_path`` from the provisioned MNIST files (links to the good ones, a copy
of the one that is damaged). Outputs are pointed at paths no one can write, root included: under a regular
file, or in ``/proc``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from mnist_helpers import errors
from mnist_helpers.data import RAW_MD5
from mnist_helpers.io import check_writable, write_json
from mnist_helpers.models import build_model
from mnist_helpers.ports import hold_port
from mnist_helpers.train import TrainConfig, save_snapshot

REPO = Path(__file__).resolve().parents[2]
W = "mnist_helpers.workers.progression."
QUICK = ["--model", "fastnet", "--subset", "256", "--batch-size", "64", "--threads", "1"]
HAS_CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.timeout(300)


@dataclass
class Case:
    id: str
    cmd: list[str]            # python -m <cmd[0]> <cmd[1:]>, or a script path ending in .py
    needles: list[str]        # each must appear in the output (the problem, the value, the fix)
    code: int = 2
    env: dict = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)  # files the command was told to write: must not appear
    skip: str | None = None
    fresh: bool = False       # a plain new interpreter, not a fork of the runner


def _corrupt_roots(base: Path, good: Path) -> dict[str, Path]:
    """Data roots in ``base``: one image file truncated, one label flipped, files missing; the rest linked."""
    roots = {}
    for name, damaged in (("truncated", "t10k-images-idx3-ubyte"), ("flipped", "train-labels-idx1-ubyte"),
                          ("partial", None)):
        raw = base / name / "MNIST" / "raw"
        raw.mkdir(parents=True)
        for f in RAW_MD5:
            src = good / "MNIST" / "raw" / f
            if f == damaged:
                blob = bytearray(src.read_bytes())
                if name == "truncated":
                    blob = blob[:len(blob) // 2]
                else:
                    blob[8 + 17] = (blob[8 + 17] + 1) % 10  # label 17: another digit, same size
                (raw / f).write_bytes(bytes(blob))
            elif name != "partial" or f.startswith("train"):
                (raw / f).symlink_to(src)
        roots[name] = base / name
    return roots


def _snapshots(base: Path) -> dict[str, Path]:
    """A snapshot of this series (fastnet, batch 64, 1 process), one from 2 processes, and foreign files."""
    cfg = TrainConfig(model="fastnet", subset=256, batch_size=64)
    model = build_model("fastnet")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    snap = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": None, "scaler": None,
            "epoch": 1, "steps": 4, "history": "[]", "rng": {"torch": torch.get_rng_state()}}
    out = {"ours": base / "ours.pt", "two_procs": base / "two.pt", "garbage": base / "garbage.pt",
           "foreign": base / "foreign.pt", "plain_dict": base / "plain.pt", "folder": base / "snapdir"}
    save_snapshot(snap, out["ours"], cfg, world_size=1)
    save_snapshot(snap, out["two_procs"], cfg, world_size=2)
    out["garbage"].write_bytes(b"not a torch file\n" * 10)
    torch.save(argparse.Namespace(lr=1.0), out["foreign"])  # a pickle weights_only refuses (torch says: weights_only=False)
    torch.save({"model": model.state_dict()}, out["plain_dict"])  # a checkpoint, but not one of ours
    out["folder"].mkdir()
    return out


def _cases(tmp: Path, good: Path, port: int = 0) -> list[Case]:
    """Every case of the table, group by group (``_CASE_GROUPS``), with the files they point at."""
    roots = _corrupt_roots(tmp / "data", good)
    snaps = _snapshots(tmp / "snaps")
    a_file = tmp / "a_file.txt"
    a_file.write_text("a regular file\n")
    out = str(tmp / "out" / "{}.json")  # a fresh, writable results path per case: it must stay absent
    return [*_flag_cases(tmp), *_machine_cases(out), *_data_cases(tmp, roots, a_file, out),
            *_output_cases(tmp, a_file, out), *_snapshot_cases(snaps, out), *_port_and_debug_cases(tmp, a_file, port)]


def _flag_cases(tmp: Path) -> list[Case]:
    """Flags out of range, wrong types, unknown choices."""
    return [
        Case("epochs_zero", [W + "ddp_train", "--epochs", "0", *QUICK], ["num_epochs must be a positive integer, got 0"]),
        Case("batch_not_int", [W + "ddp_train", "--batch-size", "lots"], ["--batch-size", "invalid int value: 'lots'"]),
        Case("lr_negative", [W + "ddp_train", "--lr", "-1", *QUICK], ["lr must be a positive finite number, got -1.0"]),
        Case("unknown_model", [W + "ddp_train", "--model", "resnet50"], ["model must be one of", "'resnet50'"]),
        Case("unknown_amp", [W + "ddp_train", "--amp", "fp8", *QUICK], ["amp must be one of none, bf16, fp16", "'fp8'"]),
        Case("grad_accum_uneven", [W + "ft_train", *QUICK, "--grad-accum", "3"],
             ["batch_size (64) must be divisible by grad_accum (3)"]),
        Case("subset_too_big", [W + "ddp_train", "--model", "fastnet", "--subset", "70000"],
             ["subset must be at most 60000", "70000"]),
        Case("unknown_flag", [W + "ddp_train", "--num_epochs", "1"], ["unrecognized arguments: --num_epochs"]),
        Case("spawn_zero_procs", [W + "ddp_train", "--spawn", "0", *QUICK], ["--spawn must be a positive number of processes, got 0"]),
        Case("ft_snapshot_every_negative", [W + "ft_train", "--snapshot-every", "-1", *QUICK], ["--snapshot-every must be >= 0"]),
        Case("ft_die_without_snapshot", [W + "ft_train", "--die-at-step", "3", *QUICK], ["--die-at-step needs --snapshot"]),
        Case("ft_stop_file_without_snapshot", [W + "ft_train", "--stop-file", str(tmp / "stop"), *QUICK],
             ["--stop-file needs --snapshot"]),
        Case("ft_stop_check_every_zero", [W + "ft_train", "--stop-check-every", "0", *QUICK],
             ["--stop-check-every must be >= 1"]),
        Case("doctor_zero_procs", ["mnist_helpers.course.doctor", "--nproc", "0"], ["--nproc and --batch-size must be >= 1"]),
    ]


def _machine_cases(out: str) -> list[Case]:
    """This machine lacks what was asked for."""
    no_gpu = "this machine has a GPU" if HAS_CUDA else None
    return [
        Case("cuda_without_gpu", [W + "ddp_train", "--device", "cuda", *QUICK], ["device 'cuda' was asked for", "not available here", "--device cpu"],
             skip=no_gpu),
        Case("ft_cuda_without_gpu", [W + "ft_train", "--device", "cuda", *QUICK],
             ["device 'cuda' was asked for", "not available here", "--device cpu"], skip=no_gpu),
        Case("nccl_without_gpu", [W + "ddp_train", "--backend", "nccl", *QUICK],
             ["--backend nccl needs one CUDA GPU per process", "--backend gloo"], skip=no_gpu),
        Case("bench_amp_allocator_without_gpu", [str(REPO / "scripts" / "bench_amp.py"), "--allocator", "--quick",
                                                 "--out", out.format("amp")],
             ["--allocator", "no CUDA device", "run without --allocator"], outputs=[out.format("amp")], skip=no_gpu),
    ]


def _data_cases(tmp: Path, roots: dict[str, Path], a_file: Path, out: str) -> list[Case]:
    """Data: missing, corrupt, a file instead of a folder."""
    return [
        Case("data_missing", [W + "ddp_train", "--data-root", str(tmp / "nowhere"), *QUICK, "--out", out.format("dm")],
             ["train-images-idx3-ubyte is missing", "fix: run `make data`"], outputs=[out.format("dm")], fresh=True),
        Case("data_partial", [W + "ddp_train", "--data-root", str(roots["partial"]), *QUICK],
             ["t10k-images-idx3-ubyte is missing", "t10k-labels-idx1-ubyte is missing", "make data"]),
        Case("data_truncated", [W + "ddp_train", "--data-root", str(roots["truncated"]), *QUICK],
             ["t10k-images-idx3-ubyte is truncated", "expected 7,840,016", "make data"]),
        Case("data_flipped_label", [W + "ft_train", "--data-root", str(roots["flipped"]), *QUICK],
             ["train-labels-idx1-ubyte is corrupt: md5", "make data"]),
        Case("data_root_is_file", [W + "ddp_train", "--data-root", str(a_file), *QUICK],
             [f"the data root {a_file} is a file, not a folder"]),
        Case("dataloader_route_flipped", [W + "ddp_train", "--loader", "dataloader", "--data-root", str(roots["flipped"]), *QUICK],
             ["train-labels-idx1-ubyte is corrupt"]),
        Case("data_cli_root_uncreatable", ["mnist_helpers.data", "--root", str(a_file / "sub"), "--offline"],
             ["cannot create the data folder", "python -m mnist_helpers.data --root data"], fresh=True),
        Case("data_cli_check_corrupt", ["mnist_helpers.data", "--root", str(roots["flipped"]), "--check"],
             ["is corrupt: md5", "make data"], code=1),  # --check answers like the doctor: 1 = files not valid
    ]


def _output_cases(tmp: Path, a_file: Path, out: str) -> list[Case]:
    """Output paths that cannot be written: checked before training."""
    return [
        Case("out_under_a_file", [W + "ddp_train", *QUICK, "--out", str(a_file / "sub" / "out.json")],
             ["--out", "cannot be created", f"{a_file} is a file, not a folder"], outputs=[str(a_file / "sub" / "out.json")], fresh=True),
        Case("out_in_proc", [W + "ddp_train", *QUICK, "--out", "/proc/mnist_out.json"], ["--out /proc/mnist_out.json cannot be written"]),
        Case("out_is_a_folder", [W + "ft_train", *QUICK, "--out", str(tmp)], ["is a folder; it must name a file"]),
        Case("snapshot_under_a_file", [W + "ft_train", *QUICK, "--snapshot", str(a_file / "ft.pt"), "--out", out.format("su")],
             ["--snapshot", f"{a_file} is a file, not a folder"], outputs=[out.format("su"), str(a_file / "ft.pt")]),
        Case("bench_scaling_out_in_proc", [str(REPO / "scripts" / "bench_scaling.py"), "--quick", "--out", "/proc/scaling.json"],
             ["--out /proc/scaling.json cannot be written"]),
        Case("bench_speedrun_out_under_a_file", [str(REPO / "scripts" / "bench_speedrun.py"), "--quick",
                                            "--out", str(a_file / "speedrun.json")], ["--out", "is a file, not a folder"], fresh=True),
        Case("bench_allreduce_world_sizes", [str(REPO / "scripts" / "bench_allreduce.py"), "--world-sizes", "2,four"],
             ["--world-sizes must be comma-separated integers", "'2,four'"]),
        Case("bench_loader_subset", [str(REPO / "scripts" / "bench_loader.py"), "--subset", "0"],
             ["--subset must be between 1 and 60000"]),
    ]


def _snapshot_cases(snaps: dict[str, Path], out: str) -> list[Case]:
    """Snapshots that do not belong to this run."""
    return [
        Case("snapshot_garbage", [W + "ddp_train", *QUICK, "--snapshot", str(snaps["garbage"]), "--out", out.format("sg")],
             ["not a snapshot written by this series", "torch.save did not write it", f"rm {snaps['garbage']}",
              "point --snapshot at another file"],
             outputs=[out.format("sg")]),
        Case("snapshot_foreign_pickle", [W + "ddp_train", *QUICK, "--snapshot", str(snaps["foreign"])],
             ["not a snapshot written by this series", "objects other than tensors"], fresh=True),
        Case("snapshot_plain_checkpoint", [W + "ft_train", *QUICK, "--snapshot", str(snaps["plain_dict"])],
             ["not a snapshot written by this series", "no 'mnist-scale-lab snapshot' tag"]),
        Case("snapshot_other_model", [W + "ddp_train", *QUICK[2:], "--model", "net", "--snapshot", str(snaps["ours"])],
             ["other settings", "model: snapshot 'fastnet', this run 'net'", "--model fastnet"]),
        Case("snapshot_other_batch", [W + "ddp_train", *QUICK[:4], "--batch-size", "32", "--snapshot", str(snaps["ours"])],
             ["batch_size: snapshot 64, this run 32", "--batch-size 64"]),
        Case("snapshot_other_world_size", [W + "ft_train", *QUICK, "--snapshot", str(snaps["two_procs"])],
             ["processes: snapshot 2, this run 1", "2 processes"]),
    ]


def _port_and_debug_cases(tmp: Path, a_file: Path, port: int) -> list[Case]:
    """A rendezvous port someone else holds (a fixed master_port, as in the article), and --debug."""
    return [
        Case("port_in_use", [W + "ddp_train", *QUICK, "--timeout", "20"], [f"MASTER_PORT {port} on 127.0.0.1 is in use by pid",
             "torchrun --standalone"], env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
                                            "WORLD_SIZE": "1", "LOCAL_RANK": "0"}),
        # --debug shows the traceback of an expected error (the one case where "Traceback" must appear)
        Case("debug_flag", [W + "ddp_train", "--data-root", str(tmp / "nowhere"), *QUICK, "--debug"],
             ["Traceback", "DataError", "is missing"]),
        Case("debug_env", [W + "ddp_train", "--data-root", str(a_file), *QUICK], ["Traceback", "is a file"],
             env={"MNIST_DEBUG": "1"}),
    ]


# the table, in order (_case_ids reads the cases' ids from these functions' source)
_CASE_GROUPS = (_flag_cases, _machine_cases, _data_cases, _output_cases, _snapshot_cases, _port_and_debug_cases)

def _run(case: Case, env: dict) -> dict:
    """One case as a plain new process: ``python -m module args`` or ``python scripts/x.py args``."""
    target = case.cmd[0]
    argv = [sys.executable, target] if target.endswith(".py") else [sys.executable, "-m", target]
    t0 = time.monotonic()
    proc = subprocess.run(argv + case.cmd[1:], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**env, **case.env})
    return {"code": proc.returncode, "out": proc.stdout + proc.stderr, "seconds": time.monotonic() - t0}


# Imports torch once, then forks one child per case (two at a time); the child points stdout and stderr at
# a file and runs the command as __main__, ending as the interpreter would: SystemExit's code, or the
# traceback and 1. Nothing of mnist_helpers is imported beforehand (runpy would re-run a loaded module).
RUNNER = r'''
import json, os, runpy, sys, time, traceback
import numpy, psutil, torch, torch.distributed, torch.multiprocessing, torch.nn.parallel  # noqa: F401

def child(case):
    fd = os.open(case["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(case["env"])
    target, args = case["cmd"][0], case["cmd"][1:]
    sys.argv = [target] + args
    code = 0
    try:
        if target.endswith(".py"):
            sys.path.insert(0, os.path.dirname(target))
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

cases, running, done = json.loads(sys.stdin.read()), {}, {}
while cases or running:
    while cases and len(running) < 2:
        case = cases.pop(0)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            child(case)
        running[pid] = (case, time.monotonic())
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid == 0:
        for p, (case, t0) in list(running.items()):
            if time.monotonic() - t0 > 120:
                os.kill(p, 9)
        time.sleep(0.02)
        continue
    case, t0 = running.pop(pid)
    done[case["id"]] = {"code": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - t0}
print("RESULTS" + json.dumps(done))
'''


def _run_forked(cases: list[Case], env: dict, logs: Path) -> dict:
    todo = [{"id": c.id, "cmd": c.cmd, "env": c.env, "log": str(logs / f"{c.id}.log")} for c in cases]
    proc = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(todo), capture_output=True, text=True,
                          timeout=600, cwd=REPO, env=env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS")]
    assert line, f"the runner failed:\n{proc.stderr[-3000:]}"
    results = json.loads(line[-1][len("RESULTS"):])
    for c in cases:
        results[c.id]["out"] = (logs / f"{c.id}.log").read_text()
    return results


@pytest.fixture(scope="module")
def table(tmp_path_factory, mnist_root):
    """Every case's result: forked cases two at a time, the fresh ones alongside."""
    tmp = tmp_path_factory.mktemp("cli_errors")
    env = {k: v for k, v in os.environ.items() if k not in ("MNIST_DEBUG", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                             "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE")}
    env.update(MNIST_DATA_ROOT=str(mnist_root), MNIST_RESULTS_DIR=str(tmp / "results"), MNIST_OFFLINE="1",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with hold_port() as (port, _):
        cases = _cases(tmp, Path(mnist_root), port)
        todo = [c for c in cases if not c.skip]
        (tmp / "logs").mkdir()
        with ThreadPoolExecutor(1) as pool:
            fresh = pool.submit(lambda: {c.id: _run(c, env) for c in todo if c.fresh})
            results = _run_forked([c for c in todo if not c.fresh], env, tmp / "logs")
            results.update(fresh.result())
    return {c.id: (c, results.get(c.id)) for c in cases}


def _case_ids() -> list[str]:
    """The table's ids without building its files (parsed from the source of _cases' groups)."""
    import ast
    import inspect

    trees = [ast.parse(inspect.getsource(group)) for group in _CASE_GROUPS]
    return [n.args[0].value for tree in trees for n in ast.walk(tree)
            if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Case"]


def test_the_table_is_big_enough():
    assert len(_case_ids()) >= 25 and len(set(_case_ids())) == len(_case_ids())


@pytest.mark.process
@pytest.mark.parametrize("case_id", _case_ids())
def test_bad_input_fails_cleanly(table, case_id):
    case, res = table[case_id]
    if case.skip:
        pytest.skip(case.skip)
    out = res["out"]
    assert res["code"] == case.code, f"exit code {res['code']}, expected {case.code}:\n{out[-3000:]}"
    for needle in case.needles:
        assert needle in out, f"{needle!r} not in the output:\n{out[-3000:]}"
    if "Traceback" not in case.needles:
        assert "Traceback" not in out, out[-3000:]
        assert out.count("error:") == 1 or case.code == 1, f"one message, not several:\n{out}"
    assert "weights_only=False" not in out  # never invite unsafe loading
    for path in case.outputs:
        assert not Path(path).exists(), f"{path} was written by a failed run"
    assert "epoch  1 |" not in out, "it trained before failing"


@pytest.mark.process
def test_no_case_left_a_results_file(table, tmp_path_factory):
    # the table's own folders only (mktemp("cli_errors") -> cli_errors0, ...): other tests write out/*.json too
    written = [p for p in Path(tmp_path_factory.getbasetemp()).glob("cli_errors*/out/*.json")]
    assert written == []


@pytest.mark.process
def test_failed_runs_leave_previous_files_intact(tmp_path, mnist_root):
    """An existing results file and a foreign snapshot survive a run that fails; a failing write keeps the old file."""
    out, snap = tmp_path / "r.json", tmp_path / "s.pt"
    out.write_text('{"previous": true}')
    snap.write_bytes(b"someone else's file")
    proc = subprocess.run([sys.executable, "-m", W + "ddp_train", *QUICK, "--out", str(out), "--snapshot", str(snap)],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "MNIST_DATA_ROOT": str(mnist_root)})
    assert proc.returncode == 2 and "not a snapshot written by this series" in proc.stderr
    assert json.loads(out.read_text()) == {"previous": True} and snap.read_bytes() == b"someone else's file"

    import mnist_helpers.io as io

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    with pytest.MonkeyPatch.context() as mp:  # the write itself fails half-way (after the data, before the rename)
        mp.setattr(io.os, "fsync", disk_full)
        with pytest.raises(OSError, match="No space left"):
            write_json(out, {"previous": False})
    assert json.loads(out.read_text()) == {"previous": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "s.pt"]  # no temporary file left


def test_check_writable_accepts_a_new_path_and_leaves_nothing(tmp_path):
    target = tmp_path / "deep" / "er" / "run.json"
    assert check_writable(target) == target
    assert not target.exists() and list((tmp_path / "deep" / "er").iterdir()) == []


def test_cli_entry_turns_expected_errors_into_exit_2_and_keeps_bugs(capsys, monkeypatch):
    monkeypatch.setenv("MNIST_DEBUG", "0")  # and restored afterwards: --debug below sets it in this process

    @errors.cli_entry
    def expected(argv=None):
        raise errors.ConfigError("--x 3 is out of range", "use --x 2")

    @errors.cli_entry
    def bug(argv=None):
        raise KeyError("a bug")

    with pytest.raises(SystemExit) as info:
        expected([])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.splitlines()[:2] == ["error: --x 3 is out of range", "  fix: use --x 2"]
    assert "Traceback" not in err
    with pytest.raises(KeyError):  # a bug keeps its traceback
        bug([])
    with pytest.raises(SystemExit):
        expected(["--debug"])
    assert "Traceback" in capsys.readouterr().err


def test_under_torchrun_only_the_first_rank_reports(tmp_path, monkeypatch, capsys):
    """Ranks of one attempt share torchrun's folder: the first to fail prints (with its rank), the others don't."""
    monkeypatch.setattr(errors.time, "sleep", lambda s: None)
    monkeypatch.delenv("MNIST_DEBUG", raising=False)
    err = errors.PathError("--out /x cannot be written", "point --out elsewhere")
    for rank in (1, 0):
        (tmp_path / "attempt_0" / str(rank)).mkdir(parents=True)
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "attempt_0" / str(rank) / "error.json"))
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        assert errors.report(err) == 2
    printed = capsys.readouterr().err
    assert printed.splitlines()[0] == "[rank 1] error: --out /x cannot be written"
    assert "[rank 0]" not in printed


@pytest.mark.process  # torchrun and 2 workers
def test_launcher_error_starts_with_the_workers_message(tmp_path, mnist_root):
    from mnist_helpers.launch import LaunchError, torchrun

    with pytest.raises(LaunchError) as info:
        torchrun(W + "ddp_train", ["--data-root", tmp_path / "nowhere", *QUICK], nproc=2, device="cpu",
                 echo=False, timeout=120, provision=False)
    e = info.value
    first = str(e).splitlines()[0]
    assert first in ("rank 0: MNIST data not usable:", "rank 1: MNIST data not usable:"), str(e)
    assert "make data" in str(e) and e.rank is not None
    assert e.output.count("MNIST data not usable") == 1, e.output  # printed once, not once per rank
    assert "[rank 0] Traceback" not in e.output and "[rank 1] Traceback" not in e.output


def test_flag_errors_under_torchrun_take_the_same_route(monkeypatch, capsys):
    """With several processes a bad flag is an expected error too, so only one rank prints it (no usage per rank)."""
    from mnist_helpers.workers.progression import ddp_train

    for name, value in (("WORLD_SIZE", "2"), ("RANK", "1"), ("MNIST_DEBUG", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    with pytest.raises(SystemExit) as info:
        ddp_train.cli(["--epochs", "x"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "usage:" not in err
    assert err.startswith("[rank 1] error: python -m mnist_helpers.workers.progression.ddp_train: argument --epochs")
    assert argparse.ArgumentParser.error is errors._ARGPARSE_ERROR  # put back afterwards
