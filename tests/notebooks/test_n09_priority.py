"""The article's tuning priority, measured (notebook 09): time to accuracy, the lever plan, the verdict on the gains."""
import pytest
import torch

from mnist_helpers.course.claims import VERDICTS
from mnist_helpers.lessons.n09.lesson import (ARTICLE_BASELINE, LEVERS, lever_plan, paired_gains, plot_gains,
                                                 priority_verdict, runs_summary)
from mnist_helpers.lessons.n09.profiling import time_to_accuracy
from mnist_helpers.train import TrainConfig


def rows_from(times: dict[int, list[float]]) -> list[dict]:
    """Side-by-side rows: lever 0 is the baseline; times[lever][seed] in seconds."""
    return [{"name": "baseline" if lev == 0 else f"{lev}. {LEVERS[lev]}", "lever": lev, "seed": seed,
             "seconds": t, "images": 1000, "nproc": 1} for lev, ts in times.items() for seed, t in enumerate(ts)]


def test_gains_in_the_articles_order_hold():
    rows = rows_from({0: [10, 11, 9], 1: [2, 2.2, 1.8], 2: [4, 4.4, 3.6], 3: [6, 6.5, 5.5], 4: [8, 8.5, 7.5]})
    v = priority_verdict(rows)
    assert v["verdict"] == "holds" and v["measured_order"] == [1, 2, 3, 4] and v["missing"] == []
    assert paired_gains(rows, "1. batch size & workers") == pytest.approx([5.0, 5.0, 5.0])


def test_a_separated_inversion_does_not_hold_and_an_overlap_is_inconclusive():
    inverted = rows_from({0: [10, 10, 10], 1: [5, 5.2, 4.9], 2: [8, 8.1, 7.9], 3: [2, 2.1, 1.9]})
    v = priority_verdict(inverted)
    assert v["verdict"] == "does not hold here" and "lever 3 beats lever 1" in v["why"] and v["missing"] == [4]
    overlap = rows_from({0: [10, 10, 10], 1: [5, 6, 4], 2: [5.5, 4.5, 6.5], 3: [9, 9.5, 8.5]})
    assert priority_verdict(overlap)["verdict"] == "inconclusive"
    few = rows_from({0: [10], 1: [2], 2: [5]})  # one seed cannot separate anything
    assert priority_verdict(few)["verdict"] == "inconclusive"
    assert all(priority_verdict(r)["verdict"] in VERDICTS for r in (inverted, overlap, few))


def test_runs_that_miss_the_target_have_no_gain():
    rows = rows_from({0: [10, 10, 10], 1: [None, 5, 5], 2: [None, None, None]})
    summary = {s["name"]: s for s in runs_summary(rows)}
    assert summary["1. batch size & workers"]["reached"] == "2/3"
    assert summary["1. batch size & workers"]["gain"] == pytest.approx(2.0)
    assert summary["2. LR & optimizer"]["gain"] is None and summary["2. LR & optimizer"]["median_s"] is None
    v = priority_verdict(rows)
    assert v["verdict"] == "inconclusive" and 2 in v["missing"]


def test_plot_gains_draws_measured_and_empty_runs():
    import matplotlib
    matplotlib.use("Agg")
    plot_gains(rows_from({0: [10, 10, 10], 1: [5, 4, 6]}), {"verdict": "inconclusive"})
    plot_gains([])


def test_lever_plan_applies_each_lever_alone_and_keeps_the_global_batch():
    plan = lever_plan(ARTICLE_BASELINE, {1: {"loader": "tensor", "num_workers": 0}, 3: {"amp": "bf16"}, 4: {}},
                      extra={"autotune's choice": {"batch_size": 256, "nproc": 1}})
    by = {p["name"]: p for p in plan}
    assert "1. loader=tensor, num_workers=0" in by, "each lever is named by what it changes, as measured"
    base = by["baseline"]["cfg"]
    assert (base.loader, base.num_workers, base.batch_size, base.lr, base.amp) == ("dataloader", 4, 128, 1e-3, "none")
    assert by["3. amp=bf16"]["cfg"] == base.replace(amp="bf16")
    dist = by["4. 2 processes x 64"]
    assert dist["nproc"] == 2 and dist["cfg"].batch_size * dist["nproc"] == base.batch_size
    assert by["autotune's choice"]["lever"] is None and by["autotune's choice"]["cfg"].batch_size == 256
    with pytest.raises(ValueError, match="the article's levers are"):
        lever_plan(ARTICLE_BASELINE, {5: {}})
    with pytest.raises(ValueError, match="needs nproc >= 2"):
        lever_plan(ARTICLE_BASELINE, {4: {"nproc": 1}})


def test_time_to_accuracy_stops_at_the_target_and_restores_threads(small_mnist):
    _, _, X_test, y_test = small_mnist
    cfg = TrainConfig(model="fastnet", batch_size=32, subset=512, lr=3e-3, threads=1)
    before = torch.get_num_threads()
    res = time_to_accuracy(cfg, X_test[:200], y_test[:200], 0.3, eval_every_images=64, max_images=4096)
    assert res["reached"] and res["seconds"] > 0 and res["final_acc"] >= 0.3
    assert [c[0] for c in res["curve"]] == list(range(64, res["images"] + 1, 64))  # every 64 images, then stop
    assert torch.get_num_threads() == before
    missed = time_to_accuracy(cfg, X_test[:200], y_test[:200], 0.999, eval_every_images=64, max_images=128)
    assert not missed["reached"] and missed["seconds"] is None and missed["images"] == 128
    with pytest.raises(ValueError, match="target must be an accuracy"):
        time_to_accuracy(cfg, X_test, y_test, 97)
