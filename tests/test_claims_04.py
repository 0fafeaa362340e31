"""claims_04 (notebook 04's claims, judged from its sweeps): each verdict can come out both ways, a busy sweep gives
no verdict on the timing claim, the full sweep is preferred and labelled with its machine, and every number an
evidence string quotes is recorded. Synthetic rows only: nothing is trained here."""
import pytest

from mnist_helpers import claims
from mnist_helpers.lessons import l04_batch_scaling as bs

QUIET = {"busy": False, "others_cpu_share": 0.01}
BUSY = {"busy": True, "others_cpu_share": 0.7}


def _row(group, opt, rule, b, acc, seed, ips=1000.0, noise=0.1, gap=0.0, epochs=10, diverged=False, lr=None):
    return {"group": group, "optimizer": opt, "rule": rule, "batch_size": b, "test_acc": acc, "seed": seed,
            "images_per_s": ips, "loss_noise": noise, "gap": gap, "diverged": diverged, "num_epochs": epochs,
            "steps": max(1, 1280 // b), "warmup_epochs": 1.0, "train_images": 1280,
            "lr": lr if lr is not None else bs.BASE_LR[opt]}


def rows(*, seeds=(0, 1, 2), lin_4096=0.98, gap_4096=0.02, ips_4096=3000.0, adam_linear=0.90,
         sgd8=lambda s: 0.97 + 0.001 * s, adam8=lambda s: 0.97 + 0.001 * s, adam8_diverged=False):
    out = []
    for s in seeds:
        e = 0.001 * s
        out += [_row("doubling", "sgd", "fixed", 128, 0.98 + e, s, gap=0.01 + e / 10),
                _row("doubling", "sgd", "fixed", 256, 0.96 + e, s, 1500),
                _row("doubling", "sgd", "linear+warmup", 256, 0.98 + e, s, 1500),
                _row("doubling", "sgd", "fixed", 4096, 0.90 + e, s, ips_4096, gap=gap_4096 + e / 10),
                _row("doubling", "sgd", "linear+warmup", 4096, lin_4096 + e, s, ips_4096, gap=gap_4096 + e / 10),
                _row("adam", "adam", "fixed", 128, 0.98 + e, s), _row("adam", "adam", "fixed", 2048, 0.95 + e, s),
                _row("adam", "adam", "linear", 2048, adam_linear + e, s), _row("adam", "adam", "sqrt", 2048, 0.95 + e, s),
                _row("batch8", "sgd", "fixed", 8, sgd8(s), s, noise=0.7, epochs=1),
                _row("batch8", "sgd", "fixed", 128, 0.97 + e, s, noise=0.2, epochs=1),
                _row("batch8", "adam", "fixed", 8, adam8(s), s, noise=0.8, epochs=1, diverged=adam8_diverged),
                _row("batch8", "adam", "fixed", 128, 0.97 + e, s, noise=0.2, epochs=1)]
    return out


def judged(rs, contention=QUIET, full=None):
    out = bs.claims_04(rs, contention=contention, full=full)
    for e in out:
        assert not claims.unsourced_numbers({**e, "claim": claims.CATALOG_IDS[e["id"]]["claim"]}), e["evidence"]
    return {e["id"]: e for e in out}


def test_entries_are_result_file_claims_with_sourced_numbers(tmp_path):
    entries = bs.claims_04(rows(), contention=QUIET)
    assert [e["id"] for e in entries] == ["04.double_batch_double_lr", "04.adam_complicated", "04.batch8_unstable",
                                          "04.batch4096"]
    res = claims.record("04_batch_size_and_lr", entries, profile="quick", folder=tmp_path,
                        extra=bs.sweep_record(rows(), QUIET, 1.0))
    assert (tmp_path / "04_batch_size_and_lr.json").is_file() and "reduced_sweep" in res.extra
    assert all(e["regime"].startswith("reduced sweep") for e in res.claims.values())


def test_double_batch_double_lr_both_ways():
    assert judged(rows(lin_4096=0.98))["04.double_batch_double_lr"]["verdict"] == "holds"
    assert judged(rows(lin_4096=0.90))["04.double_batch_double_lr"]["verdict"] == "holds with nuance"
    assert judged(rows(seeds=(0,)))["04.double_batch_double_lr"]["verdict"] == "inconclusive"


def test_adam_complicated_both_ways():
    assert judged(rows(adam_linear=0.90))["04.adam_complicated"]["verdict"] == "holds"
    assert judged(rows(adam_linear=0.97))["04.adam_complicated"]["verdict"] == "does not hold here"


def test_batch8_is_judged_on_divergence_and_seed_scatter_not_on_step_noise():
    # noisier steps at batch 8 (0.7-0.8 vs 0.2) but the seeds agree and nothing diverged: not unstable
    e = judged(rows())["04.batch8_unstable"]
    assert e["verdict"] == "does not hold here" and e["numbers"]["adam_noise"] > e["numbers"]["adam_base_noise"]
    # SGD at its unscaled LR scatters across seeds, Adam does not: only the nuance, and the evidence names SGD
    e = judged(rows(sgd8=lambda s: (0.30, 0.10, 0.50)[s]))["04.batch8_unstable"]
    assert e["verdict"] == "holds with nuance" and e["numbers"]["sgd_unstable"] and not e["numbers"]["adam_unstable"]
    assert "SGD (LR 0.05 unscaled" in e["evidence"] and "Adam (LR 0.001" in e["evidence"]
    # Adam (the article's optimizer) diverging: holds, even with one seed
    e = judged(rows(seeds=(0,), adam8_diverged=True))["04.batch8_unstable"]
    assert e["verdict"] == "holds" and e["numbers"]["adam_diverged"] == 1
    assert judged(rows(seeds=(0,)))["04.batch8_unstable"]["verdict"] == "inconclusive"
    # which end is better is reported, whichever way it goes
    e = judged(rows(adam8=lambda s: 0.99 + 0.001 * s))["04.batch8_unstable"]
    assert "batch 8 ends better" in e["evidence"]


def test_batch4096_is_judged_on_the_train_test_gap():
    assert judged(rows(gap_4096=0.02))["04.batch4096"]["verdict"] == "holds"            # fast, wider gap
    e = judged(rows(gap_4096=0.001))["04.batch4096"]                                     # lower acc, gap shrinks
    assert e["verdict"] == "does not hold here" and e["numbers"]["narrower_gap"] and "(narrower)" in e["evidence"]
    assert "no equal-steps run" in e["evidence"]
    assert judged(rows(gap_4096=0.02, ips_4096=1000.0))["04.batch4096"]["verdict"] == "holds with nuance"  # not fast
    assert judged(rows(gap_4096=0.0105))["04.batch4096"]["verdict"] == "inconclusive"  # gaps overlap
    # a busy sweep: no verdict on the timing claim (the accuracy claims keep theirs)
    v = judged(rows(gap_4096=0.02), contention=BUSY)
    assert v["04.batch4096"]["verdict"] == claims.BUSY and v["04.batch4096"]["contention"]["busy"]
    assert v["04.adam_complicated"]["verdict"] == "holds"


def test_the_full_sweep_is_preferred_and_labelled_with_its_machine():
    full = {"machine_label": "box-2core-avx2", "date": "2026-12-01T10:00:00+00:00", "config": {"model": "mlp"},
            "runs": rows(gap_4096=0.001), "contention_by_call": [{"seeds": [0], "busy": False, "others_cpu_share": 0.1}]}
    v = judged(rows(gap_4096=0.02), full=full)
    assert v["04.batch4096"]["verdict"] == "does not hold here"
    assert all("box-2core-avx2" in e["regime"] and e["evidence"].startswith("full sweep") for e in v.values())
    table = bs.claims_table(rows(gap_4096=0.02), contention=QUIET, full=full)
    row = next(r for r in table if r["the article says"] == claims.CATALOG_IDS["04.batch4096"]["claim"])
    assert row["this run (reduced sweep)"] == claims.PLAIN["holds"]
    assert row["full sweep (box-2core-avx2)"] == claims.PLAIN["does not hold here"]
    full["contention_by_call"][0]["busy"] = True
    assert judged(rows(), full=full)["04.batch4096"]["verdict"] == "does not hold here"  # the gap decides first
    full["runs"] = rows(gap_4096=0.02)
    assert judged(rows(), full=full)["04.batch4096"]["verdict"] == claims.BUSY
