"""The starters of the exercises that make the learner write code, read out of their solutions: each exercise has one
real file, its solution (``mnist_helpers/workers/exercises/*_solution.py``, run and tested as it is), and the starter
the learner copies is derived from it, so the two cannot drift apart.

A solution marks every place where its starter differs with a region; the starter's lines sit in it as ``# |``
comments, at the indentation of the code around them::

    def save_snapshot(path, model, optimizer, scheduler, epoch, step_in_epoch):
        # exercise: begin
        # | # TODO: write what the next step depends on ...
        # | pass
        state = {"model": model.module.state_dict(), ...}
        ...
        # exercise: end

``starter(text)`` keeps each region's ``# |`` lines (without their ``# | ``) and drops its other lines;
``solution(text)`` does the opposite; both drop the marker lines. ``solution_diff(path)`` is what the solution cells
print: what the solution writes into the starter.
"""
import difflib
import re
from pathlib import Path

BEGIN, END = "# exercise: begin", "# exercise: end"
_STARTER_LINE = re.compile(r"^(\s*)# \|(?: (.*))?$")  # "    # | pass" -> "    pass"; "# |" -> an empty line


def _split(text: str) -> list[tuple[str, str]]:
    """Each line of a solution with its role: "code" (outside regions), "starter" (a region's ``# |`` line, already
    uncommented), "solution" (a region's other lines); marker lines left out."""
    out, inside = [], False
    for n, line in enumerate(text.splitlines(True), 1):
        mark = line.strip()
        if mark in (BEGIN, END):
            if (mark == BEGIN) == inside:
                raise ValueError(f"line {n}: {mark!r} {'inside' if inside else 'outside'} a region")
            inside = mark == BEGIN
            continue
        m = _STARTER_LINE.match(line.rstrip("\n"))
        if m and not inside:
            raise ValueError(f"line {n}: a starter line (# |) outside a region: {line.rstrip()!r}")
        if m:
            end = "\n" if line.endswith("\n") else ""
            out.append(("starter", (m.group(1) + m.group(2) if m.group(2) is not None else "") + end))
        else:
            out.append(("solution" if inside else "code", line))
    if inside:
        raise ValueError(f"a region opened with {BEGIN!r} is never closed")
    return out


def starter(text: str) -> str:
    """The starter a solution's text marks: its lines outside the regions and the ``# |`` lines inside them."""
    return "".join(line for role, line in _split(text) if role != "solution")


def solution(text: str) -> str:
    """A solution's text without its markings: what runs, as a learner would write it."""
    return "".join(line for role, line in _split(text) if role != "starter")


def starter_of(path) -> str:
    """The starter of the solution file ``path`` (its text)."""
    return starter(Path(path).read_text())


def solution_diff(path) -> str:
    """What the solution file ``path`` (``<name>_solution.py``) writes into its starter, as a unified diff."""
    text, name = Path(path).read_text(), Path(path).name
    return "".join(difflib.unified_diff(starter(text).splitlines(True), solution(text).splitlines(True),
                                        name.replace("_solution", "_starter"), name))
