"""Scaling sweeps, the AllReduce micro-benchmark and DDP communication settings (notebook 07)."""
import pytest

from mnist_helpers.lessons import l07_scaling as scaling
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


def test_ring_volume_verdict_is_computed_from_the_model():
    v = scaling.ring_volume_verdict((2, 64))
    assert v["per_rank_bytes_growth"] == pytest.approx((2 * 63 / 64) / 1.0)
    assert v["verdict"].startswith("does not hold")
    assert scaling.ring_volume_verdict((2, 4))["verdict"].startswith("does not hold")  # 1.5x, not 2x


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
    assert scaling.speedup_verdict(1.8) == "holds" and scaling.speedup_verdict(1.2).startswith("does not hold")
    assert scaling.comm_verdict(0.01) == "holds" and scaling.comm_verdict(0.2).startswith("does not hold")


def test_allreduce_sweep_rows_and_ring_columns():
    rows = scaling.allreduce_sweep([4096, 1 << 20], world_sizes=[2], iters=3, repeats=2, warmup=1)
    assert [(r["world_size"], r["bytes"]) for r in rows] == [(2, 4096), (2, 1 << 20)]
    assert all(r["latency_us"] > 0 and r["backend"] == "gloo" for r in rows)
    assert rows[0]["busbw_gbps"] == pytest.approx(rows[0]["algbw_gbps"])  # 2(N-1)/N = 1 for N = 2
    growth = scaling.latency_growth(rows + [{**rows[1], "world_size": 4, "ring_factor": 1.5}])
    assert [g["ring_bytes_vs_first"] for g in growth] == [1.0, 1.5]


def test_ddp_variants_measure_step_and_communication():
    rows = scaling.ddp_variants([(25, "none"), (25, "fp16")], model="fastnet", batch_size=32,
                                steps=1, repeats=2, warmup=1)
    assert [(r["bucket_cap_mb"], r["hook"]) for r in rows] == [(25.0, "none"), (25.0, "fp16")]
    for r in rows:
        assert r["world_size"] == 2 and r["global_batch_size"] == 64
        assert 0 <= r["comm_fraction"] < 1 and r["step_s"] > 0 and r["no_sync_step_s"] > 0
