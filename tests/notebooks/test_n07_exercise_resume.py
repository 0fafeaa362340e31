"""Exercise 07-3 (issue 48): the check launches the learner's script, kills rank 1 and compares with an uninterrupted
run. Here it runs for real on a correct answer (the solution file) and on the typical wrong ones: the untouched
starter, and a script that saves snapshots but never loads them."""
from __future__ import annotations

from pathlib import Path

import pytest

from mnist_helpers.course import exercises as E


@pytest.mark.process
@pytest.mark.timeout(400)
def test_the_solution_resumes_with_the_uninterrupted_weights(mnist_root, capsys):
    fb = E.check_snapshot_resume(E.FT_SOLUTION)
    assert fb.ok, fb.message
    assert "ended with the uninterrupted run's weights" in fb.message


@pytest.mark.process
@pytest.mark.timeout(400)
def test_a_script_that_never_loads_its_snapshot_is_told_so(mnist_root, tmp_path, capsys):
    text = Path(E.FT_SOLUTION).read_text()
    resume = "    if args.snapshot and os.path.exists(args.snapshot):\n"
    assert resume in text
    script = tmp_path / "ft_exercise.py"
    script.write_text(text.replace(resume, "    if False:  # the snapshot is never loaded\n"))
    fb = E.check_snapshot_resume(str(script))
    assert not fb.ok and "started from step 0: did you load the snapshot before training" in fb.message, fb.message


@pytest.mark.process
@pytest.mark.timeout(400)
def test_the_untouched_starter_writes_no_snapshot(mnist_root, capsys):
    fb = E.check_snapshot_resume(E.FT_STARTER)
    assert not fb.ok and "wrote no snapshot at --snapshot" in fb.message, fb.message
