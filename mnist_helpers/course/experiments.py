"""The experiment log: every run's configuration, machine and metrics, one JSON line each
(introduced in 02_single_device_baseline; read back in 09).

This is the article's advice "record each experiment to build your own knowledge base", made concrete:

    from mnist_helpers.course import experiments
    experiments.log_run("02", "baseline-dataloader", config=cfg.to_dict(), metrics={"test_acc": 0.982, ...})
    rows = experiments.query(notebook="02")            # list of flat dicts, newest last
    experiments.table(rows, ["name", "test_acc"])      # a pandas DataFrame (display.show formats it)

The log lives at ``results/experiments.jsonl`` (``MNIST_RESULTS_DIR`` moves it). Appends are single
``write`` calls under a file lock, so concurrent notebooks and workers never interleave lines. A corrupt
line (a crash mid-write on another filesystem, a hand edit) is reported once and skipped; the other
records are never lost.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from mnist_helpers.io import file_lock
from mnist_helpers.paths import results_dir

if TYPE_CHECKING:
    import pandas as pd

LOG_NAME = "experiments.jsonl"


class ExperimentLogError(ValueError):
    """A record that cannot be logged; the message says which field and why."""


def log_path(path: str | Path | None = None) -> Path:
    return Path(path) if path else results_dir() / LOG_NAME


def _check_json(value: Any, where: str) -> Any:
    """Plain JSON only (no tensors, no NaN surprises): convert numbers, reject the rest clearly."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)  # NaN/inf kept readable, never invalid JSON
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy / torch scalars
        return _check_json(value.item(), where)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ExperimentLogError(f"{where}: keys must be strings, got {k!r}")
            out[k] = _check_json(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_check_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ExperimentLogError(f"{where} has a {type(value).__name__}, which cannot be logged; "
                             "convert it to a number, string, list or dict first (e.g. tensor.item())")


def log_run(notebook: str, name: str, *, config: dict, metrics: dict, machine: dict | None = None,
            tags: Iterable[str] = (), path: str | Path | None = None) -> dict:
    """Append one run to the log and return the stored record.

    notebook: where it ran ("02", "scripts/bench_x"); name: a short label for this run;
    config: what was chosen (a TrainConfig.to_dict() or any flat dict); metrics: what was measured;
    machine: defaults to resources.machine_info().
    """
    if not isinstance(notebook, str) or not notebook:
        raise ExperimentLogError(f"notebook must be a non-empty string, got {notebook!r}")
    if not isinstance(name, str) or not name:
        raise ExperimentLogError(f"name must be a non-empty string, got {name!r}")
    for label, d in (("config", config), ("metrics", metrics)):
        if not isinstance(d, dict):
            raise ExperimentLogError(f"{label} must be a dict, got {type(d).__name__}")
    if machine is None:
        from mnist_helpers.resources import machine_info
        machine = machine_info()
    record = {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "notebook": notebook, "name": name, "tags": list(tags),
        "config": _check_json(config, "config"), "metrics": _check_json(metrics, "metrics"),
        "machine": _check_json(machine, "machine"),
    }
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    p = log_path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        with file_lock(fd):
            os.write(fd, line)  # one write of a whole line: readers never see half a record
            os.fsync(fd)
    finally:
        os.close(fd)
    return record


def read_log(path: str | Path | None = None) -> list[dict]:
    """Every valid record, oldest first. Corrupt lines are reported in one warning and skipped."""
    p = log_path(path)
    if not p.exists():
        return []
    records, bad = [], []
    with open(p, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict) or not {"notebook", "name", "config", "metrics"} <= rec.keys():
                    raise ValueError("missing fields")
                records.append(rec)
            except ValueError:
                bad.append(lineno)
    if bad:
        warnings.warn(f"{p}: skipped {len(bad)} corrupt line(s) (line {', '.join(map(str, bad[:10]))}"
                      f"{' ...' if len(bad) > 10 else ''}); the other {len(records)} records are intact",
                      stacklevel=2)
    return records


def flatten(record: dict) -> dict:
    """One flat row: time, notebook, name, tags, then config.*, metrics.* (unprefixed) and machine.*."""
    row = {k: record.get(k) for k in ("time", "notebook", "name")}
    row["tags"] = ",".join(record.get("tags", []))
    for k, v in record.get("config", {}).items():
        row[f"config.{k}"] = v
    for k, v in record.get("metrics", {}).items():
        row[k] = v
    m = record.get("machine", {}) or {}
    row["machine"] = f"{m.get('cpu_model', '?')} x{m.get('logical_cores', '?')}" + (
        f" + {len(m['gpus'])}x {m['gpus'][0]['name']}" if m.get("gpus") else "")
    row["hostname"] = m.get("hostname")
    return row


def query(path: str | Path | None = None, **filters) -> list[dict]:
    """Flat rows whose fields equal every filter (``notebook="02"``, ``name="baseline"``, ``tag="sweep"``)."""
    tag = filters.pop("tag", None)
    rows = []
    for rec in read_log(path):
        if tag is not None and tag not in rec.get("tags", []):
            continue
        row = flatten(rec)
        if all(row.get(k) == v for k, v in filters.items()):
            rows.append(row)
    return rows


def table(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    """The chosen columns of ``rows`` (e.g. from :func:`query`) as a pandas DataFrame, one row per run; a
    column a run did not log is empty. Display it with ``display.show(df, formats=...)``."""
    from mnist_helpers.course.display import table as frame  # pandas only when a table is asked for

    return frame(rows, columns)


def to_csv(rows: list[dict], path: str | Path) -> Path:
    """Write rows (union of their keys as columns) to CSV."""
    import csv
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return p
