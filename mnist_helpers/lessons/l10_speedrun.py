"""The speedrun: from the article's recipe to the fastest time-to-99% (introduced in 10_speedrun).

The measurement harness lives in the core, ``mnist_helpers.speedrun``, which the scripts run too
(``scripts/bench_time_to_accuracy.py``, ``scripts/device_check.py``, ``scripts/make_claims.py``): recipes as data
(``Recipe``; ``chain()``, the notebook's ladder from the article's recipe; ``fastest`` and ``ladder_995``),
``time_to_accuracy``, the per-machine settings (``choose_settings``), ``summarize`` and ``show_summary``,
``measure_peak_flops`` and the verdicts on the series' targets (``judge_target``, ``target_evidence``,
``merge_contention``, ``earlier_recipe``). This module names them as before, so notebook 10 and the tests call
``speedrun.<name>`` on the lesson, and keeps what no script needs:

- ``choice_table``: :func:`choose_settings`'s measurement as a DataFrame;
- ``compare(recipes, seeds)`` runs several recipes side by side (interleaved by seed, so that a machine whose
  load changes hurts every recipe alike); ``speedup`` divides times to a target;
- ``training_flops_per_image``, the cost set against the physical limit (``measure_peak_flops``);
- ``claims_10``, which judges the notebook's two claims (tests/test_claims_10.py).
"""
from __future__ import annotations

from typing import Callable, Iterable

import pandas as pd
from torch import nn

from mnist_helpers.display import table
from mnist_helpers.models import flops_per_image
from mnist_helpers.speedrun import (Recipe, judge_target, net_label, run_line, settings_label, target_evidence,
                                    time_to_accuracy)
# the harness lives in the core (mnist_helpers.speedrun: the benchmark and device_check run it too); named here as
# before, so notebook 10 and the tests call speedrun.<name> on this lesson
from mnist_helpers.speedrun import (ARTICLE, CLAIM_RECIPES, HYP_995, LADDER_995, LEVELS, SETTINGS,  # noqa: F401
                                    cached_choice, candidate_settings, chain, choose_settings, earlier_recipe,
                                    fast_base, fastest, get_recipe, ladder_995, measure_peak_flops,
                                    merge_contention, onecycle_lr, pick_setting, random_translate, recipe_changes,
                                    recipes, show_summary, skip_reason, summarize, summary_table)


# --------------------------------------------------------------------------- choosing per machine

def choice_table(result: dict) -> pd.DataFrame:
    """:func:`choose_settings`'s rows as a DataFrame, fastest first."""
    cols = ["setting", "images_per_s", "iqr_images_per_s", "vs_float32_eager", "setup_s", "chosen", "status", "error"]
    rows = sorted(result["rows"], key=lambda r: -(r.get("images_per_s") or 0))
    return table([{c: r.get(c) for c in cols} for r in rows])


# --------------------------------------------------------------------------- several runs

def compare(recipe_list: list[Recipe], seeds: Iterable[int], targets=(0.99, 0.995), *, verbose: bool = True,
            per_recipe: dict[str, dict] | None = None, on_run: Callable[[dict], None] | None = None,
            **kwargs) -> list[dict]:
    """Every recipe once per seed, interleaved (seed 0 of each, then seed 1 ...) so that changes in machine
    load fall on all recipes alike. ``kwargs`` go to every ``time_to_accuracy`` call, ``per_recipe[name]`` to that
    recipe's only. Returns the runs (``time_to_accuracy`` dicts); ``on_run`` sees each as it finishes."""
    runs = []
    for seed in seeds:
        for recipe in recipe_list:
            run = time_to_accuracy(recipe, targets, seed=seed, **{**kwargs, **(per_recipe or {}).get(recipe.name, {})})
            runs.append(run)
            if verbose:
                print(run_line(run), flush=True)
            if on_run:
                on_run(run)
    return runs


def speedup(rows: list[dict], baseline: str, target: float = 0.99) -> dict[str, float | None]:
    """Baseline's mean time-to-target / each recipe's (None where a recipe missed the target in some run)."""
    key = f"{target:g}"
    by = {r["recipe"]: r for r in rows}
    if baseline not in by:
        raise ValueError(f"baseline {baseline!r} not among the recipes {list(by)}")

    def t(r):
        return r[f"t{key}_mean"] if r[f"t{key}_reached"] == r["runs"] else None

    base = t(by[baseline])
    return {name: (base / t(r) if base and t(r) else None) for name, r in by.items()}


# --------------------------------------------------------------------------- the physical limit

def training_flops_per_image(model: nn.Module) -> int:
    """Forward FLOPs x 3: the backward pass costs about twice the forward (gradients for inputs and weights); the
    approximation of Kaplan et al. 2020, "Scaling Laws for Neural Language Models" (2N FLOPs per token forward,
    6N to train)."""
    return 3 * flops_per_image(model)


# --------------------------------------------------------------------------- the notebook's claims

def claims_10(*, targets: tuple, t99: list, t995: list, article_t: float | None, article_train_s: float,
              article_epochs: float, hyp: dict, hyp_995: dict, settings: dict, subset: int | None, device: str,
              threads: int, machine_label: str, quick: bool, contention: dict | None) -> list[dict]:
    """Notebook 10's two claims (the series' own, catalogued), judged with :func:`judge_target`; no I/O.

    ``t99`` / ``t995``: per seed, the training seconds of ``hyp`` to ``targets[0]`` and of ``hyp_995`` to
    ``targets[1]`` (None: missed). ``article_t``: the article's recipe to ``targets[0]`` (one seed, None: missed
    within its ``article_epochs``, then ``article_train_s`` bounds it). Targets: 99.0% in at most 3 s and at least
    40x the article's recipe (30x on a machine without AMX, from ``machine_label``); 99.5% in at most 60 s. The
    quick profile (a small subset, low targets) runs the code paths only: "inconclusive". ``contention``: the
    merged record of every timed run (:func:`merge_contention`); busy gives "no verdict: the machine is busy"."""
    v99, n99 = judge_target(t99, 3.0, [article_t], 40.0 if "amx" in machine_label else 30.0,
                            baseline_budget_s=[article_train_s])  # a miss: at least its training
    v995, n995 = judge_target(t995, 60.0)
    if quick:
        v99 = v995 = "inconclusive"  # a 1,024-image subset and low targets: the code paths, not the claim
    busy = "no verdict: the machine is busy" if contention and contention.get("busy") else None

    def regime(name, h, vs_article):  # the recipe timed and where, in the benchmark's words
        return (f"notebook 10's one-cell recipe `{name}` ({net_label(h['model'], h['width'])}, batch "
                f"{h['batch_size']}, OneCycle {h['num_epochs']:g} epochs, {settings_label(settings)}"
                + (f", shifts up to {h['translate']} px" if h["translate"] else "") + f"), {subset or 60_000:,} "
                + f"images, {len(t99)} seed(s)" + (" vs the article's recipe (1 seed)" if vs_article else "")
                + f", {device}, {threads} threads")

    out = []
    for cid, verdict, nums, key, text in (("10.speedrun_99", v99, n99, targets[0], regime("hyp", hyp, True)),
                                          ("10.speedrun_995", v995, n995, targets[1],
                                           regime("hyp_995", hyp_995, False))):
        nums = {"target_acc": key, **{k: v for k, v in nums.items() if v is not None}}
        out.append({"id": cid, "verdict": busy or verdict, "evidence": target_evidence(nums, article_epochs),
                    "numbers": nums, "regime": text, "contention": contention})
    return out
