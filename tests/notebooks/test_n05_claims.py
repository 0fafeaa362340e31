"""claims_05 (notebook 05) judged from synthetic measurements: each claim both ways, the load rule, numbers sourced."""
import pytest

from mnist_helpers.course import claims
from mnist_helpers.io import MiB
from mnist_helpers.lessons.n05.lesson import Measured05, claims_05

QUIET = {"others_cpu_share": 0.01, "busy": False}
BUSY = {"others_cpu_share": 0.6, "busy": True}


def row(peak, transient, ips, blocks, persistent=5.0):
    return {"peak_mib": peak, "transient_mib": transient, "persistent_mib": persistent, "images_per_s": ips,
            "block_images_per_s": blocks, "memory_method": "profiler"}


FP32 = row(100.0, 95.0, 1000.0, [980.0, 1000.0, 1020.0])
GOOD_BF16 = row(50.0, 45.0, 1500.0, [1480.0, 1500.0, 1520.0])   # halves the peak, faster beyond the spread
POOR_BF16 = row(90.0, 85.0, 900.0, [880.0, 900.0, 990.0])      # neither


def leak(train_saved=0, eval_saved=5 * 20 * MiB, train_nodes=70, steps=5):
    base = {"growth_per_step": 0.0, "saved_freed": 0, "loss_tensors_kept": 0, "graph_nodes_kept": 0,
            "saved_bytes_kept": 0}
    return {"training loop, total += loss": {**base, "graph_nodes_kept": train_nodes, "saved_bytes_kept": train_saved,
                                             "saved_freed": 68, "loss_tensors_kept": steps if train_nodes else 0},
            "training loop, total += loss.item()": base,
            "eval loop, total += loss": {**base, "graph_nodes_kept": 70, "saved_bytes_kept": eval_saved,
                                         "loss_tensors_kept": steps},
            "eval loop, total += loss.item()": base}


def judge(device="cpu", bf16=GOOD_BF16, load=QUIET, warnings=2, accum_peaks=(100.0, 60.0, 40.0), **leak_kw):
    accum = [{"k": k, "peak_mib": p, "max_grad_diff": 1e-7} for k, p in zip((1, 2, 4), accum_peaks)]
    entries = claims_05(Measured05(device=device, precision={"fp32": FP32, "bf16": bf16},
                                   small=[row(20.0, 15.0, 1.0, [1.0]), row(15.0, 10.0, 1.0, [1.0])], batch_size=128,
                                   amp_load=load, deprecations=warnings, torch_version="2.14.1", accum=accum,
                                   leak=leak(**leak_kw), leak_steps=5))
    for e in entries:
        assert not claims.unsourced_numbers(e), (e["id"], claims.unsourced_numbers(e))
        assert e["verdict"] in claims.VERDICTS
    return {e["id"]: e for e in entries}


def test_the_articles_amp_claim_needs_a_gpu():
    got = judge("cpu")
    assert got["05.amp_memory_speed"]["verdict"] == "not testable here"
    assert "no CUDA GPU" in got["05.amp_memory_speed"]["evidence"]
    assert got["05.amp_on_cpu"]["verdict"] == "holds" and got["05.amp_on_cpu"]["section"] == "ours"
    assert judge("mps")["05.amp_memory_speed"]["verdict"] == "not testable here"
    assert "05.amp_on_cpu" not in judge("mps")


@pytest.mark.parametrize("bf16,want", [(GOOD_BF16, "holds"), (POOR_BF16, "does not hold here")])
def test_amp_on_a_gpu_and_on_this_cpu_both_ways(bf16, want):
    assert judge("cuda", bf16)["05.amp_memory_speed"]["verdict"] == want
    assert "05.amp_on_cpu" not in judge("cuda", bf16)
    assert judge("cpu", bf16)["05.amp_on_cpu"]["verdict"] == want


def test_h200_like_numbers_do_not_hold():
    """The kept H200 run at batch 128: peak x0.69, activations x0.22, speed x0.86 within the spread. The activations
    halve by construction (16-bit storage), so they no longer count: neither the peak nor the speed gains."""
    h200 = row(69.0, 21.0, 860.0, [850.0, 860.0, 1010.0])
    assert judge("cuda", h200)["05.amp_memory_speed"]["verdict"] == "does not hold here"
    halved = row(50.0, 21.0, 860.0, [850.0, 860.0, 1010.0])  # the peak halves too: one of the two
    assert judge("cuda", halved)["05.amp_memory_speed"]["verdict"] == "holds with nuance"


def test_a_busy_machine_gives_no_speed_judgement():
    assert judge("cuda", load=BUSY)["05.amp_memory_speed"]["verdict"] == claims.BUSY
    assert judge("cpu", load=BUSY)["05.amp_on_cpu"]["verdict"] == claims.BUSY
    assert judge("cpu", load=BUSY)["05.amp_memory_speed"]["contention"] == BUSY


def test_api_and_accumulation_both_ways():
    assert judge(warnings=2)["05.cuda_amp_api"]["verdict"] == "outdated"
    assert judge(warnings=0)["05.cuda_amp_api"]["verdict"] == "holds"
    assert judge(accum_peaks=(100.0, 60.0, 40.0))["05.accumulation_memory"]["verdict"] == "wrong"
    assert judge(accum_peaks=(100.0, 150.0, 200.0))["05.accumulation_memory"]["verdict"] == "holds"
    assert judge(accum_peaks=(100.0, 100.0, 101.0))["05.accumulation_memory"]["verdict"] == "inconclusive"


def test_the_loss_leak_says_what_the_kept_graphs_hold():
    nuance = judge()["05.loss_leak"]            # graphs kept, emptied by backward
    assert nuance["verdict"] == "holds with nuance"
    assert "0.00 MiB of saved tensors" in nuance["evidence"] and "20.0 MiB of saved activations" in nuance["evidence"]
    assert judge(train_saved=5 * 20 * MiB)["05.loss_leak"]["verdict"] == "holds"   # graphs that keep activations
    assert judge(train_nodes=0)["05.loss_leak"]["verdict"] == "does not hold here"


def test_record_accepts_the_entries(tmp_path):
    res = claims.record("05_mixed_precision_and_memory", list(judge().values()), profile="quick", folder=tmp_path)
    assert len(claims.summary(res)) == 5
