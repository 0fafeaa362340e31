"""The peak-memory helper (notebook 05): known allocations, categories, validation, a fresh process."""
import pytest
import torch

from mnist_helpers.errors import ConfigError
from mnist_helpers.io import MiB
from mnist_helpers.lessons.n05.lesson import graph_nodes, leak_demo
from mnist_helpers.memory import (CATEGORIES, isolated_target, memory_summary, peak_memory, run_isolated,
                                  state_bytes)
from mnist_helpers.models import Net
from mnist_helpers.train import train_step


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
        train_step(model, opt, X, y)

    step()  # Adam's moments exist from the first step on
    rep = peak_memory(step, "cpu")
    static = state_bytes(model, opt)
    assert rep.by_category["weights"] == static["weights"]
    assert rep.by_category["optimizer_state"] == static["optimizer_state"]
    assert static["optimizer_state"] == pytest.approx(2 * static["weights"], abs=1024)  # two moments (+ step counters)
    assert rep.by_category["activations"] > 0
    assert set(rep.by_category) == set(CATEGORIES) and sum(rep.by_category.values()) == rep.peak_bytes
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


@pytest.mark.process
def test_run_isolated_measures_growth_in_a_fresh_process():
    batch = 64
    r = run_isolated(leak_demo, num_steps=5, accumulate="tensor", backward=False, batch_size=batch)
    # An evaluation loop without no_grad keeps every batch's activations; each kept graph holds at least
    # the first convolution's activation (batch x 32 x 26 x 26 fp32), a size set by the model, not the machine.
    assert r["result"]["growth_per_step"] >= batch * 32 * 26 * 26 * 4
    assert r["result"]["graph_nodes_kept"] > 0 and r["rss_peak_bytes"] > r["rss_start_bytes"]
    with pytest.raises(RuntimeError, match="failed in its subprocess"):
        run_isolated(leak_demo, accumulate="float")


def test_run_isolated_takes_a_module_level_function_never_a_name():
    """The fresh process imports the function by its module and name; what it cannot import is refused up front."""
    assert isolated_target(leak_demo) == "mnist_helpers.lessons.n05.lesson:leak_demo"  # the string form

    def nested():
        return 1

    for fn in (lambda: 1, nested, "mnist_helpers.lessons.n05.lesson:leak_demo", 3):
        with pytest.raises(ConfigError, match="run_isolated") as err:
            run_isolated(fn)
        assert "fix:" in str(err.value)
    with pytest.raises(ConfigError, match="module-level function"):
        run_isolated(nested)


def test_training_loop_leak_is_graph_nodes_growing_with_steps():
    """The article's regime: a training loop summing the loss tensor keeps one more graph per step (its nodes; the
    activations were freed by backward), while .item() keeps none."""
    two = leak_demo(num_steps=2, accumulate="tensor", backward=True, batch_size=8)
    four = leak_demo(num_steps=4, accumulate="tensor", backward=True, batch_size=8)
    assert four["graph_nodes_kept"] > two["graph_nodes_kept"] > 0
    assert leak_demo(num_steps=4, accumulate="item", backward=True, batch_size=8)["graph_nodes_kept"] == 0


def test_what_the_kept_graphs_hold():
    """After backward() the kept graphs hold no saved tensor (only the 4-byte losses and their grad_fn chains); in an
    evaluation loop without no_grad they hold every batch's activations (at least conv1's, batch x 32 x 26 x 26 fp32)."""
    train = leak_demo(num_steps=3, accumulate="tensor", backward=True, batch_size=8)
    assert train["saved_bytes_kept"] == 0 and train["saved_freed"] > 0 and train["loss_tensors_kept"] == 3
    ev = leak_demo(num_steps=3, accumulate="tensor", backward=False, batch_size=8)
    assert ev["saved_bytes_kept"] >= 3 * 8 * 32 * 26 * 26 * 4 and ev["saved_freed"] == 0
    item = leak_demo(num_steps=3, accumulate="item", backward=False, batch_size=8)
    assert item["saved_bytes_kept"] == 0 and item["loss_tensors_kept"] == 0
