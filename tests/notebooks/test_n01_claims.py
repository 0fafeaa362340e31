"""claims_01 (notebook 01's claims, judged from its measurements): each verdict can come out both ways, a busy
machine gives no verdict on the timing, and every number an evidence string quotes is recorded. Synthetic
measurements only: nothing is timed here."""
import pytest

from mnist_helpers.course import claims
from mnist_helpers.lessons.n01.lesson import CONFIG_TARGET, Measured01, claims_01
from mnist_helpers.memory import gpu_memory_verdict

QUIET = {"busy": False, "others_cpu_share": 0.02}


def row(threads, samples, busy=1.0):
    s = sorted(samples)
    return {"threads": threads, "images_per_s": s[len(s) // 2], "samples": list(samples), "blocks": len(samples),
            "cpu_cores_busy": busy, "vs_best": None, "others_cpu_share": 0.01}


def sweep(one, two, four):
    rows = [row(1, one, 1.0), row(2, two, 2.0), row(4, four, 2.0)]
    best = max(r["images_per_s"] for r in rows)
    for r in rows:
        r["vs_best"] = r["images_per_s"] / best
    return rows


READINGS = {"logical_cores": 2, "usable_cores": 2, "ram_gib": 7.7, "torch_threads": 2, "gpus": 0}
SHELLS = {"lscpu": True, "free -h": True, "nvidia-smi": False}
MEMORY = {"step_peak_mib": 60.4, "persistent_mib": 20.1, "transient_mib": 40.3, "device": "cpu", "method": "profiler"}


def judge(sw, contention=QUIET, memory=MEMORY, readings=READINGS):
    entries = claims_01(Measured01(sweep=sw, default_threads=2, cores=2, readings=readings, shells=SHELLS,
                                   memory=memory, contention=contention))
    return {e["id"]: e for e in entries}


def test_each_claim_is_returned_once_with_the_result_file_fields():
    out = claims_01(Measured01(sweep=sweep([100, 101], [300, 310], [250, 260]), default_threads=2, cores=2,
                               readings=READINGS, shells=SHELLS, memory=MEMORY, contention=QUIET))
    assert [e["id"] for e in out] == ["01.config_2x", "01.inspect_first", "01.gpu_memory_enough"]
    res = claims.ResultFile("01_resource_inspection", profile="quick")
    for e in out:
        res.claim(**e)     # the keyword arguments ResultFile.claim takes, nothing else
        assert not claims.unsourced_numbers(res.claims[e["id"]]), e["evidence"]


def test_config_2x_holds_only_when_the_whole_spread_clears_the_threshold():
    assert judge(sweep([100, 102], [300, 310], [250, 260]))["01.config_2x"]["verdict"] == "holds"
    assert judge(sweep([200, 210], [300, 310], [250, 260]))["01.config_2x"]["verdict"] == "does not hold here"
    # median ratio 2.0 but the spreads reach below the threshold: too close to call
    e = judge(sweep([120, 150, 160], [300, 310, 280], [250, 260, 240]))["01.config_2x"]
    assert e["numbers"]["ratio_low"] < CONFIG_TARGET <= e["numbers"]["ratio"]
    assert e["verdict"] == "inconclusive"
    # a single timed block per setting has no spread
    assert judge(sweep([100], [300], [250]))["01.config_2x"]["verdict"] == "inconclusive"


def test_config_2x_gives_no_verdict_on_a_busy_machine_and_says_which_knob_turned():
    sw = sweep([100, 102], [300, 310], [250, 260])
    for busy in ({"busy": True, "others_cpu_share": 0.6}, type("C", (), {"busy": True})()):
        assert judge(sw, contention=busy)["01.config_2x"]["verdict"] == claims.BUSY
    e = judge(sw)["01.config_2x"]
    assert "one knob" in e["regime"] and "threads" in e["regime"] and e["evidence"].startswith("threads only")
    assert e["numbers"]["img_s_1_threads"] == 102 and e["numbers"]["target"] == CONFIG_TARGET


def test_inspect_first_needs_every_reading():
    assert judge(sweep([1, 1], [2, 2], [2, 2]))["01.inspect_first"]["verdict"] == "demonstrated"
    e = judge(sweep([1, 1], [2, 2], [2, 2]), readings={**READINGS, "ram_gib": None})["01.inspect_first"]
    assert e["verdict"] == "inconclusive" and not claims.unsourced_numbers(e)


@pytest.mark.parametrize("peak_mib,verdict", [(60.4, "holds"), (2000.0, "holds with nuance"),
                                              (5000.0, "does not hold here")])
def test_gpu_memory_enough_follows_the_measured_share(peak_mib, verdict):
    """One rule with scripts/device_check.py (memory.gpu_memory_verdict): a peak is a count, not a sample, so the band
    between 10% and 50% of the 8 GB GPU fits with a nuance instead of being "inconclusive"."""
    e = judge(sweep([1, 1], [2, 2], [2, 2]), memory={**MEMORY, "step_peak_mib": peak_mib})["01.gpu_memory_enough"]
    assert e["verdict"] == verdict == gpu_memory_verdict(peak_mib)["verdict"]
    assert not claims.unsourced_numbers(e), e["evidence"]


def test_the_committed_gpu_memory_verdicts_follow_the_shared_rule():
    """Every kept 01.gpu_memory_enough (notebook 01 on a CPU, device_check on a GPU) is what the rule gives its peak."""
    import json

    from mnist_helpers.paths import reference_dir
    seen = 0
    for path in sorted(reference_dir().glob("*/*.json")):
        for c in json.loads(path.read_text()).get("claims", []):
            if c["id"] == "01.gpu_memory_enough":
                peak = c["numbers"].get("step_peak_mib", c["numbers"].get("peak_mib"))
                assert c["verdict"] == gpu_memory_verdict(peak)["verdict"], path
                seen += 1
    assert seen >= 1


def test_record_writes_what_claims_01_returns(tmp_path):
    entries = claims_01(Measured01(sweep=sweep([100, 102], [300, 310], [250, 260]), default_threads=2, cores=2,
                                   readings=READINGS, shells=SHELLS, memory=MEMORY, contention=QUIET))
    res = claims.record("01_resource_inspection", entries, profile="quick", folder=tmp_path)
    assert (tmp_path / "01_resource_inspection.json").is_file()
    assert [r["on this machine"] for r in claims.summary(res)] == [
        claims.PLAIN["holds"], claims.PLAIN["demonstrated"], claims.PLAIN["holds"]]
