"""autotune (notebook 09) on tiny budgets: every stage measured or marked skipped, a valid configuration."""
import pytest

from mnist_helpers.lessons.n09.lesson import (NotMeasured, Budget, autotune, evidence_table, measure_steps,
                                                 search_stage, stage_gains)
from mnist_helpers.train import TrainConfig


@pytest.mark.process
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


def test_search_stage_measures_the_first_records_the_rest_and_picks_the_fastest():
    rows = []

    def record(stage, setting, status, result=None):
        rows.append({"stage": stage, "setting": setting, "status": status, "chosen": False,
                     "images_per_s": result["images_per_s"] if result else None})
        return rows[-1]

    def measure(setting):
        if setting == "oom":
            raise NotMeasured("out of memory")
        return {"images_per_s": {"a": 10.0, "b": 30.0, "c": 20.0}[setting]}

    roomy = Budget(100.0, ["batch_size"])
    roomy.start("batch_size")
    best = search_stage("batch_size", ["a", "oom", "b", "c"], measure, roomy, record)
    assert best["setting"] == "b" and best["chosen"] and sum(r["chosen"] for r in rows) == 1
    assert [r["status"] for r in rows] == ["measured", "out of memory", "measured", "measured"]
    rows.clear()
    spent = Budget(1e-9, ["nproc"])
    spent.start("nproc")
    best = search_stage("nproc", ["a", "b"], measure, spent, record, cost_s=25)
    assert best["setting"] == "a"  # the first is measured whatever the budget
    assert rows[1]["status"] == "skipped (budget: a launch takes ~25 s)"
    rows.clear()
    with pytest.raises(RuntimeError, match="no batch_size candidate could be measured"):
        search_stage("batch_size", ["oom"], measure, roomy, record)
