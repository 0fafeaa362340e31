"""claims_03 (notebook 03's claims, judged from its measurements): each verdict can come out both ways, a busy
machine gives no verdict on the timing claims, and every number an evidence string quotes is recorded. Synthetic
measurements only: no loader is timed here."""
import copy

import pytest

from mnist_helpers.course import claims
from mnist_helpers.lessons.n03 import lesson as lb

QUIET = {"busy": False, "others_cpu_share": 0.01}
BUSY = {"busy": True, "others_cpu_share": 0.7}


def _rows(table, key="num_workers"):
    return [{key: w, "images_per_s": sorted(reps)[len(reps) // 2], "repeats": reps} for w, reps in table]


def measurements(**over):
    m = dict(
        cores=2, repeats=3, threads=2, profile="full", cuda=False,
        loader_rows=_rows([(0, [300, 310, 305]), (1, [290, 300, 295]), (2, [280, 285, 290]), (4, [150, 140, 160])]),
        train_rows=_rows([(0, [200, 205, 210]), (1, [195, 200, 205]), (2, [180, 185, 190]), (4, [100, 110, 105])])
        + [{"num_workers": None, "images_per_s": 400.0, "repeats": [390.0, 400.0, 410.0], "loader": "in memory"}],
        pin_rows=[{"num_workers": 0, "pin off img/s": 300.0, "pin on img/s": 297.0},
                  {"num_workers": 2, "pin off img/s": 280.0, "pin on img/s": 285.0}],
        pin_warned=True,
        disk={"cold_mib_per_s": 900.0, "warm_mib_per_s": 5000.0},
        memory_rows=[{"dataset": d, "start_method": m, "copied_fraction": f, "worker_rss_mib": 300.0}
                     for d, m, f in [("torchvision", "fork", 0.02), ("tensor", "fork", 0.01), ("pylist", "fork", 0.9),
                                     ("torchvision", "spawn", 1.0)]],
        memory_images=10_000, per_sample_us=[25.0, 26.0], per_batched_us=[0.5, 0.6],
        feed_rows=[{"feed": "DataLoader, 0 workers", "images_per_s": 3000.0, "repeats": [2900.0, 3000.0, 3100.0]},
                   {"feed": "uint8 in memory", "images_per_s": 300000.0, "repeats": [290000.0, 300000.0, 310000.0]}],
        drop={"images": 60_000, "batch_size": 128, "last_batch": 96, "steps_keep": 469, "noise_ratio": 1.15,
              "expected_ratio": 1.1547, "grad_errors_full_batch": [0.50, 0.51, 0.52],
              "grad_errors_last_batch": [0.57, 0.58, 0.60]},
        drop_note="the article's 60,000",
        busy={"loader": QUIET, "train": QUIET, "pin": QUIET, "disk": QUIET, "feed": QUIET})
    m.update(over)
    return m


def judged(**over):
    out = lb.claims_03(lb.Measured03(**measurements(**over)))
    for e in out:
        assert not claims.unsourced_numbers({**e, "claim": claims.CATALOG_IDS[e["id"]]["claim"]}), e["evidence"]
    return {e["id"]: e for e in out}


def test_entries_are_the_seven_catalogued_claims(tmp_path):
    entries = lb.claims_03(lb.Measured03(**measurements()))
    assert [e["id"] for e in entries] == ["03.workers_fraction", "03.too_many_workers", "03.pin_memory_cpu",
                                          "03.disk_io", "03.worker_copies", "03.in_memory", "03.drop_last"]
    res = claims.record("03_dataloader_tuning", entries, profile="quick", folder=tmp_path)
    assert (tmp_path / "03_dataloader_tuning.json").is_file() and len(res.claims) == 7


def test_workers_fraction_is_not_testable_below_4_cores():
    """On 2 (or 3) cores 1/4 to 1/2 of the cores is one worker: the fraction cannot be tested, whatever the sweep
    says and however busy the machine was (the numbers stay as context)."""
    for cores in (2, 3):
        e = judged(cores=cores)["03.workers_fraction"]
        assert e["verdict"] == "not testable here" and "1 worker only" in e["evidence"] and "context" in e["evidence"]
    assert judged(busy={**measurements()["busy"], "train": BUSY})["03.workers_fraction"]["verdict"] \
        == "not testable here"


def test_workers_fraction_uses_plain_thresholds_on_the_training_sweep():
    """From 4 cores (range 1-2 workers): the training sweep's thresholds decide."""
    assert judged(cores=4)["03.workers_fraction"]["verdict"] == "holds"          # 1 worker: 200 of 205 img/s
    half = _rows([(0, [400, 410, 405]), (1, [200, 205, 210]), (4, [100, 110, 105])])
    e = judged(cores=4, train_rows=half + [measurements()["train_rows"][-1]])["03.workers_fraction"]
    assert e["verdict"] == "does not hold here" and e["numbers"]["train_rule_ratio"] == pytest.approx(205 / 405)
    between = _rows([(0, [250, 255, 260]), (1, [200, 205, 210]), (4, [100, 110, 105])])   # 80%: neither
    assert judged(cores=4, train_rows=between + [measurements()["train_rows"][-1]])["03.workers_fraction"]["verdict"] \
        == "inconclusive"
    assert judged(cores=4, busy={**measurements()["busy"], "train": BUSY})["03.workers_fraction"]["verdict"] \
        == claims.BUSY


def test_too_many_workers_both_ways_and_busy():
    assert judged()["03.too_many_workers"]["verdict"] == "holds"
    same = _rows([(0, [300, 310, 305]), (1, [290, 300, 295]), (4, [298, 312, 300])])
    tsame = _rows([(0, [200, 205, 210]), (1, [195, 200, 205]), (4, [199, 204, 206])])
    e = judged(loader_rows=same, train_rows=tsame + [measurements()["train_rows"][-1]])["03.too_many_workers"]
    assert e["verdict"] == "does not hold here"
    assert judged(busy={**measurements()["busy"], "loader": BUSY})["03.too_many_workers"]["verdict"] == claims.BUSY


def test_pin_memory_is_demonstrated_by_the_warning_and_untestable_with_a_gpu():
    assert judged()["03.pin_memory_cpu"]["verdict"] == "demonstrated"
    assert judged(pin_warned=False)["03.pin_memory_cpu"]["verdict"] == "inconclusive"
    e = judged(cuda=True, pin_warned=False)["03.pin_memory_cpu"]
    assert e["verdict"] == "not testable here" and "context" in e["evidence"]


def test_disk_io_both_ways_and_busy():
    assert judged()["03.disk_io"]["verdict"] == "does not hold here"
    assert judged(disk={"cold_mib_per_s": 0.1, "warm_mib_per_s": 1.0})["03.disk_io"]["verdict"] == "holds"
    assert judged(busy={**measurements()["busy"], "disk": BUSY})["03.disk_io"]["verdict"] == claims.BUSY


def test_worker_copies_both_ways():
    assert judged()["03.worker_copies"]["verdict"] == "holds with nuance"   # fork shares, spawn copies
    rows = copy.deepcopy(measurements()["memory_rows"])
    for r in rows:
        r["copied_fraction"] = 0.02
    assert judged(memory_rows=rows)["03.worker_copies"]["verdict"] == "wrong"
    for r in rows:
        r["copied_fraction"] = 0.95
    assert judged(memory_rows=rows)["03.worker_copies"]["verdict"] == "holds"


def test_in_memory_both_ways_and_busy():
    assert judged()["03.in_memory"]["verdict"] == "holds"
    slow = [dict(r) for r in measurements()["feed_rows"]]
    slow[1].update(images_per_s=3000.0, repeats=[2950.0, 3000.0, 3050.0])
    assert judged(feed_rows=slow)["03.in_memory"]["verdict"] == "does not hold here"
    assert judged(repeats=1)["03.in_memory"]["verdict"] == "inconclusive"
    assert judged(busy={**measurements()["busy"], "feed": BUSY})["03.in_memory"]["verdict"] == claims.BUSY


def test_drop_last_follows_the_measured_noise_ratio():
    """Worth dropping from 2x at the low end of the draws' quartile bounds; negligible below 2x at their high end;
    inconclusive when the bounds straddle 2x; nothing to drop without a last batch."""
    e = judged()["03.drop_last"]       # the article's 96-image tail: 1.15x noisier, one step in 469
    assert e["verdict"] == "holds with nuance" and "negligible here" in e["evidence"]
    assert "1 step of 469" in e["evidence"] and "60,000" in e["regime"] and e["numbers"]["ratio_high"] < 2
    big = {**measurements()["drop"], "images": 10_000, "last_batch": 16, "steps_keep": 79, "noise_ratio": 2.9,
           "expected_ratio": 2.83, "grad_errors_last_batch": [1.4, 1.5, 1.6]}
    e = judged(drop=big)["03.drop_last"]
    assert e["verdict"] == "holds" and "worth dropping" in e["evidence"]
    close = {**measurements()["drop"], "noise_ratio": 1.02, "grad_errors_last_batch": [0.49, 0.52, 0.53]}
    assert judged(drop=close)["03.drop_last"]["verdict"] == "holds with nuance"   # overlapping, yet resolved below 2x
    wide = {**measurements()["drop"], "noise_ratio": 1.9, "grad_errors_last_batch": [0.6, 1.0, 1.4]}
    e = judged(drop=wide)["03.drop_last"]
    assert e["verdict"] == "inconclusive" and e["numbers"]["ratio_low"] < 2 < e["numbers"]["ratio_high"]
    none = {**measurements()["drop"], "last_batch": 0, "noise_ratio": float("nan"), "grad_errors_last_batch": []}
    assert judged(drop=none)["03.drop_last"]["verdict"] == "not testable here"


def test_a_kept_entry_is_judged_again_from_its_numbers():
    """rejudge: today's rule from the entry's own numbers (a rule-2 entry had no batch_size); the regime stays."""
    for e in lb.claims_03(lb.Measured03(**measurements())):
        if e["id"] in ("03.workers_fraction", "03.drop_last"):
            kept = {**e, "verdict": "inconclusive", "evidence": "old", "rule": 2,
                    "claim": claims.CATALOG_IDS[e["id"]]["claim"]}
            kept["numbers"] = {k: v for k, v in e["numbers"].items() if k not in ("batch_size", "ratio_low",
                                                                                  "ratio_high")}
            again = lb.rejudge(kept)
            assert (again["verdict"], again["evidence"], again["regime"]) == (e["verdict"], e["evidence"], e["regime"])
            assert again["rule"] == claims.rule(e["id"]) and not claims.unsourced_numbers(again)
    with pytest.raises(ValueError, match="judges"):
        lb.rejudge({"id": "03.disk_io", "numbers": {}})


def test_the_committed_entries_are_what_todays_rule_gives_their_numbers():
    """A kept reference judged by the current rule (it records the rule's number) is what rejudge gives its own
    numbers: a change to the rule without re-judging the kept files (or raising claims.RULES) fails here."""
    import json

    from mnist_helpers.paths import reference_dir
    for path in sorted(reference_dir().glob("*/03_*.json")):
        for c in json.loads(path.read_text()).get("claims", []):
            if c["id"] in ("03.workers_fraction", "03.drop_last") and c.get("rule", 1) == claims.rule(c["id"]):
                assert lb.rejudge(c) == c, path
