"""The worker progression single.py -> ddp_spawn.py -> ddp_train.py, checked (06_ddp_fundamentals).

Each step keeps the previous one's code lines except those it marks: every line a step adds or
changes carries its marker (``# DDP:`` in ddp_spawn, ``# torchrun:`` in ddp_train), and a line
may only disappear if the previous step had marked it. Indentation and blank lines do not count
(a block moved under ``try:`` is the same code), nor do the module docstrings (each file's
manual). ``tests/test_worker_progression.py`` enforces it; the notebook prints ``step_report()``.
"""
from __future__ import annotations

import ast
import difflib
from pathlib import Path

WORKERS = Path(__file__).resolve().parents[1] / "workers" / "progression"
STEPS = (("single.py", None), ("ddp_spawn.py", "# DDP:"), ("ddp_train.py", "# torchrun:"))
MARKERS = tuple(m for _, m in STEPS if m)


def code_lines(path: Path) -> list[str]:
    """The file's non-blank lines after its module docstring, without indentation."""
    src = Path(path).read_text()
    body = ast.parse(src).body
    has_doc = body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
    start = body[0].end_lineno if has_doc else 0
    return [ln.strip() for ln in src.splitlines()[start:] if ln.strip()]


def unmarked_changes(prev: list[str], new: list[str], marker: str) -> list[str]:
    """Lines that break the rule, as readable messages (empty when the step is clean)."""
    problems = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=prev, b=new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        problems += [f"added/changed without {marker!r}: {ln}" for ln in new[j1:j2] if marker not in ln]
        if j1 == j2:  # lines dropped with nothing in their place: only marked ones may go
            problems += [f"dropped an unmarked line: {ln}" for ln in prev[i1:i2] if not any(m in ln for m in MARKERS)]
    return problems


def diff_counts(prev: list[str], new: list[str]) -> dict:
    kept = added = dropped = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=prev, b=new, autojunk=False).get_opcodes():
        if tag == "equal":
            kept += i2 - i1
        else:
            added += j2 - j1
            dropped += i2 - i1
    return {"kept": kept, "added_or_changed": added, "dropped_or_replaced": dropped}


def step_report(workers: Path = WORKERS) -> list[dict]:
    """One row per step: lines kept, added/changed, dropped, and the rule's violations."""
    rows = []
    for (prev_name, _), (name, marker) in zip(STEPS, STEPS[1:]):
        prev, new = code_lines(workers / prev_name), code_lines(workers / name)
        rows.append({"step": f"{prev_name} -> {name}", "marker": marker, "lines": len(new),
                     **diff_counts(prev, new), "violations": unmarked_changes(prev, new, marker)})
    return rows


def marked_lines(name: str, marker: str, workers: Path = WORKERS) -> list[str]:
    """The lines of one worker that carry a marker, as written (indentation dropped)."""
    return [ln for ln in code_lines(workers / name) if marker in ln]
