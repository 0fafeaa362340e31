"""scripts/make_diagrams.py (`make diagrams`) draws the five diagrams as valid, small PNGs, the same bytes every run,
and every figure a notebook shows is one it draws (issue 39)."""
from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_diagrams.py"
NAMES = ["dp_step.png", "ring_allreduce.png", "distributed_sampler.png", "torchrun_roles.png",
         "ddp_zero_fsdp_memory.png"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _draw(out: Path) -> dict[str, bytes]:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.png"))}


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, after checking the signature and that the file ends with IEND."""
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    assert data[-8:-4] == b"IEND", "truncated PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    return _draw(tmp_path_factory.mktemp("figures"))


@pytest.mark.process
def test_the_script_draws_the_five_diagrams(drawn):
    assert sorted(drawn) == sorted(NAMES)


@pytest.mark.process
@pytest.mark.parametrize("name", NAMES)
def test_each_is_a_readable_small_png(drawn, name):
    data = drawn[name]
    width, height = png_size(data)
    assert 600 <= width <= 1600 and 400 <= height <= 1200, (width, height)
    assert 5_000 < len(data) < 150_000, f"{name}: {len(data):,} bytes"
    from io import BytesIO

    import matplotlib.image

    img = matplotlib.image.imread(BytesIO(data), format="png")
    assert img.shape[:2] == (height, width) and img.std() > 0.05, "an empty picture"


@pytest.mark.process
def test_a_rerun_writes_the_same_bytes(drawn, tmp_path):
    assert _draw(tmp_path) == drawn, "make_diagrams.py is not deterministic"


@pytest.mark.parametrize("name", NAMES)
def test_the_committed_figures_are_there(name):
    path = ROOT / "notebooks" / "figures" / name
    assert path.is_file(), f"{path} is missing: run `make diagrams`"
    png_size(path.read_bytes())


def test_every_figure_a_notebook_shows_is_drawn_by_the_script():
    for nb in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        text = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"]
                         if c["cell_type"] == "markdown")
        for name in re.findall(r"\]\(figures/([^)\s]+)\)", text):
            assert name in NAMES, f"{nb.name} shows figures/{name}, which scripts/make_diagrams.py does not draw"
