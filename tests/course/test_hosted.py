"""Every notebook's first code cell: the profile the machine picks, the places for files, and a hosted kernel
(Colab, Kaggle, JupyterHub) where the series is not installed.

The hosted runs are offline and honest about what they are: a fresh virtual environment that sees this machine's
installed packages (torch, torchvision, pip, the Jupyter kernel) but not the series, a scratch working directory
outside the checkout, and the series as a .zip of the working tree (what a learner uploads, or downloads from the
repository page) or as a read-only folder (a Kaggle dataset: a read-only bind mount in a mount namespace of the
kernel's own, so that root cannot write to it either). The first cell must pip-install the series into the kernel
(no downloads: ``PIP_NO_INDEX=1``), choose writable places itself (no test sets ``MNIST_DATA_ROOT`` or
``MNIST_RESULTS_DIR``), and run twice without error; the workers the kernel launches must import the installed series.
Colab's and Kaggle's own images are not run here."""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import notebook_runs
from mnist_helpers.course.hosted import QUICK_CORES, choose_profile

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def first_code_cell(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])


# --------------------------------------------------------------------------- the profile


def test_a_small_machine_without_a_gpu_gets_the_quick_profile_and_is_told_how_to_override():
    profile, reason = choose_profile(None, cores=2, gpus=0)
    assert profile == "quick" and "MNIST_PROFILE=full" in reason and "2 usable cores" in reason
    assert choose_profile(None, cores=QUICK_CORES, gpus=0)[0] == "quick"


@pytest.mark.parametrize("cores, gpus", [(QUICK_CORES + 1, 0), (16, 0), (QUICK_CORES + 1, 1), (8, 2)])
def test_enough_cores_get_the_full_profile(cores, gpus):
    profile, reason = choose_profile(None, cores=cores, gpus=gpus)
    assert profile == "full" and "MNIST_PROFILE=quick" in reason


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_gpu_beside_few_cores_still_gets_the_quick_profile_and_is_told_why(gpus):
    """A 2-vCPU Colab T4: the CPU-bound comparisons of 06, 07 and 09 would run on its 2 cores for minutes."""
    profile, reason = choose_profile(None, cores=2, gpus=gpus)
    assert profile == "quick" and f"{gpus} GPU(s) here" in reason and "CPU-bound" in reason
    assert "MNIST_PROFILE=full" in reason


@pytest.mark.parametrize("value", ["quick", "full"])
def test_the_learners_setting_wins(value):
    assert choose_profile(value, cores=2, gpus=0) == (value, "MNIST_PROFILE is set")
    assert choose_profile(value, cores=64, gpus=8)[0] == value


def test_a_mistyped_profile_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="'quick'.*'full'"):
        choose_profile("Full", cores=2, gpus=0)


def test_prepare_sets_the_profile_for_the_kernel_and_its_workers(monkeypatch, capsys):
    from mnist_helpers.course import hosted

    monkeypatch.delenv("MNIST_PROFILE", raising=False)
    monkeypatch.setattr("mnist_helpers.resources.usable_cores", lambda: 2)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    monkeypatch.setenv("MNIST_DATA_ROOT", "unused")  # a writable checkout needs no places: keep prepare's output
    hosted.prepare(data=False)
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1", "is_available() would start the CUDA driver"
    assert os.environ["MNIST_PROFILE"] == "quick"
    assert capsys.readouterr().out.startswith("profile: quick (2 usable cores and no GPU")


# --------------------------------------------------------------------------- the first cell of every notebook


def test_every_notebook_starts_with_the_same_short_setup_cell():
    """One cell of at most 6 lines, the same everywhere; it installs the series as a package, never edits sys.path."""
    cells = {path.name: first_code_cell(path) for path in NOTEBOOKS}
    reference = cells[NOTEBOOKS[0].name]
    assert all(cell == reference for cell in cells.values()), \
        [name for name, cell in cells.items() if cell != reference]
    assert len(reference.splitlines()) <= 6, reference
    assert 'find_spec("mnist_helpers") is None' in reference and "MNIST_SERIES" in reference
    assert '"pip", "install"' in reference and "sys.path" not in reference and "prepare()" in reference


def test_places_outside_a_writable_checkout(monkeypatch, tmp_path):
    """A read-only series, then Kaggle: results in the working directory (or /kaggle/working), data read in place
    from the series when it ships MNIST, else beside the results; the learner's own settings win."""
    from mnist_helpers import paths
    from mnist_helpers.course import hosted

    monkeypatch.delenv("MNIST_DATA_ROOT", raising=False)
    monkeypatch.delenv("MNIST_RESULTS_DIR", raising=False)
    monkeypatch.delenv("MNIST_SERIES", raising=False)
    assert hosted.places() is None, "a writable checkout keeps its own data/ and results/"
    checkout = paths.repo_root()
    read_only = {checkout, Path("/kaggle/working")}
    monkeypatch.setattr(paths, "writable", lambda p: Path(p) not in read_only and Path(p).is_dir())
    assert paths._default("data") == Path.home() / ".cache" / "mnist-scale-lab" / "data"
    if (checkout / "data" / "MNIST" / "raw").is_dir():  # a read-only checkout that holds MNIST: read in place
        assert hosted.places(cwd=tmp_path) == {"data": checkout / "data", "results": tmp_path / "results"}
    monkeypatch.setattr(paths, "repo_root", lambda: None)  # installed as a package (the first cell's pip install)
    assert hosted.places(cwd=tmp_path) == {"data": tmp_path / "data", "results": tmp_path / "results"}

    series = tmp_path / "dataset"  # a series that ships the four verified files
    shutil.copytree(Path(os.environ.get("MNIST_DATA_ROOT", REPO / "data")) / "MNIST" / "raw",
                    series / "data" / "MNIST" / "raw",
                    ignore=shutil.ignore_patterns("*.gz", ".*"))
    monkeypatch.setenv("MNIST_SERIES", str(series))
    assert hosted.places(cwd=tmp_path)["data"] == series / "data"
    (series / "data" / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").write_bytes(b"broken")
    assert hosted.places(cwd=tmp_path)["data"] == tmp_path / "data", "a damaged copy is not read in place"

    kaggle = tmp_path / "kaggle-working"
    kaggle.mkdir()
    real = Path
    monkeypatch.setattr(hosted, "Path", lambda *a: kaggle if a == ("/kaggle/working",) else real(*a))
    assert hosted.places(cwd=tmp_path)["results"] == kaggle / "results"
    monkeypatch.setenv("MNIST_RESULTS_DIR", str(tmp_path / "mine"))
    assert "results" not in hosted.places(cwd=tmp_path)


def test_prepare_names_the_places_in_one_line_and_sets_them_for_the_workers(monkeypatch, tmp_path, capsys):
    from mnist_helpers import paths
    from mnist_helpers.course import hosted

    for name in ("MNIST_DATA_ROOT", "MNIST_RESULTS_DIR", "MNIST_SERIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hosted, "places", lambda cwd=None: {"data": tmp_path / "d", "results": tmp_path / "r"})
    hosted.prepare(data=False)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("files:")]
    assert len(lines) == 1 and str(tmp_path / "d") in lines[0] and str(tmp_path / "r") in lines[0]
    assert os.environ["MNIST_DATA_ROOT"] == str(tmp_path / "d")
    assert os.environ["MNIST_RESULTS_DIR"] == str(tmp_path / "r")


def test_a_kernel_without_the_runtime_packages_is_told_what_to_install(monkeypatch):
    from mnist_helpers.course import hosted

    real = __import__("importlib.util").util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"%pip install ipywidgets"):
        hosted.prepare(data=False)


# --------------------------------------------------------------------------- a hosted kernel, offline


def _package_view(tmp: Path) -> Path:
    """This machine's installed packages without the series (its editable install and metadata left out)."""
    view = tmp / "packages"
    view.mkdir()
    purelib = Path(sysconfig.get_paths()["purelib"])
    for entry in purelib.iterdir():
        if not entry.name.startswith(("mnist_scale_lab", "__editable__", "mnist_helpers")) and entry.suffix != ".pth":
            (view / entry.name).symlink_to(entry)
    return view


def _read_only_kernel_argv(python: Path, series: Path) -> list[str] | None:
    """A kernel in a mount namespace of its own where ``series`` is a read-only bind mount (root cannot write it
    either), or None where this machine cannot make one."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    probe = subprocess.run([unshare, "-m", "sh", "-c", f"mount --bind -o ro '{series}' '{series}' && "
                            f"! touch '{series}/.probe' 2>/dev/null"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return None
    return [unshare, "-m", "sh", "-c", f"mount --bind -o ro '{series}' '{series}' && "
            f"exec '{python}' -m ipykernel_launcher -f '{{connection_file}}'"]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """The working tree as a learner gets it: a .zip (a download, an upload) and an extracted folder."""
    tmp = tmp_path_factory.mktemp("series")
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split("\n")
    archive = tmp / "mnist-scale-lab-main.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name in filter(None, listed):
            if (REPO / name).is_file() and not name.startswith(("notebooks/work/", "results/avx2/")):
                z.write(REPO / name, f"mnist-scale-lab-main/{name}")
    with zipfile.ZipFile(archive) as z:
        z.extractall(tmp / "folder")
    return {"zip": archive, "folder": tmp / "folder" / "mnist-scale-lab-main", "packages": _package_view(tmp)}


def make_kernel(series, tmp: Path, read_only: Path | None = None) -> dict:
    """A fresh environment that sees this machine's packages but not the series, and a Jupyter kernel spec for it."""
    env_dir = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "packages.pth").write_text(f"{series['packages']}\n")
    probe = subprocess.run([str(python), "-c", "import importlib.util, torch, pip; "
                            "print(importlib.util.find_spec('mnist_helpers') is None)"],
                           capture_output=True, text=True, cwd=tmp, timeout=300)
    assert probe.stdout.strip() == "True", f"the hosted environment must not see the series: {probe}"
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    if read_only is not None:
        argv = _read_only_kernel_argv(python, read_only)
        if argv is None:
            pytest.skip("no mount namespace here (unshare -m and a read-only bind mount need root or user "
                        "namespaces): the read-only route is untested on this machine")
    kernels = tmp / "jupyter" / "kernels" / "hosted"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "hosted (no series)",
                                                     "language": "python"}))
    work = tmp / "work"
    work.mkdir()
    return {"jupyter_path": str(tmp / "jupyter"), "site": site, "work": work}


def hosted_env(monkeypatch, kernel: dict, source: str) -> None:
    monkeypatch.setenv("JUPYTER_PATH", kernel["jupyter_path"])
    monkeypatch.setenv("MNIST_SERIES", source)
    monkeypatch.setenv("MNIST_PROFILE", "quick")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing is downloaded: the series and its build tools are on disk
    for name in ("MNIST_DATA_ROOT", "MNIST_RESULTS_DIR", "PYTHONPATH", "MNIST_EXEC_CHECK"):
        monkeypatch.delenv(name, raising=False)


def upload_data(into: Path) -> None:
    """The offline route of the README: the four MNIST files copied into ``data/MNIST/raw``."""
    source = Path(os.environ.get("MNIST_DATA_ROOT", REPO / "data")) / "MNIST" / "raw"
    shutil.copytree(source, into / "MNIST" / "raw", ignore=shutil.ignore_patterns("*.gz", ".*"))


def cells_through(path: Path, last: str, skip: tuple[str, ...] = ()) -> list[int]:
    """The notebook's code cells from the first through the first one containing ``last``, less those containing
    any of ``skip`` (chosen by content: other cells may be inserted above)."""
    chosen = []
    for index, source in notebook_runs.code_cells(path):
        if not any(s in source for s in skip):
            chosen.append(index)
        if last in source:
            return chosen
    raise AssertionError(f"{path.name}: no code cell contains {last!r}: update the hosted test's cell choice")


SHOW = ("import mnist_helpers, os; print('series at', mnist_helpers.__file__); "
        "print('data at', os.environ['MNIST_DATA_ROOT'], os.environ.get('MNIST_RESULTS_DIR'))")


@pytest.mark.kernel
def test_an_uploaded_zip_is_installed_into_the_kernel_and_its_workers_import_it(series, tmp_path, monkeypatch):
    """The .zip route (Colab, a JupyterHub upload): the first cell twice, then a 2-process torchrun launch from the
    kernel whose workers import the installed series, not this checkout."""
    kernel = make_kernel(series, tmp_path)
    hosted_env(monkeypatch, kernel, str(series["zip"]))
    upload_data(kernel["work"] / "data")
    setup = first_code_cell(NOTEBOOKS[0])
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(setup), nbformat.v4.new_code_cell(setup), nbformat.v4.new_code_cell(SHOW),
        nbformat.v4.new_code_cell(
            "from pathlib import Path\nfrom mnist_helpers.launch import torchrun\n"
            "Path('w.py').write_text('import json, sys, torch.distributed as dist, mnist_helpers\\n'\n"
            "    'dist.init_process_group(\"gloo\")\\n'\n"
            "    'print(\"worker sees\", mnist_helpers.__file__)\\n'\n"
            "    'dist.barrier()\\n'\n"
            "    'dist.destroy_process_group()\\n')\n"
            "torchrun('w.py', nproc=2, device='cpu', timeout=240)"),
    ])
    NotebookClient(nb, kernel_name="hosted", timeout=600,
                   resources={"metadata": {"path": str(kernel["work"])}}).execute()
    out = notebook_runs.stdout_of(nb)
    assert out.count("profile: quick (MNIST_PROFILE is set)") == 2, out[-3000:]
    seen = re.findall(r"(?:series at|worker sees) (\S+)", out)
    assert len(seen) == 3 and all(Path(p).is_relative_to(kernel["site"]) for p in seen), seen
    assert f"data in {kernel['work'] / 'data'}" in out and f"results in {kernel['work'] / 'results'}" in out, out


@pytest.mark.kernel
def test_a_read_only_series_folder_is_never_written(series, tmp_path, monkeypatch):
    """The Kaggle route: the series is a read-only dataset folder that ships MNIST. 00's setup, environment and data
    cells and 06's first DDP launch (the learner's scripts, a 2-process torchrun) run in a kernel that sees the
    folder read-only; the first cell runs twice; data are read in place, results go to the working directory, and
    the tree is unchanged afterwards."""
    folder = series["folder"]
    if not (folder / "data" / "MNIST" / "raw").is_dir():
        upload_data(folder / "data")
    before = _tree(folder)
    kernel = make_kernel(series, tmp_path, read_only=folder)
    hosted_env(monkeypatch, kernel, str(folder))
    nb00, nb06 = notebook_runs.path_of("00_setup_and_data"), notebook_runs.path_of("06_ddp_fundamentals")
    first00 = notebook_runs.code_cells(nb00)[0][0]
    cells00 = [first00] + cells_through(nb00, "torchvision sees")
    ran = notebook_runs.run_cells(nb00, cells00, "hosted", kernel_name="hosted", cwd=kernel["work"], timeout=600,
                                  extra=[SHOW])
    out = notebook_runs.stdout_of(ran)
    assert out.count("profile: quick (MNIST_PROFILE is set)") == 2, out[-3000:]
    assert "torchvision sees 60,000 training and 10,000 test images" in out, out[-2000:]
    assert f"data in {folder / 'data'}" in out and f"results in {kernel['work'] / 'results'}" in out, out
    (seen,) = re.findall(r"series at (\S+)", out)
    assert Path(seen).is_relative_to(kernel["site"]), seen

    cells06 = cells_through(nb06, "REPLICAS = len(", skip=("worker_diffs",))
    ran = notebook_runs.run_cells(nb06, cells06, "hosted", kernel_name="hosted", cwd=kernel["work"], timeout=600)
    out = notebook_runs.stdout_of(ran)
    assert "distinct final weights across ranks: 1" in out, out[-3000:]
    assert (kernel["work"] / "work" / "train_ddp.py").is_file()
    assert _tree(folder) == before, "something was written inside the read-only series"


@pytest.mark.kernel
def test_without_the_series_the_cell_says_what_to_set(series, tmp_path, monkeypatch):
    kernel = make_kernel(series, tmp_path)
    hosted_env(monkeypatch, kernel, "")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(first_code_cell(NOTEBOOKS[0]))])
    client = NotebookClient(nb, kernel_name="hosted", timeout=300, resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(Exception) as err:
        client.execute()
    assert "set MNIST_SERIES: README, 'Hosted'" in str(err.value)
