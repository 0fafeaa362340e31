"""Notebook 07's claims, judged by ``l07.claims_07`` (lessons/n07/lesson.py) from synthetic measurements (no launch, no training):
the GPU claims are "not testable here" on a CPU (their CPU numbers kept as context) and judged both ways on GPUs,
timings on a busy machine get no verdict, the new rows (7.2's sampler, MPI, cuda:N, mixed GPUs) come out both ways,
and every number an evidence string quotes is among that claim's numbers."""
from __future__ import annotations

import pytest

from mnist_helpers.course import claims
from mnist_helpers.lessons.n07 import scaling
from mnist_helpers.lessons.n07 import lesson as l07
from mnist_helpers.lessons.n07.lesson import Measured07, claims_07

QUIET = {"others_cpu_share": 0.02, "load_avg_before": 0.4, "load_avg_after": 0.5, "cores": 2, "wall_s": 60.0,
         "busy": False}
BUSY = {**QUIET, "others_cpu_share": 0.5, "busy": True}
GPU_IDS = ("07.two_gpu_speedup", "07.comm_negligible", "07.workers_4_to_8", "07.per_gpu_memory")


def memory(device, one128=40.0, ddp64=38.0):
    rows = []
    for b, one in ((128, one128), (64, one128 * 0.55)):
        rows += [{"variant": "one process", "batch_size": b, "device": device, "peak_mib": one, "persistent_mib": 15.0},
                 {"variant": "DDP", "batch_size": b, "device": device,
                  "peak_mib": ddp64 if b == 64 else one + 4.6, "persistent_mib": 19.6},
                 {"variant": "DDP, gradient_as_bucket_view", "batch_size": b, "device": device,
                  "peak_mib": (ddp64 if b == 64 else one + 4.6) - 4.6, "persistent_mib": 15.0}]
    return rows


def shards(shuffle_overlap=1000, sampler_overlap=0, own_overlap=0):
    return [{"loader": name, "world_size": 2, "images": 1000, "per_rank": [1000 if name == "shuffle=True" else 500] * 2,
             "seen_by_several": o, "covered": 1000}
            for name, o in (("shuffle=True", shuffle_overlap), ("DistributedSampler", sampler_overlap),
                            ("own shard, shuffle=True", own_overlap))]


def measurements(gpus: int, speedup=1.8, comm=0.02, w8=1.10, rounds=5) -> dict:
    """What the notebook would pass on a machine with ``gpus`` GPUs, the article's claims holding by default."""
    one = [1000.0 + 10 * i for i in range(rounds)]
    return dict(
        plan=l07.plan(gpus, 16, quick=False), gpu_names=["NVIDIA H100"] * gpus, model="net", batch=128,
        article=dict(subset=7680, epochs=2, workers=4, rounds=rounds),
        article_rows=[{"label": "1 x 128", "images_per_s_runs": one},
                      {"label": "2 x 64", "images_per_s_runs": [x * (speedup + 0.01 * (i % 2)) for i, x in enumerate(one)]},
                      {"label": "1 x 128, 8 workers", "images_per_s_runs": [x * w8 for x in one]}],
        article_contention=QUIET,
        strong=[{"world_size": 1, "comm_fractions": [0.0] * 5}, {"world_size": 2, "comm_fractions": [comm] * 10}],
        weak=[{"world_size": 1, "comm_fractions": [0.0] * 5},
              {"world_size": 2, "comm_fractions": [comm * 0.5 + 0.001 * i for i in range(10)]}],
        sweep_contention=QUIET, timing=dict(repeats=5, rounds=2),
        allreduce_rows=[{"backend": "gloo", "device": "cpu"}], allreduce_sizes=[4096, 1 << 20],
        allreduce_contention=QUIET, ring=scaling.ring_growth((2, 64)),
        growth={"n_min": 2, "n_max": 4, "small_bytes": 4096, "big_bytes": 1 << 20, "small_time_growth": 2.7,
                "big_time_growth": 1.6, "model_steps_growth": 3.0, "model_per_rank_bytes_growth": 1.5,
                "linear_would_be": 2.0},
        memory_rows=memory("cuda" if gpus else "cpu"), shards=shards(),
        mpi={"available": False, "ran": None, "error": None},
        cuda_index=l07.cuda_index_probe(gpus) if gpus < 2 else {"gpus": gpus, "ran": True, "indices": [0, 1, 1],
                                                                     "error": None},
        cores=16)


def verdicts(**kw) -> dict:
    entries = claims_07(Measured07(**kw))
    for e in entries:
        assert e["verdict"] in claims.VERDICTS, e
        assert claims.unsourced_numbers({**e, "claim": claims.CATALOG_IDS[e["id"]]["claim"],
                                         "section": claims.CATALOG_IDS[e["id"]]["section"]}) == [], (e["id"], e["evidence"])
    return {e["id"]: e["verdict"] for e in entries}


def test_every_id_is_catalogued_and_record_accepts_the_entries(tmp_path):
    entries = claims_07(Measured07(**measurements(0)))
    assert all(e["id"] in claims.CATALOG_IDS for e in entries)
    assert {e["id"] for e in entries} == {c["id"] for c in claims.CATALOG if c["id"].startswith("07.")}
    res = claims.record("07_scaling_and_multinode", entries, profile="quick", folder=tmp_path)
    assert (tmp_path / "07_scaling_and_multinode.json").is_file() and len(res.claims) == len(entries)


def test_gpu_claims_are_not_testable_on_a_cpu_and_keep_the_cpu_numbers_as_context():
    kw = measurements(0, speedup=1.2, comm=0.3, w8=0.8)  # numbers that would judge "does not hold" on GPUs
    v = verdicts(**kw)
    assert all(v[i] == "not testable here" for i in GPU_IDS), v
    by_id = {e["id"]: e for e in claims_07(Measured07(**kw))}
    assert "for context" in by_id["07.two_gpu_speedup"]["evidence"]
    assert by_id["07.two_gpu_speedup"]["numbers"]["speedup_median"] == pytest.approx(1.205, abs=0.01)
    assert "2 x 128 (global 256" in by_id["07.comm_negligible"]["evidence"]  # both of the article's settings, labelled
    assert "2 x 64 (global 128" in by_id["07.comm_negligible"]["evidence"]
    # one GPU is not two: still not testable (memory is, with a GPU)
    one = verdicts(**measurements(1, speedup=1.2))
    assert one["07.two_gpu_speedup"] == "not testable here" and one["07.per_gpu_memory"] == "holds"


def test_gpu_claims_are_judged_both_ways_on_two_gpus():
    good = verdicts(**measurements(2))
    assert all(good[i] == "holds" for i in GPU_IDS), good
    bad = measurements(2, speedup=1.3, comm=0.2, w8=0.9)
    bad["memory_rows"] = memory("cuda", one128=40.0, ddp64=25.0)  # each GPU at 64 holds far less than one at 128
    v = verdicts(**bad)
    assert all(v[i] == "does not hold here" for i in GPU_IDS), v
    assert verdicts(**measurements(2, speedup=2.0))["07.two_gpu_speedup"] == "holds with nuance"


def test_too_few_rounds_or_a_straddling_spread_is_inconclusive():
    assert verdicts(**measurements(2, rounds=2))["07.two_gpu_speedup"] == "inconclusive"
    kw = measurements(2)
    kw["article_rows"][1]["images_per_s_runs"][0] *= 1.5 / 1.8  # one round at 1.5x: the range straddles 1.7
    assert verdicts(**kw)["07.two_gpu_speedup"] == "inconclusive"
    kw = measurements(2, comm=0.05)
    assert verdicts(**kw)["07.comm_negligible"] == "inconclusive"
    # the section-4 setting (2 x 128) negligible, the 5.4 setting (2 x 64) not: not negligible overall
    kw = measurements(2, comm=0.2)
    kw["weak"][1]["comm_fractions"] = [0.01] * 10
    assert verdicts(**kw)["07.comm_negligible"] == "does not hold here"


def test_a_busy_machine_gives_no_verdict_on_timings_on_gpus():
    kw = {**measurements(2), "article_contention": BUSY, "sweep_contention": BUSY}
    v = verdicts(**kw)
    assert v["07.two_gpu_speedup"] == v["07.comm_negligible"] == v["07.workers_4_to_8"] == claims.BUSY
    assert v["07.per_gpu_memory"] == "holds"  # memory is not a timing
    entry = next(e for e in claims_07(Measured07(**kw)) if e["id"] == "07.two_gpu_speedup")
    assert entry["contention"]["busy"] is True
    busy_obj = claims.Contention()
    busy_obj.cores, busy_obj.load_before, busy_obj.load_after, busy_obj.wall_s, busy_obj.others_share = 2, 3, 3, 9, 0.8
    assert verdicts(**{**measurements(2), "article_contention": busy_obj})["07.two_gpu_speedup"] == claims.BUSY
    # on a CPU the missing GPUs decide first
    assert verdicts(**{**measurements(0), "article_contention": BUSY})["07.two_gpu_speedup"] == "not testable here"


def test_the_distributed_sampler_row_both_ways():
    v = verdicts(**measurements(0))
    assert v["07.distributed_sampler_big_data"] == "holds with nuance"  # distinct shards matter, any way to cut them
    kw = measurements(0)
    kw["shards"] = shards(own_overlap=500)
    assert verdicts(**kw)["07.distributed_sampler_big_data"] == "holds"  # only DistributedSampler split the data
    kw["shards"] = shards(sampler_overlap=20)
    assert verdicts(**kw)["07.distributed_sampler_big_data"] == "does not hold here"
    kw["shards"] = shards(shuffle_overlap=0)
    assert verdicts(**kw)["07.distributed_sampler_big_data"] == "wrong"


def test_mpi_cuda_index_and_mixed_gpus_rows_both_ways():
    v = verdicts(**measurements(0))
    assert v["07.mpi_backend"] == v["07.cuda_device_index"] == v["07.nccl_mixed_gpus"] == "not testable here"
    assert v["07.tree_allreduce"] == "not testable here" and v["07.ring_linear"] == "holds with nuance"
    kw = measurements(2)
    kw["mpi"] = {"available": True, "ran": True, "error": None}
    kw["mixed_gpu_busbw"] = {"same": 100.0, "mixed": 40.0}
    v = verdicts(**kw)
    assert v["07.mpi_backend"] == v["07.cuda_device_index"] == "demonstrated" and v["07.nccl_mixed_gpus"] == "holds"
    kw["mpi"] = {"available": True, "ran": False, "error": "MPI_Init failed"}
    kw["cuda_index"] = {"gpus": 2, "ran": False, "indices": [0, 0, 0], "error": None}
    kw["mixed_gpu_busbw"] = {"same": 100.0, "mixed": 98.0}
    v = verdicts(**kw)
    assert v["07.mpi_backend"] == v["07.cuda_device_index"] == v["07.nccl_mixed_gpus"] == "does not hold here"


def test_mpi_probe_reports_this_torch_build():
    import torch.distributed as dist

    p = l07.mpi_probe(timeout=30)
    assert p["available"] == dist.is_mpi_available()
    assert (p["ran"] is None) == (not p["available"])


def test_speedup_verdict_needs_the_whole_spread_inside():
    assert scaling.speedup_verdict([1.75, 1.8, 1.85]) == "holds"
    assert scaling.speedup_verdict([1.6, 1.8, 1.85, 1.82, 1.8]) == "inconclusive"  # quartiles inside, min outside
    assert scaling.speedup_verdict([1.8]) == "inconclusive"
