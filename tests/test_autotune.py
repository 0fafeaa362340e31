"""autotune (notebook 09) on tiny budgets: every stage measured or marked skipped, a valid configuration."""
import pytest

from mnist_helpers.lessons.l09_profiling import (autotune, evidence_table, lr_optimizer_gain, measure_steps, stage_gains)
from mnist_helpers.train import TrainConfig


def test_tiny_budget_still_returns_a_measured_valid_configuration(mnist_root):
    res = autotune(budget_s=0.01, device="cpu", model="fastnet", max_batch_size=64, subset=128, steps=1, repeats=2,
                   nproc=[1, 2], log=None)
    ev = res["evidence"]
    stages = [r["stage"] for r in ev]
    assert set(stages) == {"threads", "batch_size", "loader", "amp", "nproc"}
    for stage in set(stages):
        rows = [r for r in ev if r["stage"] == stage]
        assert rows[0]["status"] == "measured" and rows[0]["images_per_s"] > 0  # the first is always measured
        assert sum(r["chosen"] for r in rows) == 1
        assert all(r["status"] == "measured" or r["status"].startswith(("skipped", "unsupported")) for r in rows)
    assert any(r["status"].startswith("skipped") for r in ev)  # the budget was respected
    assert next(r for r in ev if r["stage"] == "nproc" and r["setting"] == 2)["status"].startswith("skipped")
    TrainConfig(**res["config"])  # a configuration the trainer accepts
    assert res["nproc"] == 1 and res["config"]["batch_size"] == 64  # min(article's 128, max_batch_size) first
    first_feed = next(r for r in ev if r["stage"] == "loader")
    assert (first_feed["loader"], first_feed["num_workers"]) == ("dataloader", 4)  # the article's feed first
    assert set(stage_gains(ev)) == set(stages)
    df = evidence_table(ev)
    assert list(df.columns) == ["stage", "setting", "images_per_s", "iqr_images_per_s", "chosen", "status"]
    assert len(df) == len(ev) and df["chosen"].sum() == len(set(stages))


def test_generous_budget_measures_every_in_process_candidate(mnist_root):
    res = autotune(budget_s=300, device="cpu", model="fastnet", max_batch_size=64, threads=[1], num_workers=[0],
                   amp=["none", "bf16"], nproc=[1], subset=128, steps=1, repeats=1, log=None)
    ev = res["evidence"]
    assert all(r["status"] == "measured" or r["status"].startswith("unsupported") for r in ev)
    assert [r["setting"] for r in ev if r["stage"] == "batch_size"] == [64, 32]
    best = max((r for r in ev if r["stage"] == "batch_size"), key=lambda r: r["images_per_s"])
    assert best["chosen"] and res["config"]["batch_size"] == best["setting"]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="budget_s must be a positive"):
        autotune(budget_s=0)
    with pytest.raises(ValueError, match="amp must list"):
        autotune(budget_s=1, amp=["fp8"])
    with pytest.raises(ValueError, match="nproc must list positive"):
        autotune(budget_s=1, nproc=[0])
    with pytest.raises(ValueError, match="batch_size must be a positive"):
        measure_steps("fastnet", 0, device="cpu")


def test_lr_optimizer_gain_counts_steps_to_the_default_accuracy(small_mnist):
    X, y, X_test, y_test = small_mnist
    res = lr_optimizer_gain((X[:256], y[:256], X_test[:100], y_test[:100]),
                            candidates=(("adam", 1e-3), ("adam", 3e-3)), batch_size=16, steps=4, eval_every=2)
    assert res["rows"][0]["steps_to_target"] is not None  # the default reaches its own final accuracy
    assert res["gain"] >= 1.0 and len(res["rows"]) == 2
    with pytest.raises(ValueError, match="optimizer must be adam or sgd"):
        lr_optimizer_gain((X[:64], y[:64], X_test[:10], y_test[:10]), candidates=(("rmsprop", 1e-3),), steps=4,
                          eval_every=2)
