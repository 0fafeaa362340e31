"""The cells of notebooks 05 and 10 whose choices depend on the CPU's instructions, run with torch's kernels limited
to AVX2 (`make test-avx2`: an ordinary laptop CPU without AVX-512, AMX or native bf16).

The notebooks run whole once per `make test`, natively (tests/notebooks/test_all_run.py); under AVX2 only what the
instruction set changes runs again (issue 46: the smallest cell set that proves it):
- 05: the setup, the parameters and the values derived from them, which AMP modes this CPU supports (5), one bf16
  step written out against ``train_step`` (7), and fp32 / bf16 / channels_last measured side by side (11);
- 10: the setup, the parameters and the values derived from them, the measured fp32 and bf16 GEMM peaks (5), and
  the settings the speedrun picks from measurements on this CPU (8).
Skipped outside `make test-avx2` (``MNIST_EXPECT_AVX2``)."""
from __future__ import annotations

import os

import pytest

import notebook_runs

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(900),
              pytest.mark.skipif(not os.environ.get("MNIST_EXPECT_AVX2"), reason="only under `make test-avx2`")]

CELLS = {
    "05_mixed_precision_and_memory": ([1, 2, 3, 5, 7, 11],
                                      {5: "supported_amp(", 7: "amp_step(", 11: "compare_precisions("}),
    "10_speedrun": ([1, 2, 3, 5, 8], {5: "measure_peak_flops(", 8: "choose_settings("}),
}


@pytest.mark.parametrize("stem", sorted(CELLS))
def test_the_isa_dependent_cells_run_under_avx2(stem, monkeypatch):
    indices, needles = CELLS[stem]
    path = notebook_runs.path_of(stem)
    sources = dict(notebook_runs.code_cells(path))
    assert "find_spec" in sources[indices[0]] and "PROFILE" in sources[indices[1]] and "QUICK =" in sources[indices[2]]
    moved = {i: n for i, n in needles.items() if n not in sources.get(i, "")}
    assert not moved, f"{stem}: the AVX2 cells moved ({moved}): update CELLS"
    monkeypatch.setenv("MNIST_PROFILE", "quick")
    probe = "import torch; print('cpu capability', torch.backends.cpu.get_cpu_capability())"
    nb = notebook_runs.run_cells(path, indices, "avx2", extra=[probe])
    assert "cpu capability AVX2" in notebook_runs.stdout_of(nb)
    assert not notebook_runs.errors_of(nb)
