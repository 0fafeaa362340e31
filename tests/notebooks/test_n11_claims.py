"""Notebook 11's claims, judged by ``l11.claims_11`` (lessons/n11/lesson.py) from synthetic measurements (no training, no launch):
every verdict can come out both ways, timings on a busy machine get no verdict, and every number an evidence string
quotes is among that claim's numbers."""
from __future__ import annotations

import copy

import pytest

from mnist_helpers.course import claims
from mnist_helpers.lessons.n11.lesson import Measured11, claims_11

QUIET = {"others_cpu_share": 0.02, "load_avg_before": 0.5, "load_avg_after": 0.6, "cores": 2, "wall_s": 5.0,
         "busy": False}
BUSY = {**QUIET, "others_cpu_share": 0.6, "busy": True}


def mem_row(strategy, n, state, opt, peak, est_state=None, diff=1e-6):
    return {"strategy": strategy, "world_size": n, "persistent_state_mib": state, "optimizer_state_mib": opt,
            "peak_mib": peak, "estimated_state_mib": est_state or state, "peak_vs_estimate": 1.0,
            "max_param_diff": diff}


def good() -> dict:
    """Measurements under which every claim of the notebook holds."""
    mem = []
    for n in (1, 2):
        mem += [mem_row("ddp", n, 400, 200, 500), mem_row("zero1", n, 200 + 200 / n, 200 / n, 420),
                mem_row("fsdp2_zero2", n, 400 / n, 200 / n, 400), mem_row("fsdp2_zero3", n, 400 / n, 200 / n, 300)]
    ckpt = [{"batch_size": 256, "checkpointing": False, "activations_mib": 90.0, "step_ms": 100.0},
            {"batch_size": 256, "checkpointing": True, "activations_mib": 20.0, "step_ms": 133.0}]
    digests = {"a": "x", "b": "y"}
    return dict(config=dict(width=256, blocks=2, batch_size=64, steps=3, worlds=(1, 2), ckpt_width=128,
                            ckpt_batches=(64, 256)),
                mem_rows=mem, ckpt_rows=ckpt, ckpt_contention=QUIET, dcp_saved={"digests": digests},
                dcp_loaded={1: {"digests": dict(digests)}, 4: {"digests": dict(digests)}},
                torch_save={"local_shape": (128, 784), "full_shape": (256, 784), "full_error": "no group"},
                tp={2: {"output_max_diff": 1e-7, "grad_max_diff": 1e-8}},
                compile_result={"step_s": {"eager": 0.1, "compiled": 0.07}, "first_step_s": {"compiled": 12.0},
                                "max_param_diff": 1e-7},
                compile_contention=QUIET, pipe={"outcome": "hung inside schedule.step()", "hung": True},
                pipeline_timeout_s=45)


def verdicts(**kw) -> dict:
    entries = claims_11(Measured11(**kw))
    for e in entries:
        assert e["id"].startswith("11.") and e["section"] == "ours" and e["claim"]
        assert claims.unsourced_numbers(e) == [], (e["id"], e["evidence"])
        assert e["verdict"] in claims.VERDICTS
    return {e["id"]: e["verdict"] for e in entries}


def test_all_hold_on_good_measurements_and_record_accepts_them(tmp_path):
    v = verdicts(**good())
    assert len(v) == 14 and set(v.values()) == {"holds"}, v
    res = claims.record("11_beyond_data_parallel", claims_11(Measured11(**good())), profile="quick", folder=tmp_path)
    assert (tmp_path / "11_beyond_data_parallel.json").is_file() and len(res.claims) == 14


def test_each_claim_can_fail():
    m = good()
    bad = copy.deepcopy(m)
    for r in bad["mem_rows"]:
        r["estimated_state_mib"] = r["persistent_state_mib"] * 0.5      # the estimate is off by 2x
        r["peak_vs_estimate"] = 1.6
        r["max_param_diff"] = 1e-3                                      # a missed reduction
        if r["world_size"] == 2 and r["strategy"] == "zero1":
            r["optimizer_state_mib"] = 190                              # not sharded
        if r["world_size"] == 2 and r["strategy"] == "fsdp2_zero3":
            r["persistent_state_mib"], r["peak_mib"] = 390, 450          # not sharded, peaks higher than ZeRO-2
    bad["ckpt_rows"][1].update(activations_mib=85.0, step_ms=101.0)   # no saving; time within noise
    bad["dcp_loaded"][4]["digests"]["a"] = "z"
    bad["torch_save"] = {"local_shape": (256, 784), "full_shape": (256, 784), "full_error": None}
    bad["tp"][2]["output_max_diff"] = 1e-3
    bad["compile_result"] = {"step_s": {"eager": 0.1, "compiled": 0.2}, "first_step_s": {"compiled": 12.0},
                             "max_param_diff": 1e-3}
    bad["pipe"] = {"outcome": "finished", "hung": False, "step_seconds": [0.25, 0.12]}
    v = verdicts(**bad)
    assert v.pop("11.checkpointing_time") == "inconclusive"
    assert set(v.values()) == {"does not hold here"}, v


def test_in_between_and_not_testable_outcomes():
    m = good()
    for r in m["mem_rows"]:
        if r["strategy"] == "fsdp2_zero3" and r["world_size"] == 2:
            r["peak_mib"] = 402                                         # within 5% of ZeRO-2: too close to call
    m["compile_result"]["step_s"]["compiled"] = 0.1                     # within 10%
    m["pipe"] = {"outcome": "timed out before the first step started (a slow start, not a hang)", "hung": None}
    v = verdicts(**m)
    assert v["11.zero3_peak"] == v["11.compile_ddp_speed"] == v["11.pipelining_gloo"] == "inconclusive"
    one = good()
    one["config"]["worlds"] = (1,)
    one["mem_rows"] = [r for r in one["mem_rows"] if r["world_size"] == 1]
    v = verdicts(**one)
    assert v["11.zero1_optimizer_state"] == v["11.fsdp2_state"] == v["11.zero3_peak"] == "not testable here"
    skipped = verdicts(**{**good(), "compile_result": None, "compile_contention": None})
    assert skipped["11.compile_ddp_same"] == skipped["11.compile_ddp_speed"] == "not testable here"


@pytest.mark.parametrize("busy_as", ["dict", "object"])
def test_busy_machine_gives_no_verdict_on_timings_only(busy_as):
    busy = BUSY
    if busy_as == "object":
        busy = claims.Contention()
        busy.cores, busy.load_before, busy.load_after, busy.wall_s, busy.others_share = 2, 3.0, 3.0, 5.0, 0.7
    v = verdicts(**{**good(), "ckpt_contention": busy, "compile_contention": busy})
    assert v["11.checkpointing_time"] == v["11.compile_ddp_speed"] == claims.BUSY
    assert v["11.checkpointing_memory"] == v["11.compile_ddp_same"] == "holds"  # not timings: judged anyway
    entries = claims_11(Measured11(**{**good(), "ckpt_contention": busy}))
    entry = next(e for e in entries if e["id"] == "11.checkpointing_time")
    assert entry["contention"]["busy"] is True
