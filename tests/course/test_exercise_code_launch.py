"""Exercises 06-1 and 08-3 (issue 48): their checks launch the learner's script with torchrun on 2 CPU processes.
Here each runs for real on a correct answer (the solution file) and on the typical wrong one, the untouched starter:
a single-device script (both ranks train on the same images) and a script whose log all_reduce only rank 0 calls (a
hang, turned into an error by the script's --timeout). The other branches are tests/exercise_code_rows.py's fast
rows. Four launches, about 15 s each on 2 cores."""
from __future__ import annotations

import pytest

from mnist_helpers.course import exercises as E


@pytest.mark.process
@pytest.mark.timeout(300)
def test_the_ddp_solution_passes(mnist_root, capsys):
    fb = E.check_ddp_script(E.DDP_SOLUTION)
    assert fb.ok, fb.message
    assert f"of {E.DDP_CHECK_ARGS['test_images']} test images right, each counted once" in fb.message


@pytest.mark.process
@pytest.mark.timeout(300)
def test_the_single_device_starter_is_told_to_pass_the_sampler(mnist_root, capsys):
    fb = E.check_ddp_script(E.DDP_STARTER)
    assert not fb.ok
    assert "rank 1 saw the same images as rank 0" in fb.message and "did you pass the sampler" in fb.message, \
        fb.message


@pytest.mark.process
@pytest.mark.timeout(300)
def test_the_fixed_hang_passes(capsys):
    fb = E.check_hang_fix(E.HANG_SOLUTION)
    assert fb.ok, fb.message
    assert "the all_reduce is called by every rank" in fb.message


@pytest.mark.process
@pytest.mark.timeout(300)
def test_the_hanging_starter_is_told_it_still_hangs(capsys):
    fb = E.check_hang_fix(E.HANG_STARTER)
    assert not fb.ok and "it still hangs" in fb.message, fb.message
