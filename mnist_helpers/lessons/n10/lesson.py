"""The speedrun's lesson code: what notebook 10 uses and no script needs (introduced in 10_speedrun).

The measurement code lives beside it, ``mnist_helpers.lessons.n10.speedrun`` (recipes, ``fixed_schedule``, the
protocol's rows and verdicts, ``first_crossing_run`` (the first-crossing reading), the per-machine settings, the peak), which the
scripts run too; notebook 10 imports it by its own name. Here:

- ``claims_10``, which judges the notebook's two claims from one measured record (tests/notebooks/test_n10_claims.py).
"""
from __future__ import annotations

from mnist_helpers.course import claims
from mnist_helpers.lessons.n10.speedrun import (MIN_SEEDS, RATIO_TARGETS, judge_protocol, net_label, protocol_evidence,
                                    settings_label)


# --------------------------------------------------------------------------- the notebook's claims

def claims_10(record: dict) -> list[dict]:
    """Notebook 10's two claims (the series' own, catalogued) under the fixed-schedule protocol, judged with
    :func:`speedrun.judge_protocol` from one measured record; no I/O.

    ``record``: ``runs`` ``{"fast": [...], "fast995": [...], "article": [...]}`` (each run a dict with ``final_acc``
    and ``train_s``, the test set scored once at the end of a fixed schedule), ``targets`` (the two accuracies),
    ``quick``, ``contention`` (the merged load record, :func:`speedrun.merge_contention`) and, for the regime,
    ``hyp``, ``hyp_995``, ``settings``, ``subset``, ``device``, ``threads``. Targets: the mean final accuracy at or
    above the target at >= 80x (99.0%) and >= 10x (99.5%) the article's training time (``speedrun.RATIO_TARGETS``),
    at least ``speedrun.MIN_SEEDS`` seeds;
    the notebook's few seeds can therefore show a target missed but not met (the benchmark,
    ``scripts/bench_speedrun.py``, runs 10). The quick profile (a subset, low targets) runs the code paths only:
    "inconclusive"; a busy machine gives "no verdict: the machine is busy"."""
    runs, targets = record["runs"], record["targets"]
    busy = (record.get("contention") or {}).get("busy")
    out = []
    for cid, role, hyp_key, target in (("10.speedrun_99", "fast", "hyp", targets[0]),
                                       ("10.speedrun_995", "fast995", "hyp_995", targets[1])):
        verdict, nums = judge_protocol(runs[role], runs["article"], target, RATIO_TARGETS[cid], MIN_SEEDS["cpu"])
        if record["quick"]:
            verdict = "inconclusive"  # a 1,024-image subset and low targets: the code paths, not the claim
        h = record[hyp_key]
        regime = (f"notebook 10's one-cell recipe `{hyp_key}` ({net_label(h['model'], h['width'])}, batch "
                  f"{h['batch_size']}, OneCycle {h['num_epochs']:g} epochs fixed in advance, "
                  f"{settings_label(record['settings'])}" + (f", shifts up to {h['translate']} px" if h["translate"]
                                                             else "")
                  + (f", test-time shifts of {h['tta']} px" if h.get("tta") else "")
                  + f"), {record['subset'] or 60_000:,} images, {len(runs[role])} seed(s) vs the article's recipe "
                  f"({len(runs['article'])} seed(s)), {record['device']}, {record['threads']} threads")
        out.append({"id": cid, "verdict": claims.BUSY if busy else verdict, "evidence": protocol_evidence(nums),
                    "numbers": nums, "regime": regime, "contention": record.get("contention")})
    return out
