"""claims_02 and compare_loop_and_fit (notebook 02) judged from synthetic histories: both ways, numbers sourced."""
import pytest

from mnist_helpers.course import claims
from mnist_helpers.lessons.n02.lesson import BASELINE_MIN_ACC, Measured02, claims_02, compare_loop_and_fit


def history(accs, seconds=12.0):
    return [{"epoch": i + 1, "seconds": seconds + i, "images_per_s": 60_000 / (seconds + i), "train_loss": 0.1,
             "test_loss": 0.05, "test_acc": a} for i, a in enumerate(accs)]


def judge(accs, fit_accs=None, *, num_epochs=5, subset=None, fit_device="cpu", weight_diff=0.0, contention=None):
    loop = history(accs)
    fit = history(fit_accs if fit_accs is not None else accs[:1])
    cmp = compare_loop_and_fit(loop, fit, loop_device="cpu", fit_device=fit_device, max_weight_diff=weight_diff)
    entries = claims_02(Measured02(history=loop, comparison=cmp, num_epochs=num_epochs, subset=subset, seed=0,
                                   threads=2, device="cpu", fit_epochs=1, contention=contention))
    for e in entries:
        assert not claims.unsourced_numbers(e), (e["id"], claims.unsourced_numbers(e))
    return {e["id"]: e for e in entries}, cmp


def test_the_baseline_is_reproduced_or_not_by_its_final_accuracy():
    good, _ = judge([0.97, 0.985, 0.988, 0.99, 0.991])
    assert good["02.baseline"]["verdict"] == "reproduced"
    bad, _ = judge([0.11, 0.10, 0.11, 0.10, BASELINE_MIN_ACC - 0.5])
    assert bad["02.baseline"]["verdict"] == "does not hold here"


def test_a_shortened_run_settles_nothing():
    short, _ = judge([0.95], num_epochs=1, subset=1_000)
    assert short["02.baseline"]["verdict"] == "inconclusive" and "shortened" in short["02.baseline"]["evidence"]


def test_epoch_times_are_context_so_a_busy_machine_keeps_the_procedure_verdict():
    busy = {"others_cpu_share": 0.9, "busy": True}
    got, _ = judge([0.97, 0.985, 0.988, 0.99, 0.991], contention=busy)
    assert got["02.baseline"]["verdict"] == "reproduced" and got["02.baseline"]["contention"] == busy


@pytest.mark.parametrize("fit_accs,device,wdiff,want", [
    ([0.97], "cpu", 0.0, "holds"),
    ([0.96], "cpu", 0.0, "does not hold here"),          # accuracy differs
    ([0.97], "cpu", 1e-7, "does not hold here"),         # weights differ in the last bits
    ([0.97], "mps", 0.0, "not testable here"),           # two devices: not one loop compared with itself
])
def test_fit_is_the_loop_both_ways(fit_accs, device, wdiff, want):
    got, cmp = judge([0.97, 0.98, 0.985, 0.99, 0.991], fit_accs, fit_device=device, weight_diff=wdiff)
    assert got["02.fit_is_the_loop"]["verdict"] == want
    assert cmp["identical"] == (want == "holds")
    assert got["02.fit_is_the_loop"]["section"] == "ours" and got["02.fit_is_the_loop"]["claim"]


def test_record_accepts_the_entries(tmp_path):
    entries, _ = judge([0.97, 0.985, 0.988, 0.99, 0.991])
    res = claims.record("02_single_device_baseline", list(entries.values()), profile="quick", folder=tmp_path)
    assert [r["on this machine"] for r in claims.summary(res)] == [claims.PLAIN["reproduced"], claims.PLAIN["holds"]]
