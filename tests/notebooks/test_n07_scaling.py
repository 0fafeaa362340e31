"""Scaling sweeps, the AllReduce micro-benchmark and DDP communication settings (notebook 07)."""
import pytest

from mnist_helpers.lessons.n07 import scaling  # the core harness: the sweeps call its measure_step
from mnist_helpers.lessons.n07 import lesson as l07
from mnist_helpers.workers.bench.allreduce import parse_variants

pytestmark = pytest.mark.timeout(180)


def test_ring_model():
    assert scaling.ring_model(1000, 1)["bytes_per_rank"] == 0
    assert scaling.ring_model(1000, 2)["bytes_per_rank"] == 1000
    m = scaling.ring_model(1000, 8, alpha_s=1e-5, link_bytes_per_s=1e9)
    assert m["bytes_per_rank"] == pytest.approx(1750) and m["steps"] == 14
    assert m["seconds"] == pytest.approx(14e-5 + 1750 / 1e9)
    with pytest.raises(ValueError, match="world_size"):
        scaling.ring_model(10, 0)


def test_ring_volume_verdict_reads_the_sentence_both_ways():
    """Per-rank bytes grow by 2(N-1)/N (flat), total bytes and steps by N-1 (linear): "holds with nuance"."""
    v = scaling.ring_volume_verdict((2, 64))
    assert v["per_rank_bytes_growth"] == pytest.approx((2 * 63 / 64) / 1.0)
    assert v["total_bytes_growth"] == pytest.approx(63) and v["steps_growth"] == pytest.approx(63)
    assert v["verdict"] == "holds with nuance"
    assert scaling.ring_volume_verdict((2, 4))["verdict"] == "holds with nuance"  # 1.5x per rank, 3x in total
    with pytest.raises(ValueError, match=">= 2"):
        scaling.ring_volume_verdict((1, 4))


def test_measured_growth_from_rows():
    rows = [{"world_size": n, "bytes": b, "latency_us": t} for n, b, t in
            [(2, 4096, 100.0), (2, 1 << 20, 1000.0), (4, 4096, 300.0), (4, 1 << 20, 1500.0)]]
    g = scaling.measured_growth(rows)
    assert g["small_time_growth"] == pytest.approx(3.0) and g["big_time_growth"] == pytest.approx(1.5)
    assert g["model_steps_growth"] == pytest.approx(3.0) and g["model_per_rank_bytes_growth"] == pytest.approx(1.5)


def test_verdicts_read_the_spread():
    """Verdicts come from the quartiles of the repeats and can come out every way, inconclusive included."""
    assert scaling.speedup_verdict([1.75, 1.8, 1.85]) == "holds"
    assert scaling.speedup_verdict([1.2, 1.3, 1.25]) == "does not hold here"
    assert scaling.speedup_verdict([1.95, 2.0, 1.98]) == "holds with nuance"
    assert scaling.speedup_verdict([1.4, 1.8, 2.2, 1.6]) == "inconclusive"
    assert scaling.comm_verdict([0.01, 0.02, 0.03]) == "holds"
    assert scaling.comm_verdict([0.2, 0.1, 0.3]) == "does not hold here"
    assert scaling.comm_verdict([0.02, 0.04, 0.06, 0.08]) == "inconclusive"
    row = {"step_s_all": [1.0, 2.0], "no_sync_step_s_all": [0.9, 1.9]}
    assert scaling.comm_fractions(row) == pytest.approx([0.1, 0.05])
    assert scaling.comm_fractions({**row, "comm_fractions": [0.3]}) == [0.3]


def test_parse_variants_and_bad_input():
    assert parse_variants("25:none,1:fp16") == [(25.0, "none"), (1.0, "fp16")]
    for bad in ("25", "x:none", "25:zip", "0:none"):
        with pytest.raises(ValueError, match="variant"):
            parse_variants(bad)
    with pytest.raises(ValueError, match="world_sizes"):
        scaling.allreduce_sweep([1024], world_sizes=[1])
    with pytest.raises(ValueError, match="divide"):
        scaling.strong_scaling([1, 3], global_batch_size=128)
    with pytest.raises(ValueError, match="nproc"):
        scaling.measure_step(0, 64)


def test_sweep_arithmetic(monkeypatch):
    """Speedup and efficiency from fake measurements: 2 processes at 1.8x the images/s of one."""
    def fake(nproc, batch_size, **kw):
        return {"images_per_s": 100.0 * (1.8 if nproc == 2 else 1), "step_s": batch_size * nproc / 100.0,
                "comm_fraction": 0.1 * (nproc - 1), "backend": "gloo", "device": "cpu"}

    monkeypatch.setattr(scaling, "measure_step", fake)
    weak = scaling.weak_scaling([1, 2], batch_size=128, rounds=2)
    assert [r["global_batch_size"] for r in weak] == [128, 256]
    assert weak[1]["speedup"] == pytest.approx(1.8) and weak[1]["efficiency"] == pytest.approx(0.9)
    calls = []
    monkeypatch.setattr(scaling, "measure_step", lambda n, b, **kw: calls.append((n, b)) or fake(n, b))
    strong = scaling.strong_scaling([1, 2], global_batch_size=128, reuse=weak)
    assert [r["batch_size"] for r in strong] == [128, 64]
    assert calls == [(2, 64)]  # 1 x 128 came from the weak sweep
    assert strong[0]["images_per_s"] == weak[0]["images_per_s"]
    assert scaling.round_ratios(weak, 2) == pytest.approx([1.8, 1.8])
    assert scaling.speedup_verdict(scaling.round_ratios(weak, 2)) == "inconclusive"  # 2 rounds: too few to judge
    assert scaling.speedup_verdict(scaling.round_ratios(weak, 2) * 2) == "holds"


def test_article_comparison_pairs_rounds(monkeypatch):
    """The article's comparison: points alternate per round, each round's ratio from its own pair."""
    with pytest.raises(ValueError, match="epochs"):
        l07.loader_run(1, 128, epochs=1)
    calls = []

    def fake(n, b, *, num_workers, **kw):
        calls.append((n, b, num_workers))
        return {"world_size": n, "batch_size": b, "global_batch_size": n * b, "num_workers": num_workers,
                "epoch_s": 1.0, "images_per_s": 100.0 * (1.5 if n == 2 else 1) * (1 + len(calls) / 100),
                "test_acc": 0.9, "backend": "gloo", "device": "cpu"}

    monkeypatch.setattr(l07, "loader_run", fake)
    rows = l07.article_comparison({"1 x 128": (1, 128, 4), "2 x 64": (2, 64, 4)}, rounds=2)
    assert calls == [(1, 128, 4), (2, 64, 4), (1, 128, 4), (2, 64, 4)]
    ratios = l07.paired_ratios(rows, "2 x 64", "1 x 128")
    assert ratios == pytest.approx([1.5 * 1.02 / 1.01, 1.5 * 1.04 / 1.03])


@pytest.mark.process
def test_allreduce_sweep_rows_and_ring_columns():
    rows = scaling.allreduce_sweep([4096, 1 << 20], world_sizes=[2], iters=3, repeats=2, warmup=1)
    assert [(r["world_size"], r["bytes"]) for r in rows] == [(2, 4096), (2, 1 << 20)]
    assert all(r["latency_us"] > 0 and r["backend"] == "gloo" for r in rows)
    assert rows[0]["busbw_gbps"] == pytest.approx(rows[0]["algbw_gbps"])  # 2(N-1)/N = 1 for N = 2
    growth = scaling.latency_growth(rows + [{**rows[1], "world_size": 4, "ring_factor": 1.5}])
    assert [g["ring_bytes_vs_first"] for g in growth] == [1.0, 1.5]


@pytest.mark.process
def test_ddp_variants_measure_step_and_communication():
    rows = scaling.ddp_variants([(25, "none"), (25, "fp16")], model="fastnet", batch_size=32,
                                steps=1, repeats=2, warmup=1)
    assert [(r["bucket_cap_mb"], r["hook"]) for r in rows] == [(25.0, "none"), (25.0, "fp16")]
    for r in rows:
        assert r["world_size"] == 2 and r["global_batch_size"] == 64
        assert 0 <= r["comm_fraction"] < 1 and r["step_s"] > 0 and r["no_sync_step_s"] > 0


@pytest.mark.process
def test_ddp_memory_shows_the_bucket_copy_and_the_view_removes_it():
    """DDP keeps a gradient-sized copy in its buckets; gradient_as_bucket_view=True removes it (memory, not speed)."""
    from mnist_helpers.memory import run_isolated

    rows = run_isolated(l07.ddp_memory, model="fastnet", batch_sizes=[16])["result"]
    assert [r["variant"] for r in rows] == ["one process", "DDP", "DDP, gradient_as_bucket_view"]
    one, ddp, view = rows
    copy = ddp["persistent_mib"] - one["persistent_mib"]
    assert copy > 0.1, rows  # the bucket copy: the gradients' size again (fastnet's)
    # the view removes it; a few bytes of bookkeeping may differ (24 bytes once, in a parallel `make test`)
    assert view["persistent_mib"] == pytest.approx(one["persistent_mib"], abs=1e-3), rows
    v = l07.memory_verdict(rows, 16)
    assert v["verdict"] in ("holds", "holds with nuance", "does not hold here") and v["ratio"] > 1
