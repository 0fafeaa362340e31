"""Every notebook's first code cell: the profile the machine picks, and a hosted kernel (Colab, Kaggle) where the
series is not installed.

The hosted runs are offline and honest about what they are: a fresh virtual environment that sees this machine's
installed packages (torch, torchvision, the Jupyter kernel) but not the series, a copy of the notebook in a folder
outside the checkout, and the series as a .zip of the working tree (what a learner uploads to Kaggle, or downloads
from the repository page); the first cell must find it, put it on the path of the kernel and of the workers it
launches, and the notebook must run to the end. Colab's and Kaggle's own images are not run here."""
import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import notebook_runs
from mnist_helpers.hosted import QUICK_CORES, choose_profile

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def first_code_cell(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])


# --------------------------------------------------------------------------- the profile


def test_a_small_machine_without_a_gpu_gets_the_quick_profile_and_is_told_how_to_override():
    profile, reason = choose_profile(None, cores=2, gpus=0)
    assert profile == "quick" and "MNIST_PROFILE=full" in reason and "2 usable cores" in reason
    assert choose_profile(None, cores=QUICK_CORES, gpus=0)[0] == "quick"


@pytest.mark.parametrize("cores, gpus", [(QUICK_CORES + 1, 0), (16, 0), (2, 1), (8, 2)])
def test_a_gpu_or_enough_cores_gets_the_full_profile(cores, gpus):
    profile, reason = choose_profile(None, cores=cores, gpus=gpus)
    assert profile == "full" and "MNIST_PROFILE=quick" in reason


@pytest.mark.parametrize("value", ["quick", "full"])
def test_the_learners_setting_wins(value):
    assert choose_profile(value, cores=2, gpus=0) == (value, "MNIST_PROFILE is set")
    assert choose_profile(value, cores=64, gpus=8)[0] == value


def test_a_mistyped_profile_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="'quick'.*'full'"):
        choose_profile("Full", cores=2, gpus=0)


def test_prepare_sets_the_profile_for_the_kernel_and_its_workers(monkeypatch, capsys):
    from mnist_helpers import hosted

    monkeypatch.delenv("MNIST_PROFILE", raising=False)
    monkeypatch.setattr("mnist_helpers.resources.usable_cores", lambda: 2)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert hosted.prepare(data=False) == "quick"
    assert os.environ["MNIST_PROFILE"] == "quick"
    assert capsys.readouterr().out.startswith("profile: quick (2 usable cores and no GPU")


# --------------------------------------------------------------------------- the first cell of every notebook


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_starts_with_the_same_setup_cell(path):
    """One cell, the same everywhere (00 provisions the data itself, as its lesson), before the parameters."""
    cell = first_code_cell(path)
    reference = first_code_cell(NOTEBOOKS[1])
    expected = reference.replace("prepare()", "prepare(data=False)") if path.name.startswith("00_") else reference
    assert cell == expected, f"{path.name}: its first code cell differs from the series' setup cell"
    assert 'find_spec("mnist_helpers") is None' in cell and "MNIST_SERIES" in cell and "PYTHONPATH" in cell


# --------------------------------------------------------------------------- a hosted kernel, offline


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    """A kernel whose Python sees this machine's packages but not the series, and the series as a .zip."""
    tmp = tmp_path_factory.mktemp("hosted")
    env_dir = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # a plain path line: torch, torchvision, ipykernel ... importable; the editable install of the series is a
    # .pth *executed* only in its own site directory, so it does not come along
    (site / "installed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run([str(python), "-c", "import importlib.util, torch; "
                            "print(importlib.util.find_spec('mnist_helpers') is None)"],
                           capture_output=True, text=True, cwd=tmp, timeout=300)
    assert probe.stdout.strip() == "True", f"the hosted environment must not see the series: {probe}"
    kernels = tmp / "jupyter" / "kernels" / "hosted"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "hosted (no series)", "language": "python"}))
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split("\n")
    series = tmp / "mnist-scale-lab-main.zip"
    with zipfile.ZipFile(series, "w") as z:
        for name in filter(None, listed):
            if (REPO / name).is_file() and not name.startswith(("notebooks/work/", "results/avx2/")):
                z.write(REPO / name, f"mnist-scale-lab-main/{name}")
    return {"tmp": tmp, "jupyter_path": str(tmp / "jupyter"), "series": series}


def env_for_hosted(hosted, monkeypatch, work: Path) -> None:
    monkeypatch.setenv("JUPYTER_PATH", hosted["jupyter_path"])
    monkeypatch.setenv("MNIST_SERIES", str(hosted["series"]))
    monkeypatch.setenv("MNIST_RESULTS_DIR", str(work / "results"))
    monkeypatch.setenv("MNIST_PROFILE", "quick")
    monkeypatch.setenv("MNIST_DATA_ROOT", os.environ.get("MNIST_DATA_ROOT", str(REPO / "data")))
    monkeypatch.delenv("PYTHONPATH", raising=False)


def run_hosted(hosted, nb: nbformat.NotebookNode, name: str, monkeypatch, timeout: int = 900):
    work = hosted["tmp"] / f"kernel-{name}"
    work.mkdir()
    env_for_hosted(hosted, monkeypatch, work)
    NotebookClient(nb, kernel_name="hosted", timeout=timeout, resources={"metadata": {"path": str(work)}}).execute()
    return work


@pytest.mark.kernel
def test_the_setup_cell_finds_the_uploaded_series_and_its_workers_see_it(hosted, monkeypatch):
    """The setup cell alone, then a 2-process torchrun launch from the kernel: the workers import the series from
    the extracted .zip too (through PYTHONPATH), not from this checkout."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(first_code_cell(NOTEBOOKS[1])),
        nbformat.v4.new_code_cell("import mnist_helpers; print('series at', mnist_helpers.__file__)"),
        nbformat.v4.new_code_cell(
            "from pathlib import Path\nfrom mnist_helpers.launch import torchrun\n"
            "Path('w.py').write_text('import json, sys, torch.distributed as dist, mnist_helpers\\n'\n"
            "    'dist.init_process_group(\"gloo\")\\n'\n"
            "    'print(\"worker sees\", mnist_helpers.__file__)\\n'\n"
            "    'dist.barrier()\\n'\n"
            "    'dist.destroy_process_group()\\n')\n"
            "torchrun('w.py', nproc=2, device='cpu', timeout=240)"),
    ])
    work = run_hosted(hosted, nb, "setup", monkeypatch)
    out = notebook_runs.stdout_of(nb)
    assert "profile: quick (MNIST_PROFILE is set)" in out
    seen = re.findall(r"(?:series at|worker sees) (\S+)", out)
    assert len(seen) == 3, out[-3000:]
    assert all(Path(p).is_relative_to(work) and "mnist-scale-lab-main" in p for p in seen), seen


@pytest.mark.kernel
def test_without_the_series_the_cell_says_what_to_upload(hosted, monkeypatch, tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(first_code_cell(NOTEBOOKS[1]))])
    monkeypatch.setenv("JUPYTER_PATH", hosted["jupyter_path"])
    monkeypatch.setenv("MNIST_SERIES", "")
    client = NotebookClient(nb, kernel_name="hosted", timeout=300, resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(Exception) as err:
        client.execute()
    assert "upload this repository" in str(err.value) and "MNIST_SERIES" in str(err.value)


# notebook 00's cells that only a hosted kernel can prove: the series found in the upload (1), the profile (2), the
# environment check (4), MNIST provisioned and verified through the uploaded series (6) and read by torchvision (8).
# The whole notebook runs once, in tests/test_notebooks.py; its torchrun cells from a hosted kernel are proved by
# test_the_setup_cell_finds_the_uploaded_series_and_its_workers_see_it (issue 46: each notebook runs once).
HOSTED_CELLS_00 = [1, 2, 4, 6, 8]


@pytest.mark.kernel
def test_notebook_00_provisions_the_data_on_a_hosted_kernel_from_a_copy_outside_the_checkout(hosted, monkeypatch):
    path = notebook_runs.path_of("00_setup_and_data")
    sources = dict(notebook_runs.code_cells(path))
    assert "find_spec" in sources[1] and "PROFILE" in sources[2] and "env_check" in sources[4]
    assert "ensure_mnist()" in sources[6] and "MNIST(" in sources[8], "the hosted cells of 00 moved: update the list"
    work = hosted["tmp"] / "kernel-00"
    work.mkdir()
    env_for_hosted(hosted, monkeypatch, work)
    nb = notebook_runs.run_cells(path, HOSTED_CELLS_00, "hosted", kernel_name="hosted", cwd=work, timeout=900,
                                 extra=["import mnist_helpers; print('series at', mnist_helpers.__file__)"])
    out = notebook_runs.stdout_of(nb)
    (seen,) = re.findall(r"series at (\S+)", out)
    assert Path(seen).is_relative_to(work), seen
    assert "torchvision sees 60,000 training and 10,000 test images" in out, out[-2000:]
