"""claims_09 (notebook 09) judged from synthetic runs: each claim both ways, the load rule, numbers sourced."""
import pytest

from mnist_helpers.course import claims
from mnist_helpers.lessons.n09.lesson import (ARTICLE_BASELINE, LEVERS, Measured09, claims_09, lever_plan,
                                                 priority_judgement, runs_summary)

CHANGES = {1: {"loader": "tensor", "num_workers": 0, "pin_memory": False}, 2: {"lr": 2e-3}, 3: {"amp": "bf16"},
           4: {"nproc": 2}}


# the names lever_plan gives the notebook's levers (what each changes, with the numbers it quotes)
NAMES = {p["lever"]: p["name"] for p in lever_plan(ARTICLE_BASELINE, CHANGES, device="cpu") if p["lever"]}


def runs(gains, seeds=(0, 1, 2), base_s=100.0, device="cpu"):
    """One row per (seed, run): the baseline takes base_s, lever L takes base_s / gains[L] (+ a little per seed);
    lever 4 runs 2 processes, every run on ``device`` (on "cpu" lever 4 is the CPU stand-in)."""
    rows = []
    for seed in seeds:
        rows.append({"name": "baseline", "lever": 0, "seed": seed, "seconds": base_s, "images": 1000, "reached": True,
                     "final_acc": 0.97, "nproc": 1, "device": device})
        for lev, g in gains.items():
            rows.append({"name": NAMES.get(lev, f"{lev}. {LEVERS[lev]}"), "lever": lev, "seed": seed,
                         "seconds": base_s / (g * (1 + 0.01 * seed)), "images": 1000, "reached": True,
                         "final_acc": 0.97, "nproc": 2 if lev == 4 else 1, "device": device})
        rows.append({"name": "autotune's choice", "lever": None, "seed": seed, "seconds": base_s / 2.5,
                     "images": 1000, "reached": True, "final_acc": 0.97, "nproc": 1, "device": "cpu"})
    return rows


def judge(gains, changes=CHANGES, load=None, seeds=(0, 1, 2), timer_ok=True, device="cpu"):
    rows = runs(gains, seeds, device=device)
    shares = {f: {"data wait": 0.4, "compute": 0.5, "communication": 0.0, "other": 0.1}
              for f in ("DataLoader, 2 workers", "in-memory tensors")}
    ddp = {"backend": "gloo", "device": "cpu", "ranks": [{"breakdown": [
        {"part": p, "share": s} for p, s in (("data wait", 0.1), ("compute", 0.6), ("communication", 0.3))]}]}
    timer = [{"comparison": "threads", "setting": t, "median_ms": 20.0 / t if timer_ok else 0.0, "iqr_ms": 1.0,
              "images_per_s": 32 * t} for t in (1, 2)]
    entries = claims_09(Measured09(
        rows=rows, summary=runs_summary(rows), lever_changes=changes, target=0.97, test_subset=1000,
        n_seeds=len(seeds), model="net", dist_note="2 processes on the CPU", run_device="cpu", priority_load=load,
        shares=shares, ddp=ddp, timer_rows=timer, timer_batch=128, timer_load=load, budget_s=60, profile_steps=5,
        device="cpu", machine="a test machine"))
    for e in entries:
        assert e["verdict"] in claims.VERDICTS
        assert not claims.unsourced_numbers(e), (e["id"], claims.unsourced_numbers(e))
    return {e["id"]: e for e in entries}


def test_the_order_in_order_holds_only_partly_when_lever_1_is_the_feed_only():
    got = judge({1: 4.0, 2: 3.0, 3: 2.0, 4: 1.2})
    assert got["09.tuning_priority"]["verdict"] == "holds with nuance"
    assert "feed only" in got["09.tuning_priority"]["evidence"]
    assert "measured as loader=tensor" in got["09.tuning_priority"]["regime"]
    with_batch = {**CHANGES, 1: {**CHANGES[1], "batch_size": 256}}
    assert judge({1: 4.0, 2: 3.0, 3: 2.0, 4: 1.2}, with_batch, device="cuda")["09.tuning_priority"]["verdict"] \
        == "holds"
    # on a CPU lever 4 is a stand-in: left out of the order, so the order of 1-3 is at most holds with nuance
    assert judge({1: 4.0, 2: 3.0, 3: 2.0, 4: 1.2}, with_batch)["09.tuning_priority"]["verdict"] == "holds with nuance"


def test_no_order_verdict_rests_on_the_cpu_stand_in():
    """Lever 4 beating every other lever inverts the order on GPUs; as a CPU stand-in it is reported, not ordered."""
    gains = {1: 4.0, 2: 3.0, 3: 2.0, 4: 10.0}
    assert judge(gains, device="cuda")["09.tuning_priority"]["verdict"] == "does not hold here"
    e = judge(gains)["09.tuning_priority"]
    assert e["verdict"] == "holds with nuance" and "(CPU stand-in, not ordered)" in e["evidence"]
    assert "lever 4 left out of the order" in e["evidence"]
    assert judge({1: 1.1, 2: 3.0, 3: 2.0, 4: 10.0})["09.tuning_priority"]["verdict"] == "does not hold here"  # 1-3
    j = priority_judgement(runs(gains), CHANGES)
    assert j["stand_in"] == [4] and 4 not in j["priority"]["measured_order"] and "stand-in" in j["sentence"]


def test_an_inverted_order_does_not_hold_and_overlap_or_few_seeds_is_inconclusive():
    assert judge({1: 1.1, 2: 3.0, 3: 2.0, 4: 1.2})["09.tuning_priority"]["verdict"] == "does not hold here"
    assert judge({1: 2.0, 2: 2.01, 3: 1.5, 4: 1.2})["09.tuning_priority"]["verdict"] == "inconclusive"
    assert judge({1: 4.0, 2: 3.0, 3: 2.0, 4: 1.2}, seeds=(0,))["09.tuning_priority"]["verdict"] == "inconclusive"


def test_a_busy_machine_gives_no_priority_judgement():
    busy = {"others_cpu_share": 0.5, "busy": True}
    assert judge({1: 4.0, 2: 3.0, 3: 2.0, 4: 1.2}, load=busy)["09.tuning_priority"]["verdict"] == claims.BUSY
    assert priority_judgement(runs({1: 4.0, 2: 3.0}), CHANGES, busy)["word"] == claims.BUSY


def test_the_tools_demonstrated_or_not():
    assert judge({1: 4.0, 2: 3.0})["09.profiler_benchmark"]["verdict"] == "demonstrated"
    assert judge({1: 4.0, 2: 3.0}, timer_ok=False)["09.profiler_benchmark"]["verdict"] == "does not hold here"


def test_record_accepts_the_entries(tmp_path):
    res = claims.record("09_profiling_and_autotune", list(judge({1: 4.0, 2: 3.0}).values()), profile="quick",
                        folder=tmp_path)
    assert len(claims.summary(res)) == 2
