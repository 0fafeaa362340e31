"""Notebook 12's claims (the appendix to 06), judged by ``l12.claims_12`` from synthetic measurements, both ways;
the kept 12.same_seed entries are what today's rule gives; DataParallel against DDP on the CPU (the code path only)."""
from __future__ import annotations

import json

import pytest

from mnist_helpers.course import claims
from mnist_helpers.lessons.n12 import lesson as l12
from mnist_helpers.paths import reference_dir


def _synthetic(*, shards_ok=True, pads=True, env_ok=True, nccl_refused=True, spawn_fails=True):
    sampler = {"covered": 60_000 if shards_ok else 59_000, "overlapping": 0, "same_order_without_set_epoch": 1.0,
               "same_order_with_set_epoch": 0.0001}
    env = ["MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"][:5 if env_ok else 3]
    demos = {2: {"sampler": {"summary": sampler},
                 "local_rank_bug": {"summary": {"any_local_rank_argument": False, "article_distinct_devices": 1,
                                                "env_set_by_torchrun": env}},
                 "seeding": {"summary": {"distinct_weights_before_ddp": 2, "distinct_weights_after_ddp": 1,
                                         "distinct_augmentation_same_seed": 1,
                                         "distinct_augmentation_per_rank_seed": 2}},
                 "syncbn": {"summary": {"running_stats_spread_plain": 1e-2, "running_stats_spread_sync": 1e-8,
                                        "plain_vs_single_process": 1e-2, "sync_vs_single_process": 1e-12,
                                        "steps": 3, "sync_impl": "CpuSyncBatchNorm (gloo)"}}},
             3: {"sampler": {"summary": sampler},
                 "validation": {"summary": {"world_size": 3, "test_images": 10_000, "others_wait_fraction": 0.9,
                                            "rank0_only_rounds_s": [1.0, 1.1, 1.05], "exact_rounds_s": [0.5, 0.6, 0.55],
                                            "sampler_count": 10_002 if pads else 10_000, "exact_count": 10_000,
                                            "exact_acc": 0.9, "exact_equals_single": True}}}}
    article = {"ranks": [{"param_digest": "x", "steps": 3}, {"param_digest": "x", "steps": 3}]}
    like_notebook = ({"returncode": 1, "child_error": "AttributeError: Can't get attribute 'train'"} if spawn_fails
                     else {"returncode": 0, "child_error": None})
    backends = {"env_steps": {"+ MASTER_PORT": "ok: rank 0 of 1"}, "cuda_devices": 0,
                "nccl": "RuntimeError: ProcessGroupNCCL is only supported with GPUs" if nccl_refused else "ok: rank 0"}
    return dict(demos=demos, demos_load=None, article=article, spawn_run={"world_size": 2},
                like_notebook=like_notebook, backends=backends, dp_rows=[], gpus=0)


def test_every_claim_of_12_from_the_notebooks_runs(tmp_path):
    entries = l12.claims_12(l12.Measured12(**_synthetic()))
    assert sorted(e["id"] for e in entries) == sorted(c["id"] for c in claims.CATALOG if c["id"].startswith("12."))
    verdicts = {e["id"]: e["verdict"] for e in entries}
    assert verdicts == {"12.local_rank_arg": "wrong", "12.torchrun_env": "holds", "12.distributed_sampler": "holds",
                        "12.same_seed": "wrong", "12.syncbn": "not testable here", "12.rank0_eval_waits": "holds",
                        "12.distributed_validation": "holds with nuance", "12.nccl_gloo": "holds",
                        "12.dp_vs_ddp": "not testable here", "12.mp_spawn": "holds with nuance"}
    res = claims.record("12_ddp_in_depth", entries, profile="quick", folder=tmp_path)  # every quoted number sourced
    assert (tmp_path / "12_ddp_in_depth.json").is_file() and res.claims["12.same_seed"]["numbers"]["world_size"] == 2


@pytest.mark.parametrize("change, claim, verdict", [
    (dict(shards_ok=False), "12.distributed_sampler", "does not hold here"),
    (dict(pads=False), "12.distributed_validation", "holds"),
    (dict(env_ok=False), "12.torchrun_env", "does not hold here"),
    (dict(nccl_refused=False), "12.nccl_gloo", "does not hold here"),
    (dict(spawn_fails=False), "12.mp_spawn", "holds"),
])
def test_claims_can_come_out_the_other_way(change, claim, verdict):
    assert {e["id"]: e["verdict"] for e in l12.claims_12(l12.Measured12(**_synthetic(**change)))}[claim] == verdict


def test_dp_vs_ddp_verdict_from_rounds():
    def rows(dp_s, ddp_s, device="cuda"):
        out = []
        for k, (a, b) in enumerate(zip(dp_s, ddp_s)):
            out += [{"round": k, "processes": 1, "step_s": a, "device": device},
                    {"round": k, "processes": 2, "step_s": b, "device": device}]
        return out
    assert l12.dp_vs_ddp_verdict([]) == "not testable here"
    assert l12.dp_vs_ddp_verdict(rows([2, 2], [1, 1], device="cpu")) == "not testable here"
    assert l12.dp_vs_ddp_verdict(rows([2.0, 2.1], [1.0, 1.1])) == "holds"
    assert l12.dp_vs_ddp_verdict(rows([1.0, 1.0], [2.0, 2.0])) == "does not hold here"
    assert l12.dp_vs_ddp_verdict(rows([2.0, 1.0], [1.0, 2.0])) == "inconclusive"


def test_dp_vs_ddp_with_two_gpus_is_judged_from_its_rows():
    rows = [{"round": k, "processes": p, "step_s": s, "images_per_s": 256 / s, "device": "cuda",
             "global_batch_size": 256, "warmup_steps": 10, "timed_steps": 50, "repeats": 5}
            for k in range(2) for p, s in ((1, 0.02), (2, 0.01))]
    measured = l12.Measured12(**{**_synthetic(), "dp_rows": rows, "gpus": 2})
    entry = next(e for e in l12.claims_12(measured) if e["id"] == "12.dp_vs_ddp")
    assert entry["verdict"] == "holds" and not claims.unsourced_numbers({**entry, "claim": ""})


@pytest.mark.process
@pytest.mark.timeout(300)
def test_dp_and_ddp_are_warmed_up_and_timed_over_the_same_steps(mnist_root):
    rows = l12.dp_vs_ddp(2, batch_size=8, steps=2, warmup=1, repeats=2, rounds=1, device="cpu")
    assert [r["processes"] for r in rows] == [1, 2]
    assert {(r["device"], r["global_batch_size"], r["warmup_steps"], r["timed_steps"], r["repeats"])
            for r in rows} == {("cpu", 16, 1, 2, 2)}
    assert all(r["step_s"] > 0 and r["images_per_s"] > 0 for r in rows)


@pytest.mark.parametrize("r0, ex, expected", [
    ([1.0, 1.1, 1.05], [0.5, 0.6, 0.55], "holds"),             # rank 0 alone 1.9x slower, rounds apart
    ([0.50, 0.52, 0.51], [0.60, 0.62, 0.61], "does not hold here"),  # splitting the work was slower here
    ([0.60, 0.61, 0.60], [0.60, 0.59, 0.61], "does not hold here"),  # no difference
    ([0.7, 1.0, 0.9], [0.6, 0.75, 0.8], "inconclusive"),       # 1.2x but the rounds overlap
])
def test_rank0_eval_is_judged_on_the_validation_steps_wall_time(r0, ex, expected):
    v = {"world_size": 3, "others_wait_fraction": 0.97, "rank0_only_rounds_s": r0, "exact_rounds_s": ex}
    entry = l12.rank0_eval_claim(v)
    assert entry["verdict"] == expected
    assert not claims.unsourced_numbers({**entry, "id": "12.rank0_eval_waits"})


def test_a_busy_machine_gets_no_verdict_on_rank0_eval():
    class Busy:
        busy = True
    v = {"world_size": 3, "others_wait_fraction": 0.97, "rank0_only_rounds_s": [1, 1.1], "exact_rounds_s": [.5, .6]}
    assert l12.rank0_eval_claim(v, Busy())["verdict"] == claims.BUSY


@pytest.mark.parametrize("impl, plain, sync, expected", [
    ("nn.SyncBatchNorm (nccl)", 1e-2, 1e-12, "holds"),
    ("nn.SyncBatchNorm (nccl)", 1e-2, 1e-2, "does not hold here"),
    ("CpuSyncBatchNorm (gloo)", 1e-2, 1e-12, "not testable here"),   # the article's API needs GPUs
])
def test_syncbn_is_judged_on_the_articles_api_only(impl, plain, sync, expected):
    sb = {"running_stats_spread_plain": 1e-2, "running_stats_spread_sync": 1e-8 if sync < 1e-9 else 1e-2,
          "plain_vs_single_process": plain, "sync_vs_single_process": sync, "steps": 3, "sync_impl": impl}
    entry = l12.syncbn_claim(sb)
    assert entry["verdict"] == expected
    assert not claims.unsourced_numbers({**entry, "id": "12.syncbn"})


@pytest.mark.parametrize("before, after, same, per_rank, expected", [
    (2, 1, 1, 2, "wrong"),               # DDP equalised the weights anyway; one seed duplicated the augmentation
    (2, 1, 2, 2, "does not hold here"),  # the seed was not needed, and did no harm
    (2, 2, 1, 2, "holds with nuance"),   # replicas stayed different: the seed is needed, the data side wants + rank
    (2, 2, 2, 2, "holds"),
    (1, 1, 1, 2, "inconclusive"),        # per-rank seeds gave equal weights: nothing was tested
])
def test_same_seed_is_judged_on_both_of_the_articles_reasons(before, after, same, per_rank, expected):
    n = {"world_size": 2, "distinct_weights_before_ddp": before, "distinct_weights_after_ddp": after,
         "distinct_augmentation_same_seed": same, "distinct_augmentation_per_rank_seed": per_rank}
    verdict, evidence = l12.same_seed_judgement(n)
    assert verdict == expected
    entry = {"id": "12.same_seed", "claim": claims.CATALOG_IDS["12.same_seed"]["claim"], "numbers": n,
             "regime": l12.SEEDING_REGIME, "evidence": evidence, "verdict": verdict}
    assert not claims.unsourced_numbers(entry) and "seed + rank" in evidence
    old = {**entry, "numbers": {k: v for k, v in n.items() if k != "world_size"}, "verdict": "holds with nuance",
           "rule": 1}
    again = l12.rejudge(old)  # a kept entry without world_size: its regime's 2 processes
    assert (again["verdict"], again["evidence"], again["rule"]) == (verdict, evidence, claims.rule("12.same_seed"))
    with pytest.raises(ValueError, match="judges"):
        l12.rejudge({**entry, "id": "12.syncbn"})


def test_the_committed_same_seed_entries_are_what_todays_rule_gives():
    seen = 0
    for path in sorted(reference_dir().glob("*/12_*.json")):
        for c in json.loads(path.read_text()).get("claims", []):
            if c["id"] == "12.same_seed" and c.get("rule", 1) == claims.rule(c["id"]):
                assert l12.rejudge(c) == c, path
                seen += 1
    assert seen
