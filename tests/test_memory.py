"""The peak-memory helper (notebook 05): known allocations, categories, validation, a fresh process."""
import pytest
import torch
import torch.nn.functional as F

from mnist_helpers.lessons.l05_precision_memory import leak_demo
from mnist_helpers.io import MiB
from mnist_helpers.memory import graph_nodes, memory_summary, peak_memory, run_isolated, state_bytes
from mnist_helpers.models import Net


def test_peak_and_persistent_of_known_allocations():
    kept = []

    def fn():
        tmp = torch.ones(8 * MiB // 4)          # 8 MiB, freed on return
        kept.append(torch.ones(2 * MiB // 4))   # 2 MiB, still held afterwards
        del tmp

    rep = peak_memory(fn, "cpu")
    assert rep.method == "profiler"
    assert (rep.peak_bytes - rep.before_bytes) / MiB == pytest.approx(10, abs=0.1)
    assert (rep.persistent_bytes - rep.before_bytes) / MiB == pytest.approx(2, abs=0.1)
    assert rep.transient_bytes / MiB == pytest.approx(8, abs=0.1)


def test_training_step_is_split_into_categories():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters())
    X, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))

    def step():
        opt.zero_grad(set_to_none=True)
        F.nll_loss(model(X), y).backward()
        opt.step()

    step()  # Adam's moments exist from the first step on
    rep = peak_memory(step, "cpu")
    static = state_bytes(model, opt)
    assert rep.by_category["weights"] == static["weights"]
    assert rep.by_category["optimizer_state"] == static["optimizer_state"]
    assert static["optimizer_state"] == pytest.approx(2 * static["weights"], abs=1024)  # two moments (+ step counters)
    assert rep.by_category["activations"] > 0
    assert rep.peak_bytes >= static["weights"] + static["optimizer_state"]
    assert "persistent" in rep.line() and rep.to_dict()["transient_bytes"] == rep.transient_bytes


@pytest.mark.parametrize("kwargs,match", [
    ({"fn": 3}, "fn must be a callable"),
    ({"fn": lambda: None, "method": "nvml"}, "method must be one of auto, cuda, profiler"),
    ({"fn": lambda: None, "method": "cuda", "device": "cpu"}, "needs a CUDA device"),
])
def test_bad_input_says_what_to_do(kwargs, match):
    with pytest.raises(ValueError, match=match):
        peak_memory(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU wording")
def test_cpu_summary_and_cuda_request_without_gpu():
    assert "RSS" in memory_summary("cpu")
    with pytest.raises(ValueError, match="CUDA is not available"):
        peak_memory(lambda: None, "cuda")


def test_loss_tensor_accumulation_keeps_graphs():
    kept = leak_demo(num_steps=3, accumulate="tensor", backward=True, batch_size=8)
    fixed = leak_demo(num_steps=3, accumulate="item", backward=True, batch_size=8)
    assert kept["graph_nodes_kept"] > 3 * 5 and fixed["graph_nodes_kept"] == 0
    assert kept["mean_loss"] == pytest.approx(fixed["mean_loss"], rel=1e-6)
    assert graph_nodes(1.0) == 0
    with pytest.raises(ValueError, match="accumulate must be"):
        leak_demo(accumulate="float")


def test_run_isolated_measures_growth_in_a_fresh_process():
    r = run_isolated("mnist_helpers.lessons.l05_precision_memory:leak_demo", num_steps=5, accumulate="tensor", backward=False, batch_size=64)
    # An evaluation loop without no_grad keeps every batch's activations (~20 MiB each at batch 64).
    assert r["result"]["growth_per_step"] > 8 * MiB
    assert r["rss_peak_bytes"] > r["rss_start_bytes"]
    with pytest.raises(ValueError, match="module:function"):
        run_isolated("mnist_helpers.lessons.l05_precision_memory.leak_demo")
    with pytest.raises(RuntimeError, match="failed in its subprocess"):
        run_isolated("mnist_helpers.lessons.l05_precision_memory:leak_demo", accumulate="float")
