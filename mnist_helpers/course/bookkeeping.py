"""How much of the notebooks' code only records results (claim bookkeeping) rather than teaching.

A top-level statement of a code cell counts as bookkeeping when its source names the claim machinery: a
``ResultFile``, a ``.claim(`` call, ``record_claims``/``claims_NN``, a verdict (``verdict``, ``*_VERDICT``,
``busy_verdict``), the evidence or regime strings, or spells a verdict word ("holds", "does not hold",
"inconclusive", "not testable here"). Its lines (from its first to its last) are the bookkeeping lines; the total is
every non-blank, non-comment line of code, the bodies of ``%%writefile`` cells (code the learner writes) included.
Lines starting with ``%`` or ``!`` are left out of both counts.

``python -m mnist_helpers.course.bookkeeping [notebooks]`` prints the share per notebook and overall.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

MARKERS = re.compile(r"ResultFile|\.claim\(|record_claims|claims_\d\d|verdict|VERDICT|\bREGIME\b|\bregime=|evidence"
                     r"|keep_as_reference|[\"'](holds|does not hold|inconclusive|not testable here)")


def _code_lines(source: str) -> list[str]:
    return [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]


def cell_counts(source: str) -> tuple[int, int]:
    """(bookkeeping lines, code lines) of one code cell's source."""
    if source.lstrip().startswith("%%"):  # a cell magic: the body is code (a file the learner writes), no claims
        body = source.lstrip().splitlines()[1:]
        return 0, sum(1 for line in body if line.strip() and not line.strip().startswith("#"))
    lines = _code_lines(source)
    total = sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return 0, total
    text = "\n".join(lines).splitlines()
    marked = set()
    for node in tree.body:
        chunk = "\n".join(text[node.lineno - 1:node.end_lineno])
        if MARKERS.search(chunk):
            marked.update(i for i in range(node.lineno - 1, node.end_lineno)
                          if text[i].strip() and not text[i].strip().startswith("#"))
    return len(marked), total


def notebook_counts(path: Path) -> tuple[int, int]:
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    bk = total = 0
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            b, t = cell_counts("".join(cell["source"]))
            bk, total = bk + b, total + t
    return bk, total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", nargs="?", default="notebooks")
    args = p.parse_args(argv)
    paths = sorted(Path(args.folder).glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        print(f"no notebooks under {args.folder}", file=sys.stderr)
        return 1
    bk_all = total_all = 0
    for path in paths:
        bk, total = notebook_counts(path)
        bk_all, total_all = bk_all + bk, total_all + total
        print(f"{path.name}: {bk} of {total} code lines record results ({bk / max(total, 1):.1%})")
    print(f"all notebooks: {bk_all} of {total_all} ({bk_all / max(total_all, 1):.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
