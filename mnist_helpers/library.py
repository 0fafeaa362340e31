"""The experience library: read back everything the series logged, compare, decide
(introduced in 09_profiling_and_autotune; built on ``mnist_helpers.experiments``).

The article ends with "record every experiment's configuration and result to build your own knowledge
base". Notebooks 01 onwards append runs to ``results/experiments.jsonl``; this module turns that log
into answers:

    from mnist_helpers import library
    rows = library.load()                          # flat rows (experiments.query), any notebook, any machine
    print(library.overview(rows))                  # runs per notebook and machine
    print(library.runs_table(rows))                # throughput and accuracy of every run that has them
    library.best_per_machine(rows)                 # fastest measured configuration per machine
    gains = library.lever_gains(rows)              # measured gains per tuning lever of the article
    library.priority_verdict(gains)                # is "batch & workers > LR & optimizer > AMP > distribution" true?
    library.export_csv(rows, "results/09_library.csv")
    library.dashboard(rows)                        # ipywidgets filter + plot; static text without a front-end

Every function accepts an empty list (a fresh clone) and says so instead of failing.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .experiments import flatten, query, read_log, table, to_csv  # noqa: F401 - re-exported for notebooks

THROUGHPUT_KEYS = ("images_per_s", "median_images_per_s")
ACCURACY_KEYS = ("final_test_acc", "test_acc")
LEVERS = {1: "batch size & workers", 2: "LR & optimizer", 3: "AMP & accumulation", 4: "distribution"}
PRIORITY_TAG = "priority"


def load(path=None, **filters) -> list[dict]:
    """Flat rows of the log (``experiments.query``), oldest first; filters as in ``query``."""
    return query(path, **filters)


def _number(row: dict, keys) -> float | None:
    for k in keys:
        v = row.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def throughput(row: dict) -> float | None:
    """Training images/s of a run, whatever the notebook called it (None if it logged no single number)."""
    return _number(row, THROUGHPUT_KEYS)


def accuracy(row: dict) -> float | None:
    return _number(row, ACCURACY_KEYS)


def machines(rows: list[dict]) -> list[str]:
    return sorted({r.get("machine") or "?" for r in rows})


def overview(rows: list[dict]) -> str:
    """How many runs each notebook logged on each machine."""
    if not rows:
        return "the experiment log is empty: run notebooks 01-08 (any profile) to fill it"
    counts = defaultdict(int)
    for r in rows:
        counts[(r.get("notebook"), r.get("machine"))] += 1
    out = [{"notebook": nb, "machine": m, "runs": n} for (nb, m), n in sorted(counts.items(), key=lambda kv: str(kv[0]))]
    return table(out, ["notebook", "machine", "runs"])


def comparable(rows: list[dict]) -> list[dict]:
    """Rows with a single throughput number, with ``throughput`` and ``accuracy`` columns added."""
    out = []
    for r in rows:
        ips = throughput(r)
        if ips is not None:
            out.append({**r, "throughput": ips, "accuracy": accuracy(r)})
    return out


RUN_COLUMNS = ["notebook", "name", "throughput", "accuracy", "config.batch_size", "config.num_workers",
               "config.amp", "config.loader", "machine"]


def runs_table(rows: list[dict], columns: list[str] | None = None, last: int | None = None) -> str:
    """Throughput (images/s) and accuracy of every run that logged them (or of the ``last`` N), across
    notebooks and machines."""
    rows = comparable(rows)
    if not rows:
        return "no run in the log has a throughput yet"
    shown = rows[-last:] if last else rows
    note = f"\n(the last {len(shown)} of {len(rows)} runs with a throughput)" if len(shown) < len(rows) else ""
    return table(shown, columns or RUN_COLUMNS) + note


def best_per_machine(rows: list[dict], min_accuracy: float | None = None) -> list[dict]:
    """The fastest run per machine (optionally among runs reaching ``min_accuracy``), with its configuration."""
    best: dict[str, dict] = {}
    for r in comparable(rows):
        if min_accuracy is not None and (r["accuracy"] is None or r["accuracy"] < min_accuracy):
            continue
        m = r.get("machine") or "?"
        if m not in best or r["throughput"] > best[m]["throughput"]:
            best[m] = r
    out = []
    for m, r in sorted(best.items()):
        config = {k[len("config."):]: v for k, v in r.items() if k.startswith("config.") and v is not None}
        out.append({"machine": m, "notebook": r["notebook"], "name": r["name"], "throughput": r["throughput"],
                    "accuracy": r["accuracy"], "config": config})
    return out


# --------------------------------------------------------------------------- the article's priority order

def _by_machine_name(rows, notebook):
    out = defaultdict(dict)
    for r in rows:
        if r.get("notebook") == notebook:
            out[r.get("machine")][r.get("name")] = r
    return out


def lever_gains(rows: list[dict]) -> list[dict]:
    """Measured speed-ups per tuning lever, from every notebook that measured one.

    A gain is "how many times sooner training gets to the same point": a throughput ratio, or for
    LR & optimizer a ratio of steps to the same accuracy. Sources: rows tagged ``priority`` (metrics
    ``lever`` 1-4 and ``gain``, logged by 09), 02's tensor vs DataLoader feed (lever 1), 05's bf16
    speed-up (lever 3), 06's 2-process vs 1-process throughput (lever 4).
    """
    gains = []

    def add(lever, gain, r, how):
        if isinstance(gain, (int, float)) and gain > 0:
            gains.append({"lever": lever, "lever_name": LEVERS[lever], "gain": float(gain), "how": how,
                          "notebook": r.get("notebook"), "name": r.get("name"), "machine": r.get("machine"),
                          "time": r.get("time")})

    for r in rows:
        if PRIORITY_TAG in (r.get("tags") or "").split(",") and r.get("lever") in LEVERS:
            add(r["lever"], r.get("gain"), r, r.get("how") or r.get("name"))
        if r.get("notebook") == "05" and isinstance(r.get("bf16_speedup"), (int, float)):
            add(3, r["bf16_speedup"], r, "bf16 over fp32 images/s (05)")
    for m, runs in _by_machine_name(rows, "02").items():
        t, d = runs.get("baseline-tensor"), runs.get("baseline-dataloader")
        if t and d and throughput(t) and throughput(d):
            add(1, throughput(t) / throughput(d), t, "in-memory tensors over DataLoader images/s (02)")
    by_ws = defaultdict(dict)
    for r in rows:
        if r.get("notebook") == "06" and isinstance(r.get("world_size"), int) and throughput(r):
            by_ws[r.get("machine")].setdefault(r["world_size"], r)  # first of each world size
    for m, ws in by_ws.items():
        if 1 in ws and 2 in ws:
            add(4, throughput(ws[2]) / throughput(ws[1]), ws[2], "2 processes over 1, images/s (06)")
    return gains


def priority_verdict(gains: list[dict], machine: str | None = None, tolerance: float = 0.05) -> dict:
    """Check the article's order (1 batch & workers, 2 LR & optimizer, 3 AMP & accumulation, 4 distribution).

    Per lever, the median of its measured gains (on ``machine``, or on all machines). ``holds`` when the gains fall
    in the article's order (within ``tolerance``), ``partly holds`` when lever 1 has the largest gain,
    ``does not hold here`` otherwise, ``not enough evidence`` with fewer than two levers measured.
    """
    import statistics

    per: dict[int, list[dict]] = defaultdict(list)
    for g in gains:
        if machine is None or g["machine"] == machine:
            per[g["lever"]].append(g)
    # the median over every measurement of a lever: one lucky (or unlucky) run on a busy machine cannot decide
    best = {k: {"gain": statistics.median(g["gain"] for g in gs), "n": len(gs),
                "how": "; ".join(sorted({g["how"] for g in gs})),
                "source": ", ".join(sorted({f"{g['notebook']}/{g['name']}" for g in gs}))} for k, gs in per.items()}
    levers = sorted(best)
    per_lever = [{"lever": k, "lever_name": LEVERS[k], "median_gain": best[k]["gain"], "measurements": best[k]["n"],
                  "how": best[k]["how"], "source": best[k]["source"]} for k in levers]
    measured_order = [k for k in sorted(levers, key=lambda k: -best[k]["gain"])]
    if len(levers) < 2:
        verdict = "not enough evidence"
    elif all(best[a]["gain"] * (1 + tolerance) >= best[b]["gain"] for a, b in zip(levers, levers[1:])):
        verdict = "holds"
    elif measured_order[0] == levers[0] == 1:
        verdict = "partly holds"
    else:
        verdict = "does not hold here"
    return {"verdict": verdict, "levers": per_lever, "measured_order": measured_order,
            "missing": [k for k in LEVERS if k not in best]}


# --------------------------------------------------------------------------- output

def export_csv(rows: list[dict], path) -> Path:
    """Every row to CSV (nested values such as histories become their JSON-ish text)."""
    import json

    flat = [{k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()} for r in rows]
    if not flat:
        flat = [{"notebook": None, "name": None}]  # a header, so the file is still a valid (empty) table
    return to_csv(flat, path)


def plot_runs(rows: list[dict], ax=None, title: str | None = None):
    """Horizontal bars: images/s of every comparable run, coloured by notebook, accuracy written at the end."""
    import matplotlib.pyplot as plt

    rows = comparable(rows)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, max(2.0, 0.35 * len(rows) + 1)))
    if not rows:
        ax.text(0.5, 0.5, "no run with a throughput in the log yet", ha="center", va="center")
        ax.set_axis_off()
        return ax
    notebooks = sorted({r["notebook"] for r in rows})
    colors = {nb: plt.cm.tab10(i % 10) for i, nb in enumerate(notebooks)}
    labels = [f"{r['notebook']} {r['name']}"[:40] for r in rows]
    ax.barh(range(len(rows)), [r["throughput"] for r in rows], color=[colors[r["notebook"]] for r in rows])
    for i, r in enumerate(rows):
        if r["accuracy"] is not None:
            ax.text(r["throughput"], i, f" {100 * r['accuracy']:.1f}%", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("training images/s (text: test accuracy)")
    ax.set_title(title or f"{len(rows)} logged runs on {len(machines(rows))} machine(s)")
    return ax


def plot_gains(verdict: dict, ax=None):
    """Bars of the median measured gain per lever, in the article's order."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    levers = verdict["levers"]
    if not levers:
        ax.text(0.5, 0.5, "no lever measured yet", ha="center", va="center")
        ax.set_axis_off()
        return ax
    ax.bar([f"{v['lever']}. {v['lever_name']}" for v in levers], [v["median_gain"] for v in levers], color="tab:blue")
    ax.axhline(1.0, color="gray", lw=1, ls="--")
    ax.set_ylabel("median measured gain (x)")
    ax.set_title(f"article's priority order: {verdict['verdict']}")
    ax.tick_params(axis="x", labelsize=8)
    return ax


def filter_rows(rows: list[dict], notebook: str = "all", machine: str = "all", text: str = "") -> list[dict]:
    """Rows of one notebook / one machine / whose name contains ``text`` ("all" keeps everything)."""
    return [r for r in rows if (notebook == "all" or r.get("notebook") == notebook)
            and (machine == "all" or r.get("machine") == machine)
            and (not text or text.lower() in str(r.get("name", "")).lower())]


def dashboard(rows: list[dict], interactive: bool | None = None, last: int | None = 20):
    """Filter the log by notebook, machine and name, and see the table and the plot update.

    Prints a static table and draws the plot first (what a saved or CI-executed notebook shows), then,
    when ipywidgets and a live kernel are there, returns the widgets that redraw on every change.
    """
    import matplotlib.pyplot as plt

    print(runs_table(rows, last=last))
    plot_runs(comparable(rows)[-last:] if last else rows)
    plt.show()
    if interactive is None:
        from .live import ipython_kernel_active
        interactive = ipython_kernel_active()
    if not interactive:
        return None
    try:
        import ipywidgets as w
    except ImportError:
        print("(ipywidgets is not installed: the static view above is all there is)")
        return None
    nb = w.Dropdown(options=["all"] + sorted({str(r.get("notebook")) for r in rows}), description="notebook")
    mc = w.Dropdown(options=["all"] + machines(rows), description="machine")
    tx = w.Text(value="", description="name has")
    out = w.Output()

    def redraw(*_):
        out.clear_output(wait=True)
        with out:
            chosen = filter_rows(rows, nb.value, mc.value, tx.value)
            print(runs_table(chosen, last=last))
            plot_runs(comparable(chosen)[-last:] if last else chosen)
            plt.show()

    for control in (nb, mc, tx):
        control.observe(redraw, names="value")
    return w.VBox([w.HBox([nb, mc, tx]), out])
