"""The series' DDP worker ``ddp_train.py`` (12_ddp_in_depth, appendix A) and the diff rule of the learner's
progression (06: train_single.py -> train_ddp.py, 07: -> train_ft.py; the rule is spelled out in
``mnist_helpers.course.worker_diffs``). The worker then runs for real: one process without torchrun, two processes
started by mp.spawn (``--spawn 2``) and two under torchrun.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from mnist_helpers.launch import torchrun
from mnist_helpers.course.worker_diffs import WORKERS, code_lines, diff_counts, diff_text, source, unmarked_changes

RESULT_KEYS = {"world_size", "backend", "device", "config", "history", "final_test_acc", "param_digests",
               "wall_seconds", "machine"}
ROW_KEYS = {"epoch", "seconds", "images", "steps", "images_per_s", "train_loss", "test_loss", "test_acc",
            "test_count"}
ARGS = ["--model", "fastnet", "--subset", "512", "--epochs", "1", "--batch-size", "64", "--lr", "3e-3"]
WORKER = "mnist_helpers.workers.progression.ddp_train"


def test_the_rule_catches_unmarked_blocks_double_marks_and_bare_markers():
    prev = ["a = 1", "b = 2", "c = 3", "d = 4", "e = 5", "f = 6"]
    # one marked block: fine, whether the marker sits on a comment line above it or at the end of a one-line change
    assert unmarked_changes(prev, ["a = 1", "# DDP: why", "b = 20", "b2 = 21", "c = 3", "d = 4", "e = 5", "f = 6"],
                            "# DDP:") == []
    assert unmarked_changes(prev, ["a = 1", "b = 20  # DDP: why", "c = 3", "d = 4", "e = 5", "f = 6"], "# DDP:") == []
    # a changed block without its marker
    assert unmarked_changes(prev, ["a = 1", "b = 20", "c = 3", "d = 4", "e = 5", "f = 6"], "# DDP:") == [
        "a block without '# DDP:' (starting: b = 20)"]
    # lines removed with nothing in their place: the removal needs its marker comment
    assert unmarked_changes(prev, ["a = 1", "c = 3", "d = 4", "e = 5", "f = 6"], "# DDP:") == [
        "removed lines without '# DDP:' (starting: b = 2)"]
    assert unmarked_changes(prev, ["a = 1", "# DDP: b goes", "c = 3", "d = 4", "e = 5", "f = 6"], "# DDP:") == []
    # one block marked on every line (the old habit: `finally:  # DDP: ...` and so on)
    twice = unmarked_changes(prev, ["a = 1", "b = 20  # DDP: x", "c = 30  # DDP: y", "d = 4", "e = 5", "f = 6"],
                             "# DDP:")
    assert twice == ["'# DDP:' 2 times in one block (mark it once): b = 20  # DDP: x | c = 30  # DDP: y"]
    # a change one line after a marked block belongs to it (no marker needed) unless it opens with its own marker
    assert unmarked_changes(prev, ["a = 1", "# DDP: x", "b = 20", "c = 3", "d = 40", "e = 5", "f = 6"],
                            "# DDP:") == []
    assert unmarked_changes(prev, ["a = 1", "b = 20  # DDP: x", "c = 3", "# DDP: y", "d = 40", "e = 5", "f = 6"],
                            "# DDP:") == []
    # a bare marker says nothing
    assert unmarked_changes(prev, ["a = 1", "b = 20  # DDP:", "c = 3", "d = 4", "e = 5", "f = 6"], "# DDP:") == [
        "bare marker (say why): b = 20  # DDP:"]


def test_no_bare_markers_and_the_key_lines_are_in_the_worker():
    """12 shows the file whole: what DDP, torchrun and mp.spawn add must be in it, not hidden in the foundation."""
    for ln in code_lines(WORKERS / "ddp_train.py"):
        assert not any(ln.rstrip().endswith(m) for m in ("# DDP:", "# torchrun:")), f"bare marker: {ln}"
    text = (WORKERS / "ddp_train.py").read_text()
    for needle in ("dist.init_process_group(", "DDP(self.module", "DistributedSampler(", "set_epoch",
                   "dist.destroy_process_group()", 'int(os.environ["LOCAL_RANK"])', "mp.spawn(_spawned",
                   'MASTER_PORT=str(port)'):
        assert needle in text, needle


def test_diffs_and_sources_render(tmp_path):
    (tmp_path / "a.py").write_text('"""a"""\nx = 1\ny = 2\n')
    (tmp_path / "b.py").write_text('"""b"""\nx = 1\ny = 3  # DDP: why\n')
    assert diff_text("a.py", "b.py", workers=tmp_path) == (
        "--- a.py\n+++ b.py\n@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n+y = 3  # DDP: why\n")
    assert diff_counts(code_lines(tmp_path / "a.py"), code_lines(tmp_path / "b.py"))["blocks"] == 1
    assert source("ddp_train.py").data == (WORKERS / "ddp_train.py").read_text()


def test_the_worker_has_the_tutorial_shape():
    """pytorch/examples' DDP tutorial shape, which ft_train.py's Trainer subclasses."""
    tree = ast.parse((WORKERS / "ddp_train.py").read_text())
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    methods = {n.name for n in trainer.body if isinstance(n, ast.FunctionDef)}
    assert {"_run_epoch", "_save_snapshot", "_load_snapshot", "train"} <= methods
    assert {"load_train_objs", "prepare_batches", "setup", "cleanup", "main", "spawn", "cli"} <= functions


def test_ddp_train_keeps_its_flags():
    """Other notebooks launch ddp_train with TrainConfig's flags plus these five."""
    tree = ast.parse((WORKERS / "ddp_train.py").read_text())
    cli = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cli")
    calls = [n for n in ast.walk(cli) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    flags = {c.args[0].value for c in calls if c.func.attr == "add_argument"}
    assert flags == {"--out", "--snapshot", "--backend", "--timeout", "--spawn"}
    assert any(c.func.attr == "add_arguments" and ast.unparse(c.func.value) == "TrainConfig" for c in calls)


def test_spawn_refuses_a_bad_count_and_a_torchrun_parent(monkeypatch, capsys):
    from mnist_helpers.workers.progression import ddp_train

    with pytest.raises(SystemExit) as e:
        ddp_train.cli(["--spawn", "0", *ARGS])
    assert e.value.code == 2 and "--spawn must be a positive number of processes, got 0" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as e:
        ddp_train.cli(["--spawn", "2", *ARGS])
    assert e.value.code == 2 and "run it with python, not under torchrun" in capsys.readouterr().err


@pytest.mark.process
@pytest.mark.timeout(300)
def test_the_worker_trains_alike_however_started(tmp_path, mnist_root):
    """mp.spawn == torchrun with 2 processes (bit for bit); alone it is a world of one without a process group."""
    from mnist_helpers.train import TrainConfig
    from mnist_helpers.workers.progression import ddp_train

    env_args = ARGS + ["--data-root", str(mnist_root)]
    runs = {"alone": ddp_train.main(TrainConfig.from_args(env_args))}  # in this process: no torchrun
    out = tmp_path / "spawn.json"
    proc = subprocess.run([sys.executable, "-m", WORKER, *env_args, "--spawn", "2", "--out", str(out)],
                          timeout=120, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("[rank 0] world_size 2 | backend gloo"), proc.stdout
    runs["spawn"] = json.loads(out.read_text())
    runs["torchrun"] = torchrun(WORKER, env_args, nproc=2, timeout=120, echo=False, device="cpu")
    for name, run in runs.items():
        assert set(run) == RESULT_KEYS, name
        assert set(run["history"][0]) == ROW_KEYS, name
        assert run["history"][0]["test_count"] == 10_000, name
    assert runs["alone"]["world_size"] == 1 and runs["alone"]["backend"] is None
    assert runs["spawn"]["world_size"] == runs["torchrun"]["world_size"] == 2
    assert runs["spawn"]["backend"] == runs["torchrun"]["backend"] == "gloo"
    assert len(set(runs["spawn"]["param_digests"])) == 1, "DDP replicas must stay identical"
    assert runs["spawn"]["param_digests"] == runs["torchrun"]["param_digests"]
    assert runs["spawn"]["final_test_acc"] == runs["torchrun"]["final_test_acc"]
    assert runs["spawn"]["history"][0]["images"] == runs["alone"]["history"][0]["images"] == 512
