"""claims_08 (notebook 08) judged from synthetic records: each claim both ways, the load rule, numbers sourced."""
import pytest

from mnist_helpers.course import claims
from mnist_helpers.lessons.n08.lesson import FED, STARVED, Measured08, Repro, claims_08

QUIET = {"others_cpu_share": 0.0, "busy": False}


def records(port_ok=True, unused_ok=True, device="cpu", wait=0.8, fed=0.05, hang_ok=True, omp_ok=True):
    port = Repro("port", "EADDRINUSE", "held", "free port", port_ok,
                 {"port": 12355, "holders": [{"pid": 1}] if port_ok else [], "port_free_after_stopping_holder": port_ok})
    unused = Repro("unused", "Expected to have finished reduction" if unused_ok else "", "the aux head is unused",
                   "freeze", unused_ok, {"find_unused_over_freeze": 1.234, "world_size": 2})
    starve = Repro("starve", "", "", "", True,
                   {"dataloader": {"wait_fraction": wait}, "tensor_batches": {"wait_fraction": fed}, "device": device,
                    "batch_size": 128, "model": "fastnet", "steps": 6})
    hang = Repro("hang", "Timed out", "", "", True, {"timeout_s": 3.0, "hang_launch_seconds": 14.2, "buffers": 2,
                                                     "as_described": hang_ok})
    omp = Repro("omp", "OMP_NUM_THREADS", "", "", True, {"plain_threads": 2, "torchrun_threads": 1, "fixed_threads": 1,
                                                         "cores": 2, "as_described": omp_ok})
    return dict(port=port, unused=unused, starve=starve, evalhang=hang, omp=omp)


def judge(load=QUIET, as_dicts=False, **kw):
    recs = records(**kw)
    if as_dicts:
        recs = {k: r.as_dict() for k, r in recs.items()}
    entries = claims_08(Measured08(**recs, unused_nproc=1, unused_steps=5, nproc=2, loader_load=load))
    for e in entries:
        assert e["verdict"] in claims.VERDICTS
        assert not claims.unsourced_numbers(e), (e["id"], claims.unsourced_numbers(e))
    return {e["id"]: e["verdict"] for e in entries}


def test_reproductions_both_ways():
    good = judge()
    assert good["08.port_in_use"] == good["08.unused_parameters"] == "reproduced"
    assert good["08.eval_through_ddp"] == "reproduced" and good["08.omp_threads"] == "demonstrated"
    bad = judge(port_ok=False, unused_ok=False, hang_ok=False, omp_ok=False, as_dicts=True)
    assert set(bad.values()) == {"does not hold here", "not testable here"}


def test_gpu_utilisation_needs_a_gpu():
    assert judge(device="cpu", wait=0.95, fed=0.01)["08.gpu_util_low"] == "not testable here"


@pytest.mark.parametrize("wait,fed,want", [(STARVED + 0.1, FED - 0.2, "holds"),
                                          (STARVED - 0.4, FED - 0.2, "inconclusive"),   # the loader did not starve it
                                          (STARVED + 0.1, FED + 0.5, "inconclusive")])  # in-memory did not feed it
def test_gpu_utilisation_on_a_gpu(wait, fed, want):
    assert judge(device="cuda", wait=wait, fed=fed)["08.gpu_util_low"] == want


def test_a_busy_machine_gives_no_timing_judgement():
    busy = {"others_cpu_share": 0.7, "busy": True}
    assert judge(device="cuda", load=busy)["08.gpu_util_low"] == claims.BUSY
    assert judge(device="cuda", load=busy)["08.port_in_use"] == "reproduced"  # not a timing


def test_record_accepts_the_entries(tmp_path):
    recs = records()
    res = claims.record("08_troubleshooting", claims_08(Measured08(**recs, unused_nproc=1, unused_steps=5, nproc=2)),
                        profile="quick", folder=tmp_path)
    assert len(claims.summary(res)) == 5
