"""Notebooks 01-03 show the code they teach and record their verdicts (issue 17).

Checks the notebooks' *text* (what a learner reads), the harness behind their fair tests (load recorded with every
timing), and the reference result files they wrote: catalog ids, verdict words, every quoted number sourced.
Nothing here asserts a speed or a ratio of the machine it runs on."""
import json
import re
from pathlib import Path

import pytest

from mnist_helpers.course import claims

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = {"01": "01_resource_inspection", "02": "02_single_device_baseline", "03": "03_dataloader_tuning"}
CLAIM_IDS = {
    "01": {"01.config_2x", "01.inspect_first", "01.gpu_memory_enough"},
    "02": {"02.baseline"},
    "03": {"03.workers_fraction", "03.too_many_workers", "03.pin_memory_cpu", "03.disk_io", "03.worker_copies",
           "03.in_memory", "03.drop_last"},
}


def code_of(nb: str) -> str:
    cells = json.loads((REPO / "notebooks" / f"{NOTEBOOKS[nb]}.ipynb").read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("nb,needles", [
    ("01", ["torch.get_num_threads()", "os.cpu_count()", "psutil.virtual_memory()", "torch.cuda.mem_get_info(",
            "recommend_config(", "claims.Contention()"]),
    ("02", ["DataLoader(", "num_workers=4, pin_memory=True", "loss.backward()", "optimizer.step()",
            "optimizer.zero_grad()", "transforms.Normalize((0.1307,), (0.3081,))", "class Net(nn.Module)",
            "torch.optim.Adam(model.parameters(), lr=1e-3)", "fit(cfg)"]),
    ("03", ["DataLoader(", "pin_memory=", "persistent_workers=", "prefetch_factor=", "class InMemoryBatches",
            "make=article_loader", "in_memory=InMemoryBatches", "Contention()"]),
])
def test_the_lesson_is_written_in_the_cells(nb, needles):
    code = code_of(nb)
    missing = [n for n in needles if n not in code]
    assert not missing, f"notebook {nb} no longer writes {missing} in its code cells"


# the lesson modules whose claims_NN(...) the notebooks hand to claims.record (issue 39)
MODULES = {"01": "n01", "02": "n02", "03": "n03"}


def module_source(nb: str) -> str:
    return (REPO / "mnist_helpers" / "lessons" / MODULES[nb] / "lesson.py").read_text()


@pytest.mark.parametrize("nb", sorted(NOTEBOOKS))
def test_each_notebook_records_its_catalogued_claims(nb):
    code = code_of(nb)
    if f'claims.record("{NOTEBOOKS[nb]}"' in code:   # the claims are judged in the lesson module
        assert f"claims_{nb}(" in code and nb in MODULES
        ids = set(re.findall(r'id="(\d\d\.[a-z0-9_]+)"', module_source(nb)))
        assert "res.claim(" not in code and "ResultFile(" not in code, "no claim bookkeeping left in the cells"
    else:
        assert f'claims.ResultFile("{NOTEBOOKS[nb]}"' in code and "res.write()" in code
        ids = set(re.findall(r'res\.claim\("(\d\d\.[a-z0-9_]+)"', code))
    assert CLAIM_IDS[nb] <= ids, f"notebook {nb} does not record {CLAIM_IDS[nb] - ids}"
    assert all(i in claims.CATALOG_IDS for i in CLAIM_IDS[nb])


def test_busy_timings_give_no_verdict_in_the_notebooks():
    """The load rule: the notebook hands its timings' Contention to claims_NN, which applies it (tests/notebooks/test_nNN_claims
    show a busy contention gives claims.BUSY); or, in the older form, the cells call busy_verdict themselves."""
    for nb in ("01", "03"):
        code = code_of(nb)
        if f"claims_{nb}(" in code:
            assert "contention=" in code or "busy_" in code, f"notebook {nb} must hand its timings' load over"
            assert "BUSY" in module_source(nb)
        else:
            assert "busy_verdict(" in code, f"notebook {nb} must apply the load rule to its timings"


def test_framework_sweep_records_the_load_of_every_measurement(monkeypatch):
    from mnist_helpers.lessons.n01 import lesson as l01

    calls = []

    def fake_measure(settings, timeout=300.0):
        calls.append(settings["threads"])
        return {**{k: None for k in l01.SETTING_KEYS}, "threads": settings["threads"],
                "images_per_s": [100.0 * settings["threads"], 110.0 * settings["threads"]], "cpu_cores_busy": [1.0, 1.0]}

    monkeypatch.setattr(l01, "measure", fake_measure)
    rows = l01.threads_sweep([1, 2], rounds=2, echo=False)
    assert calls == [1, 2, 1, 2], "settings interleaved round by round"
    for r in rows:
        assert len(r["samples"]) == 4 and r["blocks"] == 4
        assert "others_cpu_share" in r and "load_avg" in r and isinstance(r["busy"], bool)
    assert rows[1]["vs_best"] == 1.0 and rows[0]["vs_best"] == pytest.approx(0.5)


def _reference_files():
    return sorted((REPO / "results" / "reference").glob("*/0[123]_*.json"))


@pytest.mark.parametrize("path", _reference_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reference_results_are_sourced(path):
    data = json.loads(path.read_text())
    assert data["schema"] == claims.SCHEMA and data["profile"] == "full"
    nb = path.name[:2]
    ids = {c["id"] for c in data["claims"]}
    assert CLAIM_IDS[nb] <= ids
    for c in data["claims"]:
        assert c["verdict"] in claims.VERDICTS
        assert not claims.unsourced_numbers(c), f"{c['id']}: numbers quoted but not recorded"
        assert len(c["evidence"]) <= 400 and c["regime"]
