"""The diff rule of the learner's progression (06: train_single.py -> train_ddp.py, ``# DDP:``; 07: -> train_ft.py,
``# FT:``), checked and shown; and the series' workers shown whole (12: ``ddp_train.py``; 07: ``ft_train.py``).

Each step keeps the previous one's code and marks what it changes **once per block**, as huggingface/accelerate's
examples do: every block of added, changed or removed lines carries exactly one marker comment with its reason
(``# DDP: ...`` in train_ddp.py, ``# FT: ...`` in train_ft.py), on its own line above the block or at the end of a
one-line change. A removal leaves a marker comment where the lines were. A marker must say something: a bare
``# DDP:`` is an error. Blocks are the diff's changed runs; a run only 1-2 unchanged lines after the previous one continues
its block (a ``try:`` or a ``return`` between two changes is part of the change's story) unless it opens with a
marker of its own, and a marker comment line inside a changed run opens a new block. Indentation and blank lines do
not count (a block moved under ``try:`` is the same code), nor do the module docstrings (each file's manual).

``tests/workers/test_progression.py`` tests the rule and ``tests/notebooks/test_n06_ddp_in_cells.py`` holds 06's
scripts to it; the notebooks print the counts and render each step's unified diff (``diff``) and each file
(``source``) with syntax highlighting.
"""
from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

WORKERS = Path(__file__).resolve().parents[1] / "workers" / "progression"  # ddp_train.py, ft_train.py
MARKERS = ("# DDP:", "# FT:")  # 06: train_single.py -> train_ddp.py; 07: train_ddp.py -> train_ft.py
BRIDGE = 2  # changed runs at most this many unchanged lines apart form one block


def body_start(src: str) -> int:
    """The line index just after the module docstring (0 without one)."""
    body = ast.parse(src).body
    has_doc = body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
    return body[0].end_lineno if has_doc else 0


def code_lines(path: Path) -> list[str]:
    """The file's non-blank lines after its module docstring, without indentation."""
    src = Path(path).read_text()
    return [ln.strip() for ln in src.splitlines()[body_start(src):] if ln.strip()]


def blocks(prev: list[str], new: list[str]) -> list[dict]:
    """The step's changed blocks: ``{"added": [...], "removed": [...]}``. Changed runs <= BRIDGE lines apart are
    joined (the unchanged lines between them counted in ``added``) unless the later run opens with a marker."""
    runs = []  # (i1, i2, j1, j2): a changed run, split where a marker comment line opens a new block
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=prev, b=new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        cuts = [j for j in range(j1 + 1, j2) if any(new[j].startswith(m) for m in MARKERS)]
        for k, (a, b) in enumerate(zip([j1, *cuts], [*cuts, j2])):
            runs.append((i1, i2, a, b) if k == 0 else (i2, i2, a, b))
    out = []
    for i1, i2, j1, j2 in runs:
        starts_marked = j2 > j1 and any(m in new[j1] for m in MARKERS)  # a run that opens with its own marker
        if out and not starts_marked and j1 - out[-1]["j2"] <= BRIDGE and i1 - out[-1]["i2"] <= BRIDGE:
            out[-1]["added"] += new[out[-1]["j2"]:j2]
            out[-1]["removed"] += prev[i1:i2]
            out[-1]["i2"], out[-1]["j2"] = i2, j2
        else:
            out.append({"added": new[j1:j2], "removed": prev[i1:i2], "i2": i2, "j2": j2})
    return [{"added": b["added"], "removed": b["removed"]} for b in out]


def _bare(line: str, marker: str) -> bool:
    return re.search(re.escape(marker) + r"\s*$", line) is not None


def unmarked_changes(prev: list[str], new: list[str], marker: str) -> list[str]:
    """Blocks that break the rule, as readable messages (empty when the step is clean)."""
    problems = [f"bare marker (say why): {ln}" for ln in new if any(_bare(ln, m) for m in MARKERS)]
    for b in blocks(prev, new):
        first = (b["added"] or b["removed"])[0]
        marks = [ln for ln in b["added"] if marker in ln]
        if not marks:
            what = "removed lines" if not b["added"] else "a block"
            problems.append(f"{what} without {marker!r} (starting: {first})")
        elif len(marks) > 1:
            problems.append(f"{marker!r} {len(marks)} times in one block (mark it once): " + " | ".join(marks))
    return problems


def diff_counts(prev: list[str], new: list[str]) -> dict:
    kept = added = dropped = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=prev, b=new, autojunk=False).get_opcodes():
        if tag == "equal":
            kept += i2 - i1
        else:
            added += j2 - j1
            dropped += i2 - i1
    return {"kept": kept, "added_or_changed": added, "dropped_or_replaced": dropped,
            "blocks": len(blocks(prev, new))}


# --------------------------------------------------------------------------- on screen

def code_text(name: str, workers: Path = WORKERS) -> str:
    """A worker's code as written, after its module docstring (the docstring is its manual: ``--help``)."""
    src = (workers / name).read_text()
    return "\n".join(src.splitlines()[body_start(src):]).strip("\n") + "\n"


def diff_text(prev_name: str, name: str, workers: Path = WORKERS, context: int = 3) -> str:
    """The unified diff of two workers' code (what ``diff -u`` prints, without the docstrings)."""
    a, b = code_text(prev_name, workers).splitlines(), code_text(name, workers).splitlines()
    return "\n".join(difflib.unified_diff(a, b, Path(prev_name).name, Path(name).name, n=context, lineterm="")) + "\n"


def source(name: str, workers: Path = WORKERS):
    """The worker file, whole, with syntax highlighting (``IPython.display.Code``)."""
    from IPython.display import Code

    return Code((workers / name).read_text(), language="python")


def diff(prev_name: str, name: str, workers: Path = WORKERS, context: int = 3):
    """One step's unified diff, highlighted as a diff (``IPython.display.Code``)."""
    from IPython.display import Code

    return Code(diff_text(prev_name, name, workers, context), language="diff")
