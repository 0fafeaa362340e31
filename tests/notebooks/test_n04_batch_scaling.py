"""Batch size and learning rate (notebook 04): the rules, the notebook's #@save copies, the fair plan, the sweep on
tiny data, the verdicts from synthetic rows, the benchmark script."""
import inspect
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from mnist_helpers.course import claims
from mnist_helpers.lessons.n04 import batch_scaling
from mnist_helpers.lessons.n04 import saved

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "04_batch_size_and_lr.ipynb"


def test_scaled_lr_rules():
    assert saved.scaled_lr("fixed", 0.1, 128, 512) == 0.1
    assert saved.scaled_lr("linear", 0.1, 128, 512) == pytest.approx(0.4)
    assert saved.scaled_lr("linear+warmup", 0.1, 128, 64) == pytest.approx(0.05)
    assert saved.scaled_lr("sqrt", 0.1, 128, 512) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="rule must be one of"):
        saved.scaled_lr("cubic", 0.1, 128, 512)


def test_warmup_ramps_from_start_to_one():
    assert saved.warmup_factor(0, 10, 0.25) == 0.25
    assert saved.warmup_factor(5, 10, 0.25) == pytest.approx(0.625)
    assert saved.warmup_factor(10, 10, 0.25) == 1.0
    assert saved.warmup_factor(3, 0, 0.25) == 1.0


def test_the_notebook_writes_the_lessons_code():
    """The lesson's code lives in the notebook's cells, marked #@save; the module runs that code (tests/course/test_saved.py
    checks mnist_helpers/lessons/n04/saved.py is current)."""
    from test_saved import build_saved

    _, saved_code = build_saved.collect(NOTEBOOK)
    names = {src.split("(")[0].removeprefix("def ") if src.startswith("def ") else src.split(" ")[0]
             for src in saved_code}
    assert names >= {"scaled_lr", "warmup_factor", "train_run", "BASE_LR", "BASE_BATCH"}
    train_run_src = next(src for src in saved_code if src.startswith("def train_run"))
    assert "loss.backward()" in train_run_src and "optimizer.step()" in train_run_src
    assert inspect.getsource(saved.train_run).rstrip("\n") == train_run_src


def test_fair_plan_doubles_and_labels_its_groups():
    plan = batch_scaling.fair_plan((128, 256, 512), num_epochs=3, adam_batches=(512,), tiny_step_batch=1024)
    groups = [p["group"] for p in plan]
    assert groups.count("doubling") == 1 + 2 * 2 and groups.count("adam") == 1 + 3
    assert groups.count("batch8") == 4 and groups.count("tiny-step") == 1
    assert groups.count("equal-steps") == 1 and groups.count("batch64") == 2
    assert next(p for p in plan if p["group"] == "equal-steps")["steps_of"] == [512, 3]
    assert all(p["num_epochs"] == 3 for p in plan if p["group"] in ("doubling", "adam", "batch64"))
    assert all(p["num_epochs"] == 1 for p in plan if p["group"] in ("batch8", "tiny-step"))
    with pytest.raises(ValueError, match="not a doubling"):
        batch_scaling.fair_plan((128, 512))
    with pytest.raises(ValueError, match="start at the base batch"):
        batch_scaling.fair_plan((256, 512))


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # steadier timings (tests/conftest.py)


@pytest.fixture(scope="module")
def tiny(small_mnist):
    X, y, Xt, yt = small_mnist
    return X[:256], y[:256], Xt[:64], yt[:64]


def test_sweep_calls_back_the_functions_it_is_given(tiny):
    plan = batch_scaling.fair_plan((16, 32, 64), num_epochs=2, adam_batches=(64,), small_batch=8, tiny_step_batch=128,
                        base_batch=16, low_batch=8)
    used = []

    def my_rule(rule, base_lr, base_batch, batch_size):
        used.append(rule)
        return saved.scaled_lr(rule, base_lr, base_batch, batch_size)
    seen = []
    rows = batch_scaling.sweep(tiny, plan, seeds=(0, 1), lr_rule=my_rule, base_batch=16, warmup_epochs=1.0, on_run=seen.append)
    assert len(rows) == 2 * len(plan) == len(seen) == len(used)
    for r in rows:
        if r["group"] == "equal-steps":  # the base batch for as many steps as batch 64 takes in 2 epochs
            assert r["steps"] == 2 * (256 // 64) and r["train_images"] == r["steps"] * 16
            continue
        assert r["steps"] == r["num_epochs"] * (256 // r["batch_size"])
        assert 0 <= r["test_acc"] <= 1 and r["gap"] == pytest.approx(r["train_acc"] - r["test_acc"])
        assert "step_losses" not in r
    r = next(r for r in rows if r["group"] == "doubling" and r["rule"] == "linear+warmup" and r["batch_size"] == 64)
    assert r["lr"] == pytest.approx(4 * saved.BASE_LR["sgd"]) and r["warmup_epochs"] == 0.5 and r["warmup_steps"] == 2
    assert math.isfinite(next(r for r in rows if r["batch_size"] == 8)["loss_noise"])
    verdicts = batch_scaling.judge(rows, base_batch=16)
    assert set(verdicts) == {"04.double_batch_double_lr", "04.adam_complicated", "04.batch8_unstable",
                             "04.batch4096", "04.batch_64_256"}
    for cid, v in verdicts.items():
        assert v["verdict"] in claims.VERDICTS
        entry = {"evidence": v["evidence"], "numbers": v["numbers"], "claim": "", "regime": batch_scaling.regime(rows)}
        assert claims.unsourced_numbers(entry) == [], cid
    assert not batch_scaling.summary(rows).empty


def _row(group, opt, rule, b, acc, seed, ips=1000.0, noise=0.1, gap=0.0, epochs=10):
    return {"group": group, "optimizer": opt, "rule": rule, "batch_size": b, "test_acc": acc, "seed": seed,
            "images_per_s": ips, "loss_noise": noise, "gap": gap, "diverged": False, "num_epochs": epochs,
            "steps": 10, "warmup_epochs": 1.0, "train_images": 100}


def _synthetic(lin_acc_4096=0.975, seeds=(0, 1, 2)):
    rows = []
    for s in seeds:
        e = 0.001 * s  # a small spread between seeds
        rows += [_row("doubling", "sgd", "fixed", 128, 0.98 + e, s),
                 _row("doubling", "sgd", "fixed", 256, 0.96 + e, s, 1500),
                 _row("doubling", "sgd", "linear+warmup", 256, 0.98 + e, s, 1500),
                 _row("doubling", "sgd", "fixed", 4096, 0.90 + e, s, 3000, gap=0.02),
                 _row("doubling", "sgd", "linear+warmup", 4096, lin_acc_4096 + e, s, 3000, gap=0.02),
                 _row("adam", "adam", "fixed", 128, 0.98 + e, s), _row("adam", "adam", "fixed", 2048, 0.95 + e, s),
                 _row("adam", "adam", "linear", 2048, 0.90 + e, s), _row("adam", "adam", "sqrt", 2048, 0.97 + e, s),
                 _row("batch8", "sgd", "fixed", 8, 0.97 + e, s, noise=0.7 + e, epochs=1),
                 _row("batch8", "sgd", "fixed", 128, 0.97 + e, s, noise=0.2 + e, epochs=1),
                 _row("batch8", "adam", "fixed", 8, 0.97 + e, s, noise=0.8 + e, epochs=1),
                 _row("batch8", "adam", "fixed", 128, 0.97 + e, s, noise=0.2 + e, epochs=1)]
    return rows


def test_verdicts_from_synthetic_rows():
    v = batch_scaling.judge(_synthetic())
    assert v["04.double_batch_double_lr"]["verdict"] == "holds with nuance"  # holds at 256, not at 4096
    assert v["04.double_batch_double_lr"]["numbers"]["holds_up_to_batch"] == 256
    assert v["04.adam_complicated"]["verdict"] == "holds"  # linear below sqrt, separated
    # noisier steps (by construction) but nothing diverged and the seeds agree: not unstable
    assert v["04.batch8_unstable"]["verdict"] == "does not hold here"
    assert "ends the same within the noise" in v["04.batch8_unstable"]["evidence"]
    assert v["04.batch4096"]["verdict"] == claims.CONFOUNDED  # worse per epoch; no equal-steps run to separate
    assert batch_scaling.judge(_synthetic(lin_acc_4096=0.98))["04.double_batch_double_lr"]["verdict"] == "holds"
    assert batch_scaling.judge(_synthetic(), busy=claims.BUSY)["04.batch4096"]["verdict"] == claims.BUSY
    one = batch_scaling.judge(_synthetic(seeds=(0,)))  # one seed: no spread, no accuracy verdict
    assert {one[c]["verdict"] for c in ("04.double_batch_double_lr", "04.adam_complicated",
                                         "04.batch8_unstable")} == {"inconclusive"}
    for entry in v.values():
        assert claims.unsourced_numbers({**entry, "claim": "", "regime": ""}) == []
    with pytest.raises(ValueError, match="no runs"):
        batch_scaling.judge([])


def test_batch_larger_than_data(tiny):
    with pytest.raises(ValueError, match="larger than the 256 training images"):
        saved.train_run(tiny, batch_size=512, lr=0.1)


@pytest.mark.process
def test_bench_script_quick_writes_a_claims_file(tmp_path, mnist_root):
    out = tmp_path / "bench_batch_scaling.json"
    cmd = [sys.executable, str(REPO / "scripts" / "bench_batch_scaling.py"), "--quick", "--seeds", "0", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600, cwd=REPO)
    data = json.loads(out.read_text())
    assert data["schema"] == claims.SCHEMA and data["profile"] == "quick"
    assert {c["id"] for c in data["claims"]} == {"04.double_batch_double_lr", "04.adam_complicated",
                                                 "04.batch8_unstable", "04.batch4096", "04.batch_64_256"}
    n = len(data["runs"])
    subprocess.run(cmd[:-2] + ["--seeds", "1", "--append", "--out", str(out)], check=True, capture_output=True,
                   text=True, timeout=600, cwd=REPO)
    data = json.loads(out.read_text())
    assert len(data["runs"]) == 2 * n and {r["seed"] for r in data["runs"]} == {0, 1}
    # --only: one group again for both seeds, every other row kept; its call is recorded with its groups
    subprocess.run(cmd[:-4] + ["--seeds", "0", "1", "--only", "equal-steps", "--append", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=600, cwd=REPO)
    data = json.loads(out.read_text())
    assert len(data["runs"]) == 2 * n and data["contention_by_call"][-1]["groups"] == ["equal-steps"]
    assert sum(r["group"] == "equal-steps" for r in data["runs"]) == 2
    bad = subprocess.run(cmd[:-2] + ["--small-batch", "16", "--append", "--out", str(out)], capture_output=True, text=True,
                         timeout=600, cwd=REPO)
    assert bad.returncode == 2 and "another configuration" in bad.stderr + bad.stdout
    # a file measured on another machine: --rejudge keeps its machine and date, --append refuses to mix machines
    other = {**data, "machine": {**data["machine"], "cpu_model": "Other CPU", "logical_cores": 64},
             "machine_label": "other-64core-x", "date": "2026-01-02T03:04:05+00:00"}
    out.write_text(json.dumps(other))
    subprocess.run(cmd[:-2] + ["--rejudge", "--out", str(out)], check=True, capture_output=True, text=True,
                   timeout=600, cwd=REPO)
    rejudged = json.loads(out.read_text())
    assert rejudged["machine"]["cpu_model"] == "Other CPU" and rejudged["date"] == other["date"]
    assert rejudged["machine_label"] != claims.machine_label() and len(rejudged["runs"]) == 2 * n
    mixed = subprocess.run(cmd[:-2] + ["--seeds", "2", "--append", "--out", str(out)], capture_output=True,
                           text=True, timeout=600, cwd=REPO)
    assert mixed.returncode == 2 and "one file, one machine" in mixed.stderr + mixed.stdout


def test_batch_explorer_static_table_and_widget(capsys):
    from mnist_helpers.lessons.n04.lesson import batch_explorer, explorer_table
    rows = [{"group": "doubling", "optimizer": "sgd", "rule": rule, "batch_size": b, "lr": 0.05, "test_acc": acc,
             "train_acc": acc, "gap": 0.0, "images_per_s": 100.0, "loss_noise": 0.1, "seconds": 1.0}
            for rule, b, acc in [("fixed", 128, 0.95), ("fixed", 512, 0.90), ("linear", 512, 0.93),
                                 ("linear+warmup", 512, 0.94)]]
    df = explorer_table(rows, "sgd", "test_acc")
    assert list(df.columns) == ["batch_size", "fixed", "linear", "linear+warmup"]
    assert df.iloc[0].tolist() == [128, 0.95, 0.95, 0.95]  # the base batch is every rule's start
    assert df.iloc[1].tolist() == [512, 0.90, 0.93, 0.94]
    assert batch_explorer(rows, interactive=False) is None
    out = capsys.readouterr().out
    assert "SGD | test accuracy" in out and "93.00%" in out
    box = batch_explorer(rows)
    opt, met = box.children[0].children
    met.value = "images_per_s"  # redraws without error
    with pytest.raises(ValueError, match="metric must be one of"):
        explorer_table(rows, "sgd", "f1")
