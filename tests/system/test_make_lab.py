"""`make lab` starts JupyterLab as the README says, as the user the tests run as (root in CI) (issue 24).

The README's lines are run as written, with a free port in place of 8888: the SSH-tunnel line
(`make lab LAB_ARGS="--no-browser --port=8888"`) and the container line (`--ip=0.0.0.0`, plus `--port`).
Each test waits for the URL with its token, fetches /lab and the notebook list through the REST API
(/api/contents), opens notebook 00 through the API, and stops make's process group; tests/lab_server.py
then checks /proc that no process it started is left. On a fresh root shell `make lab` used to stop at once
("Running as root is not recommended. Use --allow-root to bypass.").
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from lab_server import REPO, lab_argv, make_lab, readme_lab_line

NOTEBOOK = "00_setup_and_data.ipynb"
ROOT = os.geteuid() == 0

pytestmark = pytest.mark.timeout(400)


@pytest.mark.process
@pytest.mark.parametrize("flag", ["--port=8888", "--ip=0.0.0.0"], ids=["ssh-tunnel", "container"])
def test_make_lab_as_the_readme_says(flag, tmp_path):
    line = readme_lab_line(flag)
    assert "--no-browser" in line, f"the README's remote/container line should not try to open a browser: {line}"
    with make_lab(line, tmp_path) as lab:
        out = lab.output()
        assert lab.argv == lab_argv(line, lab.port), "the port LAB_ARGS asked for is the port JupyterLab serves on"
        assert ("--allow-root" in out) == ROOT, "as root (only) make adds --allow-root, and says so"
        if ROOT:
            assert "you are root" in out
        assert "Running as root is not recommended" not in out

        status, kind, page = lab.get("/lab")
        assert status == 200 and "html" in kind and "jupyter-config-data" in page, page[:500]

        listing = lab.api("/api/contents")
        names = {item["name"] for item in listing["content"]}
        on_disk = {p.name for p in (REPO / "notebooks").glob("[0-9]*.ipynb")}
        assert on_disk and on_disk <= names, f"notebooks/ served at the root: missing {sorted(on_disk - names)}"

        nb = lab.api(f"/api/contents/{NOTEBOOK}")
        assert nb["type"] == "notebook" and nb["format"] == "json"
        committed = json.loads((REPO / "notebooks" / NOTEBOOK).read_text())
        assert len(nb["content"]["cells"]) == len(committed["cells"]) > 0
        assert nb["content"]["metadata"]["kernelspec"]["name"] == committed["metadata"]["kernelspec"]["name"]


@pytest.mark.process
def test_allow_root_only_for_root():
    """The dry run (`make -n lab`) adds --allow-root for uid 0 only; as root, also checked as uid 65534."""
    def jupyter_line(prefix):
        out = subprocess.run([*prefix, "make", "-n", "lab", "LAB_ARGS=--no-browser"], cwd=REPO, text=True,
                             capture_output=True, timeout=60).stdout
        return [ln for ln in out.splitlines() if "jupyter lab" in ln][-1]

    line = jupyter_line([])
    assert ("--allow-root" in line) == ROOT and line.endswith("--no-browser"), line
    if ROOT and shutil.which("setpriv"):
        as_nobody = jupyter_line(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
        assert "--allow-root" not in as_nobody and as_nobody.endswith("--no-browser"), as_nobody
