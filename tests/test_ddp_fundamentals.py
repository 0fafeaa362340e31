"""Every claim of 06_ddp_fundamentals, asserted on CPU with gloo (2 and 3 processes).

Starting torch in a process costs seconds, so each world size is one torchrun launch that runs
several demos in the same process group (``mnist_helpers.workers.demos``).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mnist_helpers.launch import torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore:3 processes on 2 CPU cores")]


def launch(nproc: int, demos: str, mnist_root, *extra) -> dict:
    result = torchrun("mnist_helpers.workers.demos",
                      ["--demos", demos, "--data-root", str(mnist_root), *extra],
                      nproc=nproc, timeout=240, echo=False, device="cpu")
    assert result["world_size"] == nproc and result["backend"] == "gloo"
    return {name: d["summary"] for name, d in result["demos"].items()}


@pytest.fixture(scope="module")
def two(mnist_root):
    return launch(2, "manual_allreduce,local_rank_bug,sampler,seeding,syncbn", mnist_root)


@pytest.fixture(scope="module")
def three(mnist_root):
    return launch(3, "manual_allreduce,sampler,validation", mnist_root, "--train-steps", "10")


@pytest.mark.parametrize("world", ["two", "three"])
def test_manual_all_reduce_then_ddp_hooks(world, request):
    s = request.getfixturevalue(world)["manual_allreduce"]
    n = s["world_size"]
    assert s["distinct_initial_params"] == 1
    assert s["distinct_grads_before_reduce"] == n, "different data, different gradients"
    assert s["distinct_params_without_reduce"] == n, "without the reduce the replicas drift apart"
    assert s["distinct_grads_after_reduce"] == 1 and s["distinct_params_after_step"] == 1
    assert s["max_diff_vs_global_batch"] < 1e-5, "the averaged gradient is the global batch's gradient"
    assert s["distinct_ddp_grads"] == 1 and s["distinct_ddp_params_after_step"] == 1
    assert s["ddp_max_diff_vs_manual"] < 1e-6 and s["ddp_vs_manual_params"] < 1e-6


@pytest.mark.parametrize("world", ["two", "three"])
def test_distributed_sampler_shards_and_set_epoch(world, request):
    s = request.getfixturevalue(world)["sampler"]
    assert s["covered"] == s["dataset"] == 60_000 and s["overlapping"] == 0
    assert s["shard_sizes"] == [60_000 // s["world_size"]] * s["world_size"]
    assert s["same_order_without_set_epoch"] == 1.0, "without set_epoch every epoch repeats the order"
    assert s["same_order_with_set_epoch"] < 0.01
    assert s["tensorbatches_covered"] == 60_000 and s["tensorbatches_overlapping"] == 0
    assert s["tensorbatches_same_order"] < 0.01


def test_validation_with_three_processes(three):
    s = three["validation"]
    assert s["test_images"] == 10_000
    assert s["sampler_per_rank"] == [3334, 3334, 3334] and s["sampler_count"] == 10_002, "the sampler pads"
    assert s["exact_count"] == 10_000
    assert s["exact_equals_single"] and s["exact_acc"] == s["single_process_acc"]
    assert s["single_process_acc"] > 0.2, "the demo model learned something (chance: 0.1)"
    # the others wait while rank 0 evaluates (a fraction, not a speed: no timing thresholds in tests)
    assert s["others_wait_s"] > 0 and s["others_wait_fraction"] > 0.5


def test_local_rank_argument_is_never_passed(two):
    s = two["local_rank_bug"]
    assert not s["any_local_rank_argument"]
    assert s["article_devices"] == ["cuda:0", "cuda:0"], "every process would pick device 0"
    assert s["correct_devices"] == ["cuda:0", "cuda:1"]
    assert {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} <= set(s["env_set_by_torchrun"])


def test_seeding_ddp_broadcast_and_per_rank_augmentation(two):
    s = two["seeding"]
    assert s["distinct_weights_before_ddp"] == 2 and s["distinct_weights_after_ddp"] == 1
    assert s["after_ddp_equals_rank0_before"]
    assert s["distinct_augmentation_same_seed"] == 1 and s["distinct_augmentation_per_rank_seed"] == 2


def test_syncbatchnorm(two):
    s = two["syncbn"]
    assert s["running_stats_spread_plain"] > 1e-4, "per-rank running statistics differ without sync"
    assert s["running_stats_spread_sync"] < 1e-6, "and agree with it"
    assert s["sync_vs_single_process"] < 1e-5 < s["plain_vs_single_process"]
    assert s["nn_syncbatchnorm_on_cpu"].startswith("ValueError: SyncBatchNorm expected input tensor to be on GPU")


def test_mp_spawn_of_a_main_function_fails_without_a_file():
    """08's reproduction (workers/bugs/spawn_main.py) run as ``python -c`` fails; the same file run as a script works."""
    from mnist_helpers.lessons.l06_ddp import spawn_from_a_file, spawn_like_a_notebook

    like_notebook = spawn_like_a_notebook()
    assert like_notebook["returncode"] != 0 and not like_notebook["finished"]
    assert like_notebook["child_error"] == "AttributeError: Can't get attribute 'train' on <module '__main__' (built-in)>"
    assert "ProcessExitedException" in like_notebook["parent_error"]
    from_file = spawn_from_a_file()
    assert from_file["returncode"] == 0 and from_file["finished"], from_file["output"]


def test_what_init_process_group_needs():
    from mnist_helpers.lessons.l06_ddp import init_requirements

    r = init_requirements()
    steps = list(r["env_steps"].values())
    for missing, message in zip(("RANK", "MASTER_ADDR", "MASTER_PORT"), steps):
        assert f"environment variable {missing} expected" in message
    assert steps[-1].startswith("ok: rank 0 of 1, backend gloo")
    assert r["available"]["gloo"]
    if r["cuda_devices"] == 0:
        assert "NCCL" in r["nccl"] and "GPU" in r["nccl"]


def test_dataparallel_is_a_pass_through_on_cpu():
    """DP replicates over GPUs only; on CPU it has no device to split the batch over."""
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU fallback")
    torch.manual_seed(0)
    module = nn.Linear(4, 2)
    dp = nn.DataParallel(module)
    X = torch.randn(8, 4)
    assert dp.device_ids == [] and torch.equal(dp(X), module(X))
