"""A real JupyterLab in a real browser: run notebook 00's cells with Run > Run All Cells (issue 11).

The server is the one a learner starts: the README's `make lab LAB_ARGS="--no-browser --port=8888"` (a free port
in place of 8888), run by tests/lab_server.py as the user the tests run as (root in CI), over notebooks/ itself
(issue 24). The notebook it runs holds the cells of 00 that only a browser can prove (issue 46: the whole of 00
runs once per `make test`, in tests/notebooks/test_all_run.py): the setup cell, the parameters and the values derived from
them, the environment table, the data check, a matplotlib figure and the exercise's answer box; it is written to
notebooks/work/ (ignored by git, where notebook 06 writes its scripts too) from the committed notebook's own cells.
The server's environment carries ``MNIST_PROFILE=quick`` (the kernel runs the quick profile) and JupyterLab
settings of the test's own: every cell in the DOM, no news, and autosave off, so the run never writes outputs into
a committed notebook (every notebooks/*.ipynb checked byte for byte afterwards; restored and failed if one
changed). Headless Debian Chromium, driven by Playwright for Python, opens the notebook, runs all cells, waits until
every code cell has an execution count and the kernel is idle, asserts that no cell shows a traceback, that the
exercise widget (a text box and a Check button) rendered and answers through the kernel, and saves a screenshot to
``results/jupyterlab_00.png``. The widget check runs a generated notebook in a scratch folder
(``make lab ... LAB_DIR=...``). Stopping the server checks that no process it started is left.

Chromium comes from ``scripts/install_browser.sh`` (apt-get, as root); Playwright's own browser download is
never used. The test skips, saying why, only where /usr/bin/chromium is missing and cannot be installed.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import notebook_runs
from lab_server import make_lab, readme_lab_line

REPO = Path(__file__).resolve().parents[2]
SOURCE = "00_setup_and_data.ipynb"
# setup, parameters, the values derived from them, environment table, data check, a figure, answer box
BROWSER_CELLS_00 = [1, 2, 3, 5, 7, 13, 28]
NOTEBOOK = "work/browser_00.ipynb"
CHROMIUM = os.environ.get("MNIST_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]
RUN_TIMEOUT_S = int(os.environ.get("MNIST_BROWSER_TIMEOUT", "900"))

pytestmark = [pytest.mark.system, pytest.mark.timeout(RUN_TIMEOUT_S + 300)]


def _settings(folder: Path) -> None:
    """JupyterLab user settings for the test: every cell in the DOM (no windowing), no news or update checks,
    no autosave (the run must not write outputs into the notebook)."""
    (folder / "@jupyterlab" / "docmanager-extension").mkdir(parents=True)
    (folder / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings").write_text(
        json.dumps({"autosave": False}))
    (folder / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (folder / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none"}))
    (folder / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (folder / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))


WIDGETS_NOTEBOOK = "widgets_check.ipynb"
WIDGET_CELLS = [
    # the loader sweep widget of 03, on a small synthetic data set (no MNIST needed, a few batches)
    "import torch\nfrom torch.utils.data import TensorDataset\nfrom mnist_helpers.lessons.n03.lesson import loader_widget\n\n"
    "ds = TensorDataset(torch.randn(512, 1, 28, 28), torch.zeros(512, dtype=torch.long))\n"
    "_ = loader_widget(ds, num_workers=0, batch_size=64, max_batches=4, max_workers=2)",
    # the experiment dashboard of 09, on two made-up rows
    "from mnist_helpers.lessons.n09 import lesson as library\n\n"
    "rows = [{'notebook': '02', 'name': 'a', 'machine': 'm', 'images_per_s': 1000.0, 'final_test_acc': 0.98},\n"
    "        {'notebook': '04', 'name': 'b', 'machine': 'm', 'images_per_s': 2000.0, 'final_test_acc': 0.97}]\n"
    "library.dashboard(rows)",
]


def _widgets_notebook(path: Path) -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell(src) for src in WIDGET_CELLS])
    nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}}
    nbformat.write(nb, path)


@pytest.fixture
def chromium() -> str:
    if not Path(CHROMIUM).exists():
        script = REPO / "scripts" / "install_browser.sh"
        result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=900)
        if not Path(CHROMIUM).exists():
            pytest.skip(f"{CHROMIUM} is missing and could not be installed "
                        f"({(result.stdout + result.stderr).strip().splitlines()[-1:] or 'no output'})")
    return CHROMIUM


def _lab_env(tmp_path: Path) -> dict:
    _settings(tmp_path / "settings")
    return {"MNIST_PROFILE": "quick", "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}


@pytest.fixture
def lab(tmp_path):
    """`make lab` as the README says, over notebooks/ (or $MNIST_BROWSER_NOTEBOOKS); yields (base_url, token, dir).

    The committed notebook must come out byte for byte as it went in (autosave is off; nothing saves it)."""
    import nbformat

    folder = Path(os.environ.get("MNIST_BROWSER_NOTEBOOKS", REPO / "notebooks")).resolve()
    checkpoints = folder / ".ipynb_checkpoints"
    committed = sorted(folder.glob("*.ipynb"))
    before, had_checkpoints = {p: p.read_bytes() for p in committed}, checkpoints.exists()
    nb = nbformat.read(folder / SOURCE, as_version=4)
    assert ("find_spec" in nb.cells[1].source and "QUICK =" in nb.cells[3].source
            and "answer_box(" in nb.cells[28].source), f"the browser's cells of {SOURCE} moved: update BROWSER_CELLS_00"
    nb.cells = [nb.cells[i] for i in BROWSER_CELLS_00]
    (folder / NOTEBOOK).parent.mkdir(exist_ok=True)
    nbformat.write(nb, folder / NOTEBOOK)
    try:
        with make_lab(readme_lab_line("--port=8888"), tmp_path,
                      lab_dir=None if folder == REPO / "notebooks" else folder, env=_lab_env(tmp_path)) as server:
            yield server.base, server.token, folder
    finally:
        if not had_checkpoints:
            shutil.rmtree(checkpoints, ignore_errors=True)
        (folder / NOTEBOOK).unlink(missing_ok=True)
        changed = [p.name for p in committed if p.read_bytes() != before[p]]
        for p in committed:
            if p.name in changed:
                p.write_bytes(before[p])
    if changed:
        pytest.fail(f"running {NOTEBOOK} in JupyterLab wrote into the committed notebooks {changed} (restored now)")


@pytest.fixture
def widgets_lab(tmp_path):
    """`make lab` as the README says, with LAB_DIR= a scratch folder holding the widgets notebook."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _widgets_notebook(folder / WIDGETS_NOTEBOOK)
    with make_lab(readme_lab_line("--port=8888"), tmp_path, lab_dir=folder, env=_lab_env(tmp_path)) as server:
        yield server.base, server.token, folder


def _progress(page) -> dict:
    return page.evaluate("""() => {
        const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
            .map(p => p.textContent.trim());
        const status = document.querySelector('.jp-Notebook-ExecutionIndicator');
        return {prompts, kernel: status ? status.getAttribute('data-status') : null};
    }""")


def _open_and_run_all(page, sync_api, base: str, token: str, name: str, shots: Path) -> None:
    """Open notebook ``name``, Run > Run All Cells, and wait until every code cell ran and the kernel is idle."""
    page.goto(f"{base}/lab/tree/{name}?token={token}", timeout=120_000)
    page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=120_000)
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=120_000)
    # the status bar says "Idle" only once the kernel's websocket is connected: clicking Run All before that
    # can leave every cell unrun (seen once here when the first connection attempt got a 500)
    page.locator(".jp-StatusBar-Widget", has_text="Idle").first.wait_for(timeout=120_000)
    time.sleep(1)
    n_code = page.locator(".jp-Notebook .jp-CodeCell").count()
    assert n_code > 0

    def run_all():
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()

    run_all()
    for _ in range(30):  # a click that reached no kernel leaves every prompt empty: click once more
        if any(t != "[ ]:" for t in _progress(page)["prompts"]):
            break
        time.sleep(1)
    else:
        print("[browser] no cell started within 30 s: Run All Cells again", flush=True)
        run_all()

    deadline, state = time.monotonic() + RUN_TIMEOUT_S, {}
    while time.monotonic() < deadline:
        state = _progress(page)
        print(f"[browser] {time.strftime('%H:%M:%S')} kernel {state['kernel']}, prompts {state['prompts']}", flush=True)
        done = [t for t in state["prompts"] if re.fullmatch(r"\[\d+\]:", t)]
        if len(done) == n_code and state["kernel"] == "idle":
            break
        time.sleep(2)
    else:
        page.screenshot(path=str(shots / f"jupyterlab_{Path(name).stem}_timeout.png"))
        pytest.fail(f"not every cell ran within {RUN_TIMEOUT_S} s: prompts {state.get('prompts')}, "
                    f"kernel {state.get('kernel')}")

    errors = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    tracebacks = [t for t in errors.all_inner_texts()
                  if "Traceback" in t or re.search(r"^\w*(Error|Exception)\b.*:", t, re.M)]
    assert not tracebacks, f"a cell of {name} failed in JupyterLab:\n" + "\n---\n".join(tracebacks)[:4000]


@contextlib.contextmanager
def _browser_page(chromium):
    """(playwright's sync_api, a fresh page in headless Chromium, the screenshots folder); closed afterwards."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: "
                                   "pip install -e '.[dev]' (it is in the dev extra)")
    shots = REPO / "results"
    shots.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=FLAGS)
        try:
            yield sync_api, browser.new_page(viewport={"width": 1400, "height": 1000}), shots
        finally:
            browser.close()


def test_run_all_cells_in_jupyterlab(chromium, lab):
    base, token, _ = lab
    with _browser_page(chromium) as (sync_api, page, shots):
        t0 = time.monotonic()
        _open_and_run_all(page, sync_api, base, token, NOTEBOOK, shots)
        notebook_runs.log(Path(SOURCE).stem, "browser", BROWSER_CELLS_00, time.monotonic() - t0)

        # the exercise's answer box: a live ipywidgets view, talking to the kernel
        widget = page.locator(".jp-OutputArea-output .jupyter-widgets.widget-text input")
        try:
            widget.first.wait_for(timeout=60_000)
        except sync_api.TimeoutError:
            page.screenshot(path=str(shots / "jupyterlab_00_no_widget.png"))
            pytest.fail(f"no widget view rendered in {NOTEBOOK}: its exercise cells carry the answer box; "
                        "run `python scripts/build_exercises.py` if the notebook was regenerated without them")
        assert page.locator(".jp-OutputArea-output .widget-button").count() >= 1
        widget.first.scroll_into_view_if_needed()
        widget.first.fill("32")
        page.locator(".jp-OutputArea-output .widget-button", has_text="Check").first.click()
        feedback = page.locator(".jp-OutputArea-output .widget-output", has_text="per-process batch")
        feedback.first.wait_for(timeout=60_000)
        page.screenshot(path=str(shots / "jupyterlab_00.png"))


def test_widget_helpers_render_in_jupyterlab(chromium, widgets_lab):
    """The loader sweep (03) and the experiment dashboard (09) render as live widgets and answer the kernel."""
    base, token, _ = widgets_lab
    with _browser_page(chromium) as (sync_api, page, shots):
        _open_and_run_all(page, sync_api, base, token, WIDGETS_NOTEBOOK, shots)
        cells = page.locator(".jp-Notebook .jp-CodeCell")
        loader, board = cells.nth(0), cells.nth(1)
        loader.locator(".widget-button", has_text="Measure").wait_for(timeout=60_000)
        assert loader.locator(".widget-slider, .widget-hslider").count() >= 2, "num_workers and prefetch sliders"
        before = loader.locator(".widget-output").inner_text()
        loader.locator(".widget-button", has_text="Measure").click()
        loader.locator(".widget-output", has_text="img/s").wait_for(timeout=120_000)
        assert before.strip() == "", "the Measure button wrote the new measurement into the widget's output"
        board.locator(".widget-dropdown select").first.wait_for(timeout=60_000)
        board.locator(".widget-dropdown select").first.select_option("04")
        board.locator(".widget-output", has_text="b").wait_for(timeout=60_000)
        page.screenshot(path=str(shots / "jupyterlab_widgets.png"))
