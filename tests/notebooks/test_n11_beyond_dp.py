"""11_beyond_data_parallel's claims that must not break, on CPU with gloo: ZeRO-1 and FSDP2 train the same weights
as one process, a DCP checkpoint saved by 2 ranks loads bit for bit into 1 process, tensor parallelism reproduces
the unsharded Linear pair, and the memory accounting sees the shards. Small models: about a minute on 2 cores."""
from __future__ import annotations

import pytest
import torch

from mnist_helpers.launch import torchrun
from mnist_helpers.lessons.n11.lesson import n_params, per_rank_rows, pipelining_outcome
from mnist_helpers.workers.beyond import dcp_checkpoint
from mnist_helpers.workers.beyond.common import build, state_bytes

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def sharded(mnist_root):
    res = torchrun("mnist_helpers.workers.beyond.sharding",
                   ["--width", 64, "--blocks", 2, "--batch-size", 32, "--steps", 3, "--measure",
                    "--strategies", "ddp,zero1,fsdp2_zero3,fsdp2_zero3_ckpt", "--data-root", mnist_root],
                   nproc=2, timeout=240, echo=False, device="cpu")
    assert res["world_size"] == 2 and res["backend"] == "gloo"
    return res


def test_zero1_and_fsdp2_match_one_process(sharded):
    rank0 = {r["strategy"]: r for r in sharded["rows"] if r["rank"] == 0}
    for strategy, r in rank0.items():  # a missed reduction shows up near lr = 1e-3; float reduction order near 1e-6
        assert r["max_param_diff"] < 1e-4, f"{strategy} drifted from one process: {r['max_param_diff']}"


def test_sharding_shows_in_the_bytes_each_rank_holds(sharded):
    rows = {r["strategy"]: r for r in per_rank_rows({2: sharded})}
    full = 4 * n_params(64, 2)
    assert rows["ddp"]["params_mib"] * 2**20 == full  # DDP: every parameter on every rank
    assert rows["fsdp2_zero3"]["params_mib"] * 2**20 < 0.6 * full  # FSDP2: about half on each of 2 ranks
    assert rows["zero1"]["optimizer_state_mib"] < 0.8 * rows["ddp"]["optimizer_state_mib"]
    assert rows["zero1"]["params_mib"] == rows["ddp"]["params_mib"]  # ZeRO-1 shards the optimizer state only
    assert all(r["peak_mib"] >= r["persistent_state_mib"] for r in rows.values())


def test_dcp_two_ranks_save_one_process_loads(tmp_path, mnist_root):
    path = tmp_path / "ckpt"
    saved = torchrun("mnist_helpers.workers.beyond.dcp_checkpoint",
                     ["--mode", "save", "--path", path, "--width", 32, "--data-root", mnist_root],
                     nproc=2, timeout=240, echo=False, device="cpu")
    assert {f["file"] for f in saved["files"]} >= {".metadata", "__0_0.distcp", "__1_0.distcp"}
    loaded = dcp_checkpoint.load_one_process(str(path), 32, 2)  # no process group; a different seed first
    assert loaded["digests"] == saved["digests"]
    assert saved["local_shapes_rank0"]["inp.weight"] == [16, 784] and saved["full_shapes"]["inp.weight"] == [32, 784]


def test_tensor_parallel_matches_unsharded():
    res = torchrun("mnist_helpers.workers.beyond.tensor_parallel", ["--width", 32], nproc=2, timeout=240,
                   echo=False, device="cpu")
    assert res["output_max_diff"] < 1e-5 and res["grad_max_diff"] < 1e-6
    assert res["local_shapes"]["up.weight"] == [64, 32] and res["local_shapes"]["down.weight"] == [32, 64]
    assert "Shard(dim=0)" in res["placements"]["up.weight"] and "Shard(dim=1)" in res["placements"]["down.weight"]


def test_state_bytes_counts_adamw_state():
    model = build(16, 1)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 1, 28, 28)).sum().backward()
    opt.step()
    held = state_bytes(model, opt)
    assert held["params"] == held["grads"] == 4 * n_params(16, 1) == 4 * sum(p.numel() for p in model.parameters())
    assert held["optimizer_state"] == 2 * held["params"]  # exp_avg and exp_avg_sq; the scalar step is not counted


def test_pipelining_outcome_tells_a_hang_from_a_slow_start():
    assert pipelining_outcome({"step_seconds": [0.1]}, "done in", False)["hung"] is False
    assert pipelining_outcome(None, "[rank 0] step 0: schedule.step() started", True)["hung"] is True
    assert pipelining_outcome(None, "", True)["hung"] is None
