"""Batch size and learning-rate scaling, measured (introduced in 04_batch_size_and_lr).

The article: "double the batch, double the LR" (the linear scaling rule, for SGD), "Adam is more complicated",
"batch 64-256 is reasonable for MNIST; 8 is unstable; 4096 is fast but generalises worse".

The lesson's code is written in the notebook's cells (d2l's ``#@save`` style): ``scaled_lr`` (the rules),
``warmup_factor`` (the ramp) and ``train_run`` (one run: the loop with ``loss.backward()`` and
``optimizer.step()``), and the base settings ``BASE_LR``/``BASE_BATCH``. ``make saved`` copies them into
``mnist_helpers/lessons/n04/saved.py`` (tests/course/test_saved.py checks it is current); this module and the harness take them from
there, so ``scripts/bench_batch_scaling.py`` runs the notebook's code and nothing is written twice.

The measurement harness lives beside this module, ``mnist_helpers/lessons/n04/batch_scaling.py`` (shared with
``scripts/bench_batch_scaling.py``); notebook 04 and the tests import it from there: ``fair_plan`` (the runs of a
fair test: real doublings from the base batch, the same epochs for every batch, a warm-up of about one epoch; plus
batch 8 against the base batch at equal epochs, and one tiny-step run labelled "where the rule breaks"), ``sweep``
(every run of a plan for every seed, calling back the functions it is given), ``judge`` (the five claims' verdicts
from the rows, with spread over seeds), ``summary`` (mean and spread per configuration, a DataFrame), ``regime``.
Here: ``explorer_table``/``batch_explorer`` (browse a sweep).

The claims: ``claims_04(rows, contention=, full=)`` (pure: the five claims as ``claims.record`` takes them, from
the full sweep when one is given, else from the notebook's reduced sweep), ``full_sweep()`` (loads the full sweep's
file), ``claims_table`` (the two side by side, in plain words, for the learner) and ``sweep_record`` (the reduced
sweep kept beside the claims).
"""
from __future__ import annotations

import statistics
from typing import Iterable

import pandas as pd

# the measurement harness and the claims' rule live beside this module (scripts/bench_batch_scaling.py runs them too):
# mnist_helpers.lessons.n04.batch_scaling (fair_plan, sweep, judge, ...), imported from there by notebook 04 and the tests
from mnist_helpers.course.display import show
from mnist_helpers.course.live import widgets
from mnist_helpers.lessons.n04.batch_scaling import RULES, judge, regime, summary, timing_busy, timing_calls
# the lesson's code, written in the notebook's cells and generated into mnist_helpers/lessons/n04/saved.py (`make saved`)
from mnist_helpers.lessons.n04.saved import BASE_BATCH


# ----------------------------------------------------------------- the claims this lesson settles

def _busy(contention) -> bool:
    if contention is None:
        return False
    return bool(contention.get("busy") if isinstance(contention, dict) else contention.busy)


def _contention_dict(contention):
    return contention if contention is None or isinstance(contention, dict) else contention.to_dict()


def full_sweep(machine_label: str | None = None, *, folders: Iterable | None = None) -> dict | None:
    """The full sweep of ``scripts/bench_batch_scaling.py`` to judge beside the notebook's reduced one: this
    machine's ``results/bench_batch_scaling.json`` if it ran it, else the reference folder's (this machine's label
    first), as the script wrote it (``profile`` full only); None when there is none."""
    import json

    from mnist_helpers.paths import reference_dir, results_dir

    candidates = list(folders) if folders is not None else [
        results_dir() / "bench_batch_scaling.json",
        *([reference_dir() / machine_label / "bench_batch_scaling.json"] if machine_label else []),
        *sorted(reference_dir().glob("*/bench_batch_scaling.json"))]
    for p in candidates:
        if p.is_file():
            data = json.loads(p.read_text())
            if data.get("profile") == "full":
                return data
    return None


def full_rows(full: dict) -> list[dict]:
    # JSON kept nan/inf as text
    return [{k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in r.items()} for r in full["runs"]]


def claims_04(rows: list[dict], *, contention=None, full: dict | None = None, model: str = "mlp") -> list[dict]:
    """The five claims notebook 04 settles, one dict each (``claims.ResultFile.claim``'s keyword arguments): from
    the full sweep ``full`` (a ``bench_batch_scaling.json`` as loaded by ``full_sweep()``; its regime names the
    script, machine and date) when one is given, else from the notebook's reduced sweep ``rows`` (``sweep``'s rows;
    ``contention``: the ``claims.Contention`` of its timings, or its dict). The rules are ``judge``'s."""
    from mnist_helpers.course.claims import BUSY

    live = judge(rows, busy=BUSY if _busy(contention) else None)
    fv, source, worst, frows = {}, None, None, None
    if full:
        frows = full_rows(full)
        calls = full.get("contention_by_call") or []
        timed = timing_calls(calls) or calls  # the calls that timed what 04.batch4096's "fast" reads
        worst = max(timed, key=lambda c: c.get("others_cpu_share") or 0.0) if timed else None
        fv = judge(frows, busy=BUSY if timing_busy(calls) else None)
        source = f"scripts/bench_batch_scaling.py on {full['machine_label']}, {full['date'][:10]}"
    out = []
    for cid, v in live.items():
        if cid in fv:
            out.append(dict(id=cid, verdict=fv[cid]["verdict"], evidence=f"full sweep: {fv[cid]['evidence']}",
                            numbers=fv[cid]["numbers"],
                            regime=f"full sweep, {source}: {regime(frows, full['config']['model'])}",
                            contention=worst if cid == "04.batch4096" else None))
        else:
            out.append(dict(id=cid, verdict=v["verdict"], evidence=f"reduced sweep: {v['evidence']}",
                            numbers=v["numbers"], regime=f"reduced sweep of this notebook: {regime(rows, model)}",
                            contention=_contention_dict(contention) if cid == "04.batch4096" else None))
    return out


def claims_table(rows: list[dict], *, contention=None, full: dict | None = None, model: str = "mlp") -> list[dict]:
    """For the learner, mid-notebook: per claim, what this run's reduced sweep says and what the full sweep says
    (labelled with its machine), in plain words (``claims.PLAIN``), with the reduced sweep's evidence."""
    from mnist_helpers.course.claims import CATALOG_IDS, PLAIN

    mine = {e["id"]: e for e in claims_04(rows, contention=contention, model=model)}
    other = {e["id"]: e for e in claims_04(rows, contention=contention, full=full, model=model)} if full else {}
    label = f"full sweep ({full['machine_label']})" if full else None
    return [{"the article says": CATALOG_IDS[cid]["claim"], "this run (reduced sweep)": PLAIN[e["verdict"]],
             **({label: PLAIN[other[cid]["verdict"]]} if full else {}), "what was measured": e["evidence"]}
            for cid, e in mine.items()]


def sweep_record(rows: list[dict], contention=None, seconds: float | None = None, model: str = "mlp") -> dict:
    """The reduced sweep as kept in the result file beside the claims (``claims.record(..., extra=)``)."""
    from mnist_helpers.course.claims import BUSY

    return {"reduced_sweep": {"regime": regime(rows, model),
                              "verdicts": judge(rows, busy=BUSY if _busy(contention) else None),
                              "summary": summary(rows).to_dict("records"),
                              "contention": _contention_dict(contention), "seconds": seconds}}


# ----------------------------------------------------------------- browsing a sweep

EXPLORER_METRICS = {"test_acc": "test accuracy", "train_acc": "train accuracy", "gap": "train - test accuracy",
                    "images_per_s": "training images/s", "loss_noise": "step-loss noise", "seconds": "seconds"}


def rows_for(rows: list[dict], optimizer: str, rule: str, base_batch: int = BASE_BATCH) -> list[dict]:
    """One rule's curve (the same-epoch runs), sorted by batch size; the base batch's fixed run starts every rule."""
    groups = ("doubling", "adam") if "group" in (rows[0] if rows else {}) else (None,)
    rs = [r for r in rows if r.get("group") in groups and r["optimizer"] == optimizer]
    out = [r for r in rs if r["rule"] == rule or (r["batch_size"] == base_batch and r["rule"] == "fixed")]
    return sorted(out, key=lambda r: r["batch_size"])


def explorer_table(rows: list[dict], optimizer: str, metric: str, base_batch: int = BASE_BATCH) -> pd.DataFrame:
    """One row per batch size, one column per LR rule of ``optimizer``, cells = ``metric`` averaged over seeds
    (NaN: not run)."""
    if optimizer not in RULES:
        raise ValueError(f"optimizer must be one of {', '.join(RULES)}; got {optimizer!r}")
    if metric not in EXPLORER_METRICS:
        raise ValueError(f"metric must be one of {', '.join(EXPLORER_METRICS)}; got {metric!r}")
    rules = RULES[optimizer]
    curves = {}
    for rule in rules:
        acc: dict[int, list] = {}
        for r in rows_for(rows, optimizer, rule, base_batch):
            acc.setdefault(r["batch_size"], []).append(r[metric])
        curves[rule] = {b: statistics.mean(v) for b, v in acc.items()}
    sizes = sorted({b for c in curves.values() for b in c})
    return pd.DataFrame([{"batch_size": b, **{rule: curves[rule].get(b) for rule in rules}} for b in sizes],
                        columns=["batch_size", *rules])


def show_explorer_table(rows: list[dict], optimizer: str, metric: str, base_batch: int = BASE_BATCH) -> None:
    """``explorer_table`` displayed: percentages for accuracies, captioned with the optimizer and metric."""
    df = explorer_table(rows, optimizer, metric, base_batch)
    fmt = "{:.2%}" if metric in ("test_acc", "train_acc", "gap") else "{:,.2f}"
    show(df, formats={rule: fmt for rule in RULES[optimizer]},
         caption=f"{optimizer.upper()} | {EXPLORER_METRICS[metric]}")


def batch_explorer(rows: list[dict], base_batch: int = BASE_BATCH, *, optimizer: str = "sgd",
                   metric: str = "test_acc", interactive: bool = True):
    """The batch-size explorer (04): pick an optimizer and a metric, see every LR rule against batch size.

    Shows the table for the starting choice first (the static output nbmake keeps); in JupyterLab
    it adds dropdowns that redraw the table and a plot. Returns the widget, or None when static."""
    show_explorer_table(rows, optimizer, metric, base_batch)
    w = widgets(interactive, "the table above is all this cell shows")
    if w is None:
        return None
    import matplotlib.pyplot as plt
    from IPython.display import display
    opt_w = w.Dropdown(options=list(RULES), value=optimizer, description="optimizer")
    met_w = w.Dropdown(options=[(v, k) for k, v in EXPLORER_METRICS.items()], value=metric, description="metric",
                       style={"description_width": "initial"})
    out = w.Output()

    def redraw(_=None):
        out.clear_output(wait=True)
        with out:
            df = explorer_table(rows, opt_w.value, met_w.value, base_batch)
            show_explorer_table(rows, opt_w.value, met_w.value, base_batch)
            fig, ax = plt.subplots(figsize=(6, 3))
            for rule, marker in zip(RULES[opt_w.value], "os^"):
                ax.plot(df["batch_size"], df[rule], marker + "-", label=rule)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size")
            ax.set_ylabel(EXPLORER_METRICS[met_w.value])
            ax.axvline(base_batch, color="gray", lw=0.8)
            ax.legend(fontsize=8)
            plt.show()

    opt_w.observe(redraw, names="value")
    met_w.observe(redraw, names="value")
    box = w.VBox([w.HBox([opt_w, met_w]), out])
    display(box)
    return box
