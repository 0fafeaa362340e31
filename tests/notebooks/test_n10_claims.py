"""Notebook 10's claims under the fixed-schedule protocol, judged by ``l10.claims_10`` (lessons/n10/lesson.py) from synthetic runs
(no training): both targets can come out either way (the mean final accuracy, the ratio to the article's recipe,
the number of seeds), the quick profile never judges, a busy machine gets no verdict, and every number an evidence
string quotes is among that claim's numbers."""
from __future__ import annotations

from mnist_helpers.course import claims
from mnist_helpers.lessons.n10.lesson import claims_10

HYP = {"model": "speednet_s2", "width": 12, "batch_size": 64, "num_epochs": 0.6, "translate": 0, "tta": 1}
QUIET = {"others_cpu_share": 0.02, "max_run_share": 0.05, "load_avg_max": 1.1, "cores": 2, "wall_s": 90.0, "runs": 6,
         "busy": False}


def runs(accs, times):
    return [{"final_acc": a, "train_s": t} for a, t in zip(accs, times)]


def record(acc99=0.9912, t99=1.4, acc995=0.9953, t995=11.0, article_s=(120.0, 121.0), seeds=10, quick=False,
           contention=QUIET):
    wobble = [(-1) ** i * 0.0002 for i in range(seeds)]
    return {"runs": {"fast": runs([acc99 + w for w in wobble], [t99 + w for w in wobble]),
                     "fast995": runs([acc995 + w for w in wobble], [t995 + 10 * w for w in wobble]),
                     "article": runs([0.985] * len(article_s), article_s)},
            "targets": (0.99, 0.995), "quick": quick, "contention": contention, "hyp": HYP,
            "hyp_995": {**HYP, "width": 16, "num_epochs": 3.0, "translate": 1},
            "settings": {"amp": "bf16", "channels_last": True, "compile": True}, "subset": None, "device": "cpu",
            "threads": 2}


def verdicts(rec):
    entries = claims_10(rec)
    for e in entries:
        assert e["id"] in claims.CATALOG_IDS and e["verdict"] in claims.VERDICTS
        full = {**e, **{k: claims.CATALOG_IDS[e["id"]][k] for k in ("claim", "section")}}
        assert claims.unsourced_numbers(full) == [], (e["id"], e["evidence"])
    return {e["id"]: e["verdict"] for e in entries}


def test_both_targets_hold_on_fast_accurate_seeds():
    assert verdicts(record()) == {"10.speedrun_99": "holds", "10.speedrun_995": "holds"}


def test_a_mean_under_the_target_fails_however_fast():
    v = verdicts(record(acc99=0.9895, acc995=0.9948))
    assert v == {"10.speedrun_99": "does not hold here", "10.speedrun_995": "does not hold here"}


def test_too_slow_for_the_ratio_fails():
    # 2 s is 60x the article's 120 s: short of 80x; 15 s is 8x: short of 10x
    v = verdicts(record(t99=2.0, t995=15.0))
    assert v == {"10.speedrun_99": "does not hold here", "10.speedrun_995": "does not hold here"}


def test_few_seeds_or_a_ratio_interval_across_the_target_is_inconclusive():
    assert set(verdicts(record(seeds=3)).values()) == {"inconclusive"}
    # the article's two times spread so wide that 80x lies inside the ratio's interval
    assert verdicts(record(article_s=(90.0, 150.0)))["10.speedrun_99"] == "inconclusive"


def test_quick_profile_and_busy_machine_give_no_judgement():
    assert set(verdicts(record(quick=True)).values()) == {"inconclusive"}
    busy = {**QUIET, "others_cpu_share": 0.6, "busy": True}
    assert set(verdicts(record(contention=busy)).values()) == {claims.BUSY}


def test_record_accepts_the_entries(tmp_path):
    res = claims.record("10_speedrun", claims_10(record()), profile="full", folder=tmp_path)
    assert [c["id"] for c in res.claims.values()] == ["10.speedrun_99", "10.speedrun_995"]
    assert "fixed in advance" in res.claims["10.speedrun_99"]["regime"]
    assert res.claims["10.speedrun_99"]["rule"] == 2  # rule 1 was the first crossing
