"""The exercise starters are read out of their solutions (mnist_helpers/course/starters.py): the rule on a small
example, its errors, and every solution in mnist_helpers/workers/exercises/ giving a starter that is a script."""
import ast
from pathlib import Path

import pytest

from mnist_helpers.course import exercises as E
from mnist_helpers.course import starters

SOLUTION = '''\
# exercise: begin
# | """The starter."""
"""The solution."""
# exercise: end
import os


def main():
    # exercise: begin
    # | # TODO: the rank
    # |
    # | rank = None
    rank = int(os.environ["RANK"])
    # exercise: end
    return rank
'''


def test_a_region_gives_the_starter_its_lines_and_the_solution_the_rest():
    assert starters.starter(SOLUTION) == ('"""The starter."""\nimport os\n\n\ndef main():\n    # TODO: the rank\n\n'
                                          '    rank = None\n    return rank\n')
    assert starters.solution(SOLUTION) == ('"""The solution."""\nimport os\n\n\ndef main():\n'
                                           '    rank = int(os.environ["RANK"])\n    return rank\n')


def test_a_file_without_regions_is_its_own_starter_and_solution():
    text = "import os\n# a comment | with a bar\nprint(os.sep)"
    assert starters.starter(text) == starters.solution(text) == text


@pytest.mark.parametrize("text, error", [
    ("# exercise: begin\nx = 1\n", "never closed"),
    ("x = 1\n# exercise: end\n", "outside a region"),
    ("# exercise: begin\n# exercise: begin\n", "inside a region"),
    ("# | x = 1\n", "outside a region"),
])
def test_a_broken_marking_is_an_error_not_a_wrong_starter(text, error):
    with pytest.raises(ValueError, match=error):
        starters.starter(text)


SCRIPTS = {"06-1": (E.DDP_SOLUTION, E.DDP_STARTER), "07-3": (E.FT_SOLUTION, E.FT_STARTER),
           "08-3": (E.HANG_SOLUTION, E.HANG_STARTER), "12-1": (E.LOCAL_RANK_SOLUTION, E.LOCAL_RANK_STARTER)}


@pytest.mark.parametrize("ex_id", SCRIPTS)
def test_every_solution_gives_a_starter_that_is_a_script_of_its_own(ex_id):
    path, starter = SCRIPTS[ex_id]
    text = Path(path).read_text()
    assert starter == starters.starter_of(path)
    for script in (starter, starters.solution(text)):
        ast.parse(script)
        marks = [ln for ln in script.splitlines() if ln.strip() in (starters.BEGIN, starters.END)
                 or ln.lstrip().startswith("# |")]
        assert marks == []
    assert ast.get_docstring(ast.parse(starter)).startswith(f"Exercise {ex_id}, the starter")
    assert ast.get_docstring(ast.parse(text)).startswith(f"Exercise {ex_id}, a solution")
    assert starter != starters.solution(text)


def test_the_solution_cell_shows_the_diff_under_the_files_names():
    diff = starters.solution_diff(E.HANG_SOLUTION)
    assert diff.startswith("--- hang_starter.py\n+++ hang_solution.py\n")
    assert "-    if rank == 0:\n-        dist.all_reduce(logged)\n" in diff and "\n+    # |" not in diff
