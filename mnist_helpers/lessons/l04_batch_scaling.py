"""Batch size and learning-rate scaling rules, measured (introduced in 04_batch_size_and_lr).

The article: "double the batch, double the LR" (the linear scaling rule, for SGD), "Adam is more complicated",
"batch 64-256 is reasonable for MNIST; 8 is unstable; 4096 is fast but generalises worse". We test them with
one sweep: every batch size trains for the *same number of epochs* (so every run sees the same samples and a
batch twice as big takes half as many steps), under each learning-rate rule:

- SGD (momentum 0.9): ``fixed`` (base LR everywhere), ``linear`` (LR x batch/base), ``linear+warmup`` (linear,
  reached by a linear ramp from the base LR over the first ``warmup_frac`` of the steps; Goyal et al. 2017);
- Adam: ``fixed``, ``linear``, ``sqrt`` (LR x sqrt(batch/base), the rule that matches Adam's noise scaling).

``train_run`` is one run (the core's ``train_one_epoch``, with an optional warm-up scheduler); ``batch_lr_sweep``
returns one row per run (test and train accuracy, generalisation gap, time, images/s, the per-step loss noise,
divergence) and can log every run to the experiment log. ``scaling_verdicts`` turns the rows into verdicts on the
article's claims. ``explorer_table`` (a DataFrame: batch size x LR rule) and ``batch_explorer`` (that table and a
plot, with dropdowns in JupyterLab) let the reader browse the sweep.
"""
from __future__ import annotations

import math
import statistics
from typing import Callable, Iterable

import pandas as pd
import torch

from mnist_helpers.data import TensorBatches
from mnist_helpers.display import show
from mnist_helpers.train import TrainConfig, build_training, evaluate, select_device, train_one_epoch

RULES = {"sgd": ("fixed", "linear", "linear+warmup"), "adam": ("fixed", "linear", "sqrt")}
BASE_LR = {"sgd": 0.05, "adam": 1e-3}  # SGD: Goyal et al.'s 0.1 per 256 images; Adam: the article's 1e-3


def scaled_lr(rule: str, base_lr: float, base_batch: int, batch_size: int) -> float:
    """The learning rate a rule gives ``batch_size`` when ``base_lr`` suits ``base_batch``."""
    k = batch_size / base_batch
    if rule == "fixed":
        return base_lr
    if rule in ("linear", "linear+warmup"):
        return base_lr * k
    if rule == "sqrt":
        return base_lr * math.sqrt(k)
    raise ValueError(f"rule must be one of fixed, linear, linear+warmup, sqrt; got {rule!r}")


def warmup_factor(step: int, warmup_steps: int, start: float) -> float:
    """LR multiplier at ``step``: linear from ``start`` to 1 over ``warmup_steps`` steps, then 1."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    return start + (1.0 - start) * step / warmup_steps


def _plan(batch_sizes, optimizers, base_batch, rules):
    """(optimizer, rule, batch_size) triples to run. At ``base_batch`` every rule gives the base LR, so one run
    stands for all; warm-up only changes anything when the scaled LR exceeds the base (batch > base_batch)."""
    plan = []
    for opt in optimizers:
        for rule in rules.get(opt, RULES[opt]):
            for b in batch_sizes:
                if b == base_batch and rule != "fixed":
                    continue
                if rule == "linear+warmup" and b < base_batch:
                    continue
                plan.append((opt, rule, b))
    return plan


def train_run(data, *, batch_size: int, lr: float, optimizer: str = "sgd", model: str = "net", num_epochs: int = 1,
              warmup_frac: float = 0.0, warmup_from: float | None = None, seed: int = 0, device: str = "cpu", eval_batch_size: int = 1000) -> dict:
    """One run on in-memory tensors ``data = (X, y, X_test, y_test)``. Returns accuracies (test, and train on
    as many training images as there are test images), the generalisation gap, time, images/s, steps,
    the relative per-step loss noise over the second half of training, and ``diverged``."""
    X, y, X_test, y_test = data
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if batch_size > len(X):
        raise ValueError(f"batch_size={batch_size} is larger than the {len(X)} training images; use a bigger subset")
    if not 0.0 <= warmup_frac < 1.0:
        raise ValueError(f"warmup_frac must be in [0, 1), got {warmup_frac!r}")
    cfg = TrainConfig(model=model, batch_size=batch_size, lr=lr, optimizer=optimizer, num_epochs=num_epochs,
                      seed=seed, device=device)
    dev = select_device(device)
    batches = TensorBatches(X, y, batch_size, shuffle=True, seed=seed)
    tr = build_training(cfg, dev, steps_per_epoch=len(batches))
    total_steps = len(batches) * num_epochs
    warmup_steps = max(1, int(round(warmup_frac * total_steps))) if warmup_frac > 0 else 0
    if warmup_steps:
        # Goyal et al.: start from the LR that suits the small batch (warmup_from) and ramp up to lr.
        start = min(1.0, (warmup_from or lr) / lr)
        tr.scheduler = torch.optim.lr_scheduler.LambdaLR(
            tr.optimizer, lambda s: warmup_factor(s, warmup_steps, start))
    step_losses: list[float] = []
    prev = {"mean": 0.0, "images": 0}

    def on_step(step, running_mean):  # recover each step's own loss from the running mean
        seen = min(step * batch_size, len(X))
        n = seen - prev["images"]
        step_losses.append((running_mean * seen - prev["mean"] * prev["images"]) / n if n else float("nan"))
        prev["mean"], prev["images"] = running_mean, seen

    seconds = images = steps = 0
    last_loss = float("nan")
    for epoch in range(1, num_epochs + 1):
        batches.set_epoch(epoch)
        prev.update(mean=0.0, images=0)
        stats = train_one_epoch(tr, batches, cfg, on_step=on_step)
        seconds += stats["seconds"]
        images += stats["images"]
        steps += stats["steps"]
        last_loss = stats["loss"]
    ev = evaluate(tr.model, X_test, y_test, eval_batch_size)
    n = min(len(X), len(X_test))
    ev_train = evaluate(tr.model, X[:n], y[:n], eval_batch_size)
    tail = [v for v in step_losses[len(step_losses) // 2:] if math.isfinite(v)]
    noise = (statistics.pstdev(tail) / statistics.mean(tail)) if len(tail) > 1 and statistics.mean(tail) > 0 \
        else float("nan")
    # diverged: the loss blew up beyond chance level (ln 10 = 2.30 for 10 classes) instead of going down
    diverged = not (math.isfinite(last_loss) and math.isfinite(ev["loss"])) or max(last_loss, ev["loss"]) > 1.5 * math.log(10)
    return {"test_acc": ev["acc"], "train_acc": ev_train["acc"], "gap": ev_train["acc"] - ev["acc"],
            "test_loss": ev["loss"], "train_loss": last_loss, "seconds": seconds,
            "images_per_s": images / seconds if seconds else float("nan"), "steps": steps, "images": images,
            "loss_noise": noise, "warmup_steps": warmup_steps, "diverged": diverged}


def batch_lr_sweep(data, *, batch_sizes: Iterable[int] = (8, 32, 128, 512, 2048, 4096),
                   optimizers: Iterable[str] = ("sgd", "adam"), rules: dict | None = None, base_batch: int = 128,
                   base_lr: dict | None = None, model: str = "net", num_epochs: int = 1, warmup_frac: float = 0.25,
                   seed: int = 0, device: str = "cpu", log_notebook: str | None = None, log_path=None,
                   tags: Iterable[str] = (),
                   on_run: Callable[[dict], None] | None = None) -> list[dict]:
    """Every (optimizer, rule, batch size) run with the same number of epochs; one row per run.

    ``data``: ``(X, y, X_test, y_test)`` tensors. ``log_notebook``: when set, each run is appended to the
    experiment log (``experiments.log_run``) with tag ``batch-lr`` plus ``tags`` (e.g. a run id to read back).
    ``on_run(row)`` is called after each run
    (print progress from it)."""
    batch_sizes = list(batch_sizes)
    optimizers = list(optimizers)
    if not batch_sizes:
        raise ValueError("batch_sizes must list at least one batch size, e.g. (32, 128, 512)")
    for b in batch_sizes:
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise ValueError(f"batch sizes must be positive integers, got {b!r}")
    for o in optimizers:
        if o not in RULES:
            raise ValueError(f"optimizer must be sgd or adam, got {o!r}")
    rules = rules or RULES
    for o, rs in rules.items():
        for r in rs:
            scaled_lr(r, 1.0, 1, 1)  # validates the rule's name
    base_lr = {**BASE_LR, **(base_lr or {})}
    rows = []
    for opt, rule, b in _plan(batch_sizes, optimizers, base_batch, rules):
        lr = scaled_lr(rule, base_lr[opt], base_batch, b)
        wf = warmup_frac if rule == "linear+warmup" else 0.0
        m = train_run(data, batch_size=b, lr=lr, optimizer=opt, model=model, num_epochs=num_epochs,
                      warmup_frac=wf, warmup_from=base_lr[opt], seed=seed, device=device)
        row = {"optimizer": opt, "rule": rule, "batch_size": b, "lr": lr, **m}
        rows.append(row)
        if log_notebook:
            from mnist_helpers.experiments import log_run
            log_run(log_notebook, f"{opt}-{rule}-b{b}",
                    config={"model": model, "optimizer": opt, "rule": rule, "batch_size": b, "lr": lr,
                            "base_batch": base_batch, "base_lr": base_lr[opt], "num_epochs": num_epochs,
                            "train_images": len(data[0]), "test_images": len(data[2]), "warmup_frac": wf,
                            "seed": seed, "device": device},
                    metrics=m, tags=["batch-lr", *tags], path=log_path)
        if on_run:
            on_run(row)
    return rows


def rows_for(rows: list[dict], optimizer: str, rule: str, base_batch: int = 128) -> list[dict]:
    """One rule's curve, sorted by batch size; the shared base-batch run is included in every rule."""
    out = [r for r in rows if r["optimizer"] == optimizer and (r["rule"] == rule or
           (r["batch_size"] == base_batch and r["rule"] == "fixed"))]
    if rule == "linear+warmup":  # below the base batch warm-up is the linear rule
        out += [r for r in rows if r["optimizer"] == optimizer and r["rule"] == "linear" and r["batch_size"] < base_batch]
    return sorted(out, key=lambda r: r["batch_size"])


def _acc(rows, optimizer, rule, batch_size, base_batch):
    for r in rows_for(rows, optimizer, rule, base_batch):
        if r["batch_size"] == batch_size:
            return r["test_acc"]
    return None


def scaling_verdicts(rows: list[dict], base_batch: int = 128, margin: float = 0.005) -> list[dict]:
    """Verdicts (claim, verdict, evidence) on the article's four claims from a ``batch_lr_sweep`` table.
    ``margin``: the accuracy difference (0.005 = half a point) below which two runs count as equal."""
    if not rows:
        raise ValueError("no runs: call batch_lr_sweep first")
    sizes = sorted({r["batch_size"] for r in rows})
    big = [b for b in sizes if b > base_batch]
    out = []
    # 1. linear scaling for SGD
    if big and any(r["optimizer"] == "sgd" for r in rows):
        wins, ev = 0, []
        for b in big:
            fixed = _acc(rows, "sgd", "fixed", b, base_batch)
            lin = max(a for a in (_acc(rows, "sgd", "linear", b, base_batch),
                                  _acc(rows, "sgd", "linear+warmup", b, base_batch), -1.0) if a is not None)
            if fixed is None or lin < 0:
                continue
            wins += lin > fixed + margin
            ev.append(f"b{b}: fixed {fixed:.1%} vs linear(best of +/-warm-up) {lin:.1%}")
        # the same rule read downwards: halve the batch, halve the LR
        down, ev_down = 0, []
        for b in [b for b in sizes if b < base_batch]:
            fixed, lin = _acc(rows, "sgd", "fixed", b, base_batch), _acc(rows, "sgd", "linear", b, base_batch)
            if None not in (fixed, lin):
                down += lin > fixed + margin
                ev_down.append(f"b{b}: fixed {fixed:.1%} vs linear {lin:.1%}")
        v = ("holds here" if wins == len(ev) and ev else "partly holds here" if wins else "does not hold here")
        if ev_down and down == len(ev_down) and wins < len(ev):
            v += " going up; it holds going down (smaller batch, smaller LR)"
        out.append({"claim": "double the batch, double the LR (SGD)", "verdict": v,
                    "evidence": f"linear scaling beats a fixed LR at {wins}/{len(ev)} batch sizes > {base_batch}: "
                                + "; ".join(ev) + (f"; below {base_batch} at {down}/{len(ev_down)}: " + "; ".join(ev_down)
                                                   if ev_down else "")})
    # 2. Adam is different: at the largest batch, does sqrt beat linear (and linear help less than for SGD)?
    if big and any(r["optimizer"] == "adam" for r in rows):
        b = big[-1]
        a_lin, a_sqrt, a_fix = (_acc(rows, "adam", r, b, base_batch) for r in ("linear", "sqrt", "fixed"))
        s_lin, s_fix = (_acc(rows, "sgd", r, b, base_batch) for r in ("linear", "fixed"))
        if None in (a_lin, a_sqrt, a_fix):
            v, e = "not tested", "the sweep lacks Adam linear/sqrt/fixed runs at a batch above the base"
        else:
            adam_gain = a_lin - a_fix
            sgd_gain = (s_lin - s_fix) if None not in (s_lin, s_fix) else None
            differs = a_sqrt > a_lin + margin or (sgd_gain is not None and sgd_gain - adam_gain > margin)
            v = "holds here" if differs else "does not hold here"
            e = (f"batch {b}: Adam fixed {a_fix:.1%}, linear {a_lin:.1%}, sqrt {a_sqrt:.1%}"
                 + (f"; linear scaling gains SGD {sgd_gain:+.1%} but Adam {adam_gain:+.1%}" if sgd_gain is not None else ""))
        out.append({"claim": "Adam is different (linear scaling is not its rule)", "verdict": v, "evidence": e})
    # 3. batch 8 is unstable (fixed LR, the article's set-up)
    small = sizes[0]
    base_rows = [r for r in rows if r["batch_size"] == base_batch and r["rule"] == "fixed"]
    small_rows = [r for r in rows if r["batch_size"] == small and r["rule"] == "fixed"]
    if small < base_batch and base_rows and small_rows:
        ev, unstable = [], 0
        for s in small_rows:
            b = next(r for r in base_rows if r["optimizer"] == s["optimizer"])
            bad = s["diverged"] or s["test_acc"] < b["test_acc"] - 2 * margin
            unstable += bad
            ev.append(f"{s['optimizer']}: batch {small} {s['test_acc']:.1%} (loss noise {s['loss_noise']:.2f}) vs "
                      f"batch {base_batch} {b['test_acc']:.1%} (noise {b['loss_noise']:.2f})")
        v = ("holds here" if unstable == len(small_rows) else "partly holds here" if unstable
             else "does not hold here (noisier steps, but it trains fine)")
        out.append({"claim": f"batch {small} is unstable", "verdict": v, "evidence": "; ".join(ev)})
    # 4. the largest batch is fast but generalises worse
    top = sizes[-1]
    if top > base_batch and base_rows:
        ev, fast, worse, wider = [], 0, 0, 0
        for b in base_rows:
            cands = [r for r in rows if r["optimizer"] == b["optimizer"] and r["batch_size"] == top]
            if not cands:
                continue
            t = max(cands, key=lambda r: r["test_acc"])  # the best rule there: the fairest comparison
            speed = t["images_per_s"] / b["images_per_s"]
            fast += speed > 1.1
            worse += t["test_acc"] < b["test_acc"] - margin
            wider += t["gap"] > b["gap"] + margin
            ev.append(f"{b['optimizer']}: batch {top} ({t['rule']}) {speed:.2f}x the images/s of batch {base_batch}, "
                      f"test {t['test_acc']:.1%} vs {b['test_acc']:.1%}, gap {t['gap']:+.1%} vs {b['gap']:+.1%}")
        n = len(ev)
        v_fast = "fast: yes" if fast == n else "fast: partly" if fast else "fast: no"
        word = lambda k: "yes" if k == n else "partly" if k else "no"  # noqa: E731
        v_worse = f"lower test accuracy: {word(worse)}; wider train-test gap: {word(wider)}"
        out.append({"claim": f"batch {top} is fast but generalises worse", "verdict": f"{v_fast}; {v_worse}",
                    "evidence": "; ".join(ev)})
    return out


EXPLORER_METRICS = {"test_acc": "test accuracy", "train_acc": "train accuracy", "gap": "train - test accuracy",
                    "images_per_s": "training images/s", "loss_noise": "step-loss noise", "seconds": "seconds"}


def explorer_table(rows: list[dict], optimizer: str, metric: str, base_batch: int = 128) -> pd.DataFrame:
    """One row per batch size, one column per LR rule of ``optimizer``, cells = ``metric`` (NaN: not run)."""
    if optimizer not in RULES:
        raise ValueError(f"optimizer must be one of {', '.join(RULES)}; got {optimizer!r}")
    if metric not in EXPLORER_METRICS:
        raise ValueError(f"metric must be one of {', '.join(EXPLORER_METRICS)}; got {metric!r}")
    rules = RULES[optimizer]
    curves = {rule: {r["batch_size"]: r[metric] for r in rows_for(rows, optimizer, rule, base_batch)} for rule in rules}
    sizes = sorted({b for c in curves.values() for b in c})
    return pd.DataFrame([{"batch_size": b, **{rule: curves[rule].get(b) for rule in rules}} for b in sizes],
                        columns=["batch_size", *rules])


def show_explorer_table(rows: list[dict], optimizer: str, metric: str, base_batch: int = 128) -> None:
    """``explorer_table`` displayed: percentages for accuracies, captioned with the optimizer and metric."""
    df = explorer_table(rows, optimizer, metric, base_batch)
    fmt = "{:.2%}" if metric in ("test_acc", "train_acc", "gap") else "{:,.2f}"
    show(df, formats={rule: fmt for rule in RULES[optimizer]},
         caption=f"{optimizer.upper()} | {EXPLORER_METRICS[metric]}")


def batch_explorer(rows: list[dict], base_batch: int = 128, *, optimizer: str = "sgd", metric: str = "test_acc",
                   interactive: bool = True):
    """The batch-size explorer (04): pick an optimizer and a metric, see every LR rule against batch size.

    Shows the table for the starting choice first (the static output nbmake keeps); in JupyterLab
    it adds dropdowns that redraw the table and a plot. Returns the widget, or None when static."""
    show_explorer_table(rows, optimizer, metric, base_batch)
    if not interactive:
        return None
    try:
        import ipywidgets as w
        import matplotlib.pyplot as plt
        from IPython.display import display
    except ImportError:
        print("(ipywidgets is not installed: the table above is all this cell shows)")
        return None
    opt_w = w.Dropdown(options=list(RULES), value=optimizer, description="optimizer")
    met_w = w.Dropdown(options=[(v, k) for k, v in EXPLORER_METRICS.items()], value=metric, description="metric",
                       style={"description_width": "initial"})
    out = w.Output()

    def redraw(_=None):
        out.clear_output(wait=True)
        with out:
            show_explorer_table(rows, opt_w.value, met_w.value, base_batch)
            fig, ax = plt.subplots(figsize=(6, 3))
            for rule, marker in zip(RULES[opt_w.value], "os^"):
                curve = rows_for(rows, opt_w.value, rule, base_batch)
                ax.plot([r["batch_size"] for r in curve], [r[met_w.value] for r in curve], marker + "-", label=rule)
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
