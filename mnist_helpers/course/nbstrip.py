"""Strip outputs and execution counts from notebooks (``make strip``); results live in results/, not in git.
It also gives every cell the ``id`` nbformat 4.5 requires (a cell pasted in by hand may lack one; nbformat warns
now and will refuse such a notebook later), derived from the cell's place and source, so a rerun changes nothing.

``python -m mnist_helpers.course.nbstrip notebooks`` rewrites every notebook under the folder in place;
``--check`` only lists the ones that carry outputs and exits 1 if there are any.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path


def carries_outputs(nb: dict) -> bool:
    return any(c.get("outputs") or c.get("execution_count") for c in nb.get("cells", []) if c.get("cell_type") == "code")


def missing_ids(nb: dict) -> list[int]:
    """Indices of the cells without an ``id`` (nbformat 4.5 and later require one)."""
    if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) < (4, 5):
        return []
    return [i for i, c in enumerate(nb.get("cells", [])) if not c.get("id")]


def ensure_ids(nb: dict) -> dict:
    """Give each cell without an ``id`` a stable one (8 hex digits of its place and source), unique in the notebook."""
    taken = {c["id"] for c in nb.get("cells", []) if c.get("id")}
    for i in missing_ids(nb):
        cell = nb["cells"][i]
        seed = f"{i}:{''.join(cell.get('source', ''))}"
        new = hashlib.sha1(seed.encode()).hexdigest()[:8]
        while new in taken:
            seed += "+"
            new = hashlib.sha1(seed.encode()).hexdigest()[:8]
        cell["id"] = new
        taken.add(new)
    return nb


def strip(nb: dict) -> dict:
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
        cell.get("metadata", {}).pop("execution", None)
    nb.get("metadata", {}).pop("widgets", None)
    return ensure_ids(nb)


def notebooks(paths: list[str]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        out += sorted(p.rglob("*.ipynb")) if p.is_dir() else [p]
    return [p for p in out if ".ipynb_checkpoints" not in p.parts]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    dirty = []
    for path in notebooks(args.paths):
        nb = json.loads(path.read_text(encoding="utf-8"))
        if carries_outputs(nb) or "widgets" in nb.get("metadata", {}) or missing_ids(nb):
            dirty.append(path)
            if not args.check:
                path.write_text(json.dumps(strip(nb), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for p in dirty:
        print(("carries outputs or lacks cell ids: " if args.check else "stripped: ") + str(p))
    return 1 if (args.check and dirty) else 0


if __name__ == "__main__":
    sys.exit(main())
