"""claims_04 (notebook 04's claims, judged from its sweeps): each verdict can come out both ways, a busy sweep gives
no verdict on the timing claim, the full sweep is preferred and labelled with its machine, and every number an
evidence string quotes is recorded. Synthetic rows only: nothing is trained here."""
import pytest

from mnist_helpers.course import claims
from mnist_helpers.lessons.n04 import lesson as bs
from mnist_helpers.lessons.n04.saved import BASE_LR

QUIET = {"busy": False, "others_cpu_share": 0.01}
BUSY = {"busy": True, "others_cpu_share": 0.7}


def _row(group, opt, rule, b, acc, seed, ips=1000.0, noise=0.1, gap=0.0, epochs=10, diverged=False, lr=None):
    return {"group": group, "optimizer": opt, "rule": rule, "batch_size": b, "test_acc": acc, "seed": seed,
            "images_per_s": ips, "loss_noise": noise, "gap": gap, "diverged": diverged, "num_epochs": epochs,
            "steps": max(1, 1280 // b), "warmup_epochs": 1.0, "train_images": 1280,
            "lr": lr if lr is not None else BASE_LR[opt]}


def rows(*, seeds=(0, 1, 2), lin_4096=0.98, gap_4096=0.02, ips_4096=3000.0, adam_linear=0.90,
         sgd8=lambda s: 0.97 + 0.001 * s, adam8=lambda s: 0.97 + 0.001 * s, adam8_diverged=False, eq=None, b64=None,
         b64_diverged=False):
    """A sweep's rows; ``eq``: the base batch's accuracy at batch 4096's step count (group equal-steps), ``b64``:
    batch 64's (group batch64); None leaves the group out."""
    out = []
    for s in seeds:
        e = 0.001 * s
        if eq is not None:
            out.append(_row("equal-steps", "sgd", "fixed", 128, eq + e, s, epochs=1))
        if b64 is not None:
            out += [_row("batch64", "sgd", "fixed", 64, b64 - 0.01 + e, s, diverged=b64_diverged),
                    _row("batch64", "sgd", "linear", 64, b64 + e, s, lr=0.025, diverged=b64_diverged)]
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


def test_batch4096_is_judged_at_equal_epochs_and_at_equal_steps():
    """The article's comparison (test accuracy at equal epochs) and the same at an equal number of steps: both worse
    -> holds; only per epoch -> inconclusive (confounded); not worse per epoch -> does not hold here."""
    worse = dict(lin_4096=0.90)                                   # both rules of batch 4096 end at 90% vs 98%
    assert judged(rows(**worse, eq=0.95))["04.batch4096"]["verdict"] == "holds"     # worse per step too, and fast
    assert judged(rows(**worse, eq=0.95, ips_4096=1000.0))["04.batch4096"]["verdict"] == "holds with nuance"
    e = judged(rows(**worse, eq=0.85))["04.batch4096"]             # better at equal steps: fewer steps explain it
    assert e["verdict"] == claims.CONFOUNDED and e["numbers"]["better_at_equal_steps"]
    assert "so batch 4096 is better" in e["evidence"]
    e = judged(rows(**worse))["04.batch4096"]                       # no equal-steps run: cannot separate the two
    assert e["verdict"] == claims.CONFOUNDED and "no equal-steps run" in e["evidence"]
    assert judged(rows(lin_4096=0.98, eq=0.95))["04.batch4096"]["verdict"] == "does not hold here"  # not worse
    assert judged(rows(**worse, eq=0.95, seeds=(0,)))["04.batch4096"]["verdict"] == "inconclusive"  # one seed
    # a busy sweep: no verdict on the claim whose "fast" rests on timings (the accuracy claims keep theirs)
    v = judged(rows(**worse, eq=0.95), contention=BUSY)
    assert v["04.batch4096"]["verdict"] == claims.BUSY and v["04.batch4096"]["contention"]["busy"]
    assert v["04.adam_complicated"]["verdict"] == "holds"


def test_batch_64_to_256_both_ways():
    """Each of batch 64, 128, 256 at its better LR rule; none below the best outside the noise -> holds."""
    assert "04.batch_64_256" not in judged(rows())                 # no batch-64 run: no verdict
    e = judged(rows(b64=0.98))["04.batch_64_256"]
    assert e["verdict"] == "holds" and e["numbers"]["rules"][0] == "linear"
    assert judged(rows(b64=0.95))["04.batch_64_256"]["verdict"] == "does not hold here"       # 3 pt below
    assert judged(rows(b64=0.98, b64_diverged=True))["04.batch_64_256"]["verdict"] == "does not hold here"
    assert judged(rows(b64=0.98, seeds=(0,)))["04.batch_64_256"]["verdict"] == "inconclusive"


def test_the_full_sweep_is_preferred_and_labelled_with_its_machine():
    full = {"machine_label": "box-2core-avx2", "date": "2026-12-01T10:00:00+00:00", "config": {"model": "mlp"},
            "runs": rows(lin_4096=0.90, eq=0.85),
            "contention_by_call": [{"seeds": [0], "busy": False, "others_cpu_share": 0.1}]}
    v = judged(rows(lin_4096=0.90, eq=0.95), full=full)
    assert v["04.batch4096"]["verdict"] == claims.CONFOUNDED
    assert all("box-2core-avx2" in e["regime"] and e["evidence"].startswith("full sweep") for e in v.values())
    table = bs.claims_table(rows(lin_4096=0.90, eq=0.95), contention=QUIET, full=full)
    row = next(r for r in table if r["the article says"] == claims.CATALOG_IDS["04.batch4096"]["claim"])
    assert row["this run (reduced sweep)"] == claims.PLAIN["holds"]
    assert row["full sweep (box-2core-avx2)"] == claims.PLAIN[claims.CONFOUNDED]
    # only the calls that timed the doubling runs count for the load rule (04.batch4096's "fast")
    full["contention_by_call"].append({"seeds": [0], "groups": ["equal-steps"], "busy": True, "others_cpu_share": 0.9})
    e = judged(rows(), full=full)["04.batch4096"]
    assert e["verdict"] == claims.CONFOUNDED and not e["contention"]["busy"]
    full["contention_by_call"][0]["busy"] = True
    assert judged(rows(), full=full)["04.batch4096"]["verdict"] == claims.BUSY
