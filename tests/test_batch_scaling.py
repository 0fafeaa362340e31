"""Batch-size / learning-rate sweep (notebook 04) on tiny data: the rules, the plan, logging, verdicts."""
import math

import pytest
import torch

from mnist_helpers.lessons import l04_batch_scaling as bs
from mnist_helpers.experiments import query


def test_scaled_lr_rules():
    assert bs.scaled_lr("fixed", 0.1, 128, 512) == 0.1
    assert bs.scaled_lr("linear", 0.1, 128, 512) == pytest.approx(0.4)
    assert bs.scaled_lr("linear+warmup", 0.1, 128, 64) == pytest.approx(0.05)
    assert bs.scaled_lr("sqrt", 0.1, 128, 512) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="rule must be one of"):
        bs.scaled_lr("cubic", 0.1, 128, 512)


def test_warmup_ramps_from_start_to_one():
    assert bs.warmup_factor(0, 10, 0.25) == 0.25
    assert bs.warmup_factor(5, 10, 0.25) == pytest.approx(0.625)
    assert bs.warmup_factor(10, 10, 0.25) == 1.0
    assert bs.warmup_factor(3, 0, 0.25) == 1.0


def test_plan_shares_the_base_run_and_skips_pointless_warmup():
    plan = bs._plan([32, 128, 512], ["sgd"], 128, bs.RULES)
    assert ("sgd", "fixed", 128) in plan and ("sgd", "linear", 128) not in plan
    assert ("sgd", "linear+warmup", 512) in plan and ("sgd", "linear+warmup", 32) not in plan
    assert len(plan) == 3 + 2 + 1


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a shared 2-core machine two threads spin on each other (measured 5-10x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(small_mnist):
    X, y, Xt, yt = small_mnist
    return X[:128], y[:128], Xt[:64], yt[:64]


def test_sweep_rows_log_and_verdicts(tiny, tmp_path):
    log = tmp_path / "log.jsonl"
    seen = []
    rows = bs.batch_lr_sweep(tiny, batch_sizes=(8, 16, 64), base_batch=16, model="fastnet", num_epochs=1,
                             log_notebook="04", log_path=log, on_run=seen.append, tags=["run-1"])
    # sgd: fixed x3, linear x2, warm-up x1 (above base only); adam: fixed x3, linear x2, sqrt x2
    assert len(rows) == 13 == len(seen)
    r = next(r for r in rows if r["optimizer"] == "sgd" and r["rule"] == "linear+warmup")
    assert r["batch_size"] == 64 and r["lr"] == pytest.approx(4 * bs.BASE_LR["sgd"]) and r["warmup_steps"] == 1
    for r in rows:
        assert r["images"] == 128 and r["steps"] == math.ceil(128 / r["batch_size"])
        assert 0 <= r["test_acc"] <= 1 and r["gap"] == pytest.approx(r["train_acc"] - r["test_acc"])
    logged = query(path=log, notebook="04", tag="run-1")
    assert len(logged) == 13 and {"test_acc", "gap", "images_per_s"} <= logged[0].keys()
    claims = [v["claim"] for v in bs.scaling_verdicts(rows, base_batch=16)]
    assert claims[0].startswith("double the batch") and any("unstable" in c for c in claims)
    assert any("generalises worse" in c for c in claims) and any("Adam" in c for c in claims)


def test_warmup_steps_and_loss_noise(tiny):
    r = bs.train_run(tiny, batch_size=16, lr=0.04, optimizer="sgd", model="fastnet", warmup_frac=0.5, warmup_from=0.01)
    assert r["warmup_steps"] == 4 and r["steps"] == 8 and math.isfinite(r["loss_noise"])


def test_verdicts_from_synthetic_rows():
    def row(opt, rule, b, acc, ips=1000.0, noise=0.1, gap=0.0):
        return {"optimizer": opt, "rule": rule, "batch_size": b, "test_acc": acc, "images_per_s": ips,
                "loss_noise": noise, "gap": gap, "diverged": acc < 0.2}  # synthetic
    rows = [row("sgd", "fixed", 8, 0.5), row("sgd", "fixed", 128, 0.97), row("sgd", "fixed", 4096, 0.80, 3000),
            row("sgd", "linear", 4096, 0.95, 3000), row("sgd", "linear+warmup", 4096, 0.96, 3000),
            row("adam", "fixed", 8, 0.975), row("adam", "fixed", 128, 0.98), row("adam", "fixed", 4096, 0.94, 3000),
            row("adam", "linear", 4096, 0.1, 3000), row("adam", "sqrt", 4096, 0.95, 3000)]
    v = {d["claim"]: d["verdict"] for d in bs.scaling_verdicts(rows)}
    assert v["double the batch, double the LR (SGD)"] == "holds here"
    assert v["Adam is different (linear scaling is not its rule)"] == "holds here"
    assert v["batch 8 is unstable"] == "partly holds here"
    assert v["batch 4096 is fast but generalises worse"] == ("fast: yes; lower test accuracy: yes; "
                                                           "wider train-test gap: no")
    down = rows[:3] + [row("sgd", "linear", 8, 0.97), row("sgd", "linear", 4096, 0.1, 3000)]
    v = {d["claim"]: d["verdict"] for d in bs.scaling_verdicts(down)}
    assert v["double the batch, double the LR (SGD)"] == ("does not hold here going up; it holds going down "
                                                          "(smaller batch, smaller LR)")
    with pytest.raises(ValueError, match="no runs"):
        bs.scaling_verdicts([])


@pytest.mark.parametrize("kwargs,match", [
    ({"batch_sizes": ()}, "at least one batch size"),
    ({"batch_sizes": (0,)}, "positive integers"),
    ({"optimizers": ("rmsprop",)}, "sgd or adam"),
    ({"rules": {"sgd": ("cubic",)}}, "rule must be one of"),
])
def test_bad_sweep_arguments(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        bs.batch_lr_sweep(tiny, **kwargs)


def test_batch_larger_than_data(tiny):
    with pytest.raises(ValueError, match="larger than the 128 training images"):
        bs.train_run(tiny, batch_size=512, lr=0.1)


def test_batch_explorer_static_table_and_widget(capsys):
    from mnist_helpers.lessons.l04_batch_scaling import batch_explorer, explorer_table
    rows = [{"optimizer": "sgd", "rule": rule, "batch_size": b, "lr": 0.05, "test_acc": acc, "train_acc": acc,
             "gap": 0.0, "images_per_s": 100.0, "loss_noise": 0.1, "seconds": 1.0}
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
