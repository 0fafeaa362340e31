"""The worker progression single.py -> ddp_spawn.py -> ddp_train.py (12_ddp_in_depth, appendix A).

Each step must keep the previous one's code and mark every block it changes once (the rule is spelled out in
``mnist_helpers.course.worker_diffs``), so the progression cannot rot. Then the three workers
run for real: one process, two processes under mp.spawn (gloo), two under torchrun.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from mnist_helpers.launch import torchrun
from mnist_helpers.course.worker_diffs import (STEPS, WORKERS, code_lines, diff_counts, diff_text, source,
                                             step_report, unmarked_changes)

RESULT_KEYS = {"world_size", "backend", "device", "config", "history", "final_test_acc", "param_digests",
               "wall_seconds", "machine"}
ROW_KEYS = {"epoch", "seconds", "images", "steps", "images_per_s", "train_loss", "test_loss", "test_acc",
            "test_count"}
ARGS = ["--model", "fastnet", "--subset", "512", "--epochs", "1", "--batch-size", "64", "--lr", "3e-3"]


@pytest.mark.parametrize("step", [1, 2], ids=["single->ddp_spawn", "ddp_spawn->ddp_train"])
def test_each_step_marks_every_block_once(step):
    (prev_name, _), (name, marker) = STEPS[step - 1], STEPS[step]
    prev, new = code_lines(WORKERS / prev_name), code_lines(WORKERS / name)
    problems = unmarked_changes(prev, new, marker)
    assert not problems, f"{prev_name} -> {name}:\n" + "\n".join(problems)
    # a small diff: most of the code is the previous step's, unchanged (comments not counted)
    code = [ln for ln in new if not ln.startswith("#")]
    changed = diff_counts([ln for ln in prev if not ln.startswith("#")], code)["added_or_changed"]
    assert changed < 0.45 * len(code), f"{name} rewrites too much of {prev_name}"
    assert step_report()[step - 1]["violations"] == []


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


def test_no_bare_markers_and_the_key_lines_are_in_the_workers():
    """12 shows the files whole: what DDP and torchrun add must be in them, not hidden in the foundation."""
    for name, _ in STEPS:
        for ln in code_lines(WORKERS / name):
            assert not any(ln.rstrip().endswith(m) for m in ("# DDP:", "# torchrun:")), f"{name}: bare marker: {ln}"
    spawn, train = (WORKERS / "ddp_spawn.py").read_text(), (WORKERS / "ddp_train.py").read_text()
    for text in (spawn, train):
        for needle in ("dist.init_process_group(", "DDP(self.module", "DistributedSampler(", "set_epoch",
                       "dist.destroy_process_group()"):
            assert needle in text, needle
    assert "mp.spawn(main" in spawn and 'os.environ["MASTER_PORT"]' in spawn
    assert 'int(os.environ["LOCAL_RANK"])' in train and "mp.spawn(" not in train


def test_diffs_and_sources_render():
    text = diff_text("single.py", "ddp_spawn.py")
    assert text.startswith("--- single.py\n+++ ddp_spawn.py\n") and "+        self.tr.model = DDP(" in text
    assert '+    local_rank = int(os.environ["LOCAL_RANK"])' in diff_text("ddp_spawn.py", "ddp_train.py")
    assert source("ddp_train.py").data == (WORKERS / "ddp_train.py").read_text()


def test_every_worker_has_the_same_shape():
    for name, _ in STEPS:
        tree = ast.parse((WORKERS / name).read_text())
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
        methods = {n.name for n in trainer.body if isinstance(n, ast.FunctionDef)}
        assert {"_run_epoch", "_save_snapshot", "_load_snapshot", "train"} <= methods, name
        assert {"load_train_objs", "prepare_batches", "main", "cli"} <= functions, name


def test_ddp_train_keeps_its_flags():
    """Other notebooks launch ddp_train with TrainConfig's flags plus these four."""
    tree = ast.parse((WORKERS / "ddp_train.py").read_text())
    cli = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cli")
    calls = [n for n in ast.walk(cli) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    flags = {c.args[0].value for c in calls if c.func.attr == "add_argument"}
    assert flags == {"--out", "--snapshot", "--backend", "--timeout"}
    assert any(c.func.attr == "add_arguments" and ast.unparse(c.func.value) == "TrainConfig" for c in calls)


@pytest.mark.process
@pytest.mark.timeout(300)
def test_the_three_workers_train_alike(tmp_path, mnist_root):
    """single == ddp_train without torchrun (bit for bit); mp.spawn == torchrun with 2 processes (bit for bit)."""
    from mnist_helpers.train import TrainConfig
    from mnist_helpers.workers.progression import ddp_train, single

    env_args = ARGS + ["--data-root", str(mnist_root)]
    cfg = TrainConfig.from_args(env_args)
    # in this process: no torchrun, so ddp_train is a world of one without a process group
    runs = {"single": single.main(cfg), "ddp_train": ddp_train.main(cfg)}
    out = tmp_path / "spawn.json"
    proc = subprocess.run([sys.executable, "-m", "mnist_helpers.workers.progression.ddp_spawn", *env_args, "--nproc", "2",
                           "--out", str(out)], timeout=120, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs["spawn"] = json.loads(out.read_text())
    runs["torchrun"] = torchrun("mnist_helpers.workers.progression.ddp_train", env_args, nproc=2, timeout=120, echo=False,
                                device="cpu")
    for name, run in runs.items():
        assert set(run) == RESULT_KEYS, name
        assert set(run["history"][0]) == ROW_KEYS, name
        assert run["history"][0]["test_count"] == 10_000, name
    assert runs["single"]["world_size"] == runs["ddp_train"]["world_size"] == 1
    assert runs["single"]["backend"] is None and runs["ddp_train"]["backend"] is None
    assert runs["single"]["param_digests"] == runs["ddp_train"]["param_digests"]
    assert runs["spawn"]["world_size"] == runs["torchrun"]["world_size"] == 2
    assert runs["spawn"]["backend"] == runs["torchrun"]["backend"] == "gloo"
    assert len(set(runs["spawn"]["param_digests"])) == 1, "DDP replicas must stay identical"
    assert runs["spawn"]["param_digests"] == runs["torchrun"]["param_digests"]
    assert runs["spawn"]["final_test_acc"] == runs["torchrun"]["final_test_acc"]
    assert runs["spawn"]["history"][0]["images"] == runs["single"]["history"][0]["images"] == 512
