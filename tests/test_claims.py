"""The claims table: README == generator output, every quoted number held by its reference file, the schema, the load rule."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mnist_helpers import claims

ROOT = Path(__file__).resolve().parent.parent


def _make_claims():
    spec = importlib.util.spec_from_file_location("make_claims", ROOT / "scripts" / "make_claims.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MC = _make_claims()
REFS = MC.load_references()


def test_readme_table_is_the_generators_output():
    readme = (ROOT / "README.md").read_text()
    assert readme == MC.replace_table(readme, MC.generate(REFS)), "README's claims table is stale: run `make claims`"


def test_check_mode_fails_on_a_hand_edit(tmp_path):
    readme = (ROOT / "README.md").read_text()
    edited = tmp_path / "README.md"
    edited.write_text(readme.replace(MC.BEGIN + "\n| claim", MC.BEGIN + "\n| a hand-edited claim"))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_claims.py"), "--check", "--readme",
                          str(edited)], capture_output=True, text=True)
    assert out.returncode == 1 and "make claims" in out.stdout


def test_every_catalogued_claim_has_a_row():
    table = MC.generate(REFS)
    for c in claims.CATALOG:
        assert f"{MC._cell(c['claim'])} ({c['section']})" in table, c["id"]


@pytest.mark.parametrize("ref", REFS, ids=[r["_path"] for r in REFS])
def test_reference_files_follow_the_schema(ref):
    info = ref["machine"]
    for key in ("cpu_model", "isa_flags", "logical_cores", "torch", "gpus", "load_avg_1min"):
        assert key in info, f"{ref['_path']}: machine lacks {key}"
    assert ref["profile"] in ("full", "quick") and ref["date"][:4].isdigit()
    assert ref["_label"] == ref["machine_label"] or os.environ.get("MNIST_MACHINE_LABEL"), \
        f"{ref['_path']} sits in folder {ref['_label']} but was measured on {ref['machine_label']}"
    for entry in ref["claims"]:
        assert entry["verdict"] in claims.VERDICTS, (entry["id"], entry["verdict"])
        assert claims._ID.match(entry["id"]) and entry["claim"] and entry["regime"] and entry["numbers"]
        assert entry["id"] in claims.CATALOG_IDS or entry["section"] == "ours", entry["id"]
        c = entry.get("contention")
        if c and c.get("busy"):
            assert entry["verdict"] == claims.BUSY, f"{entry['id']}: measured on a busy machine but judged"


@pytest.mark.parametrize("ref", REFS, ids=[r["_path"] for r in REFS])
def test_every_number_in_evidence_is_held_by_the_file(ref):
    for entry in ref["claims"]:
        assert claims.unsourced_numbers(entry) == [], (entry["id"], entry["evidence"])


def test_unsourced_numbers_finds_a_typed_number():
    entry = {"claim": "x", "regime": "batch 128", "numbers": {"acc": 0.9812, "ratio": 1.934, "peak": 133 * 2**20},
             "evidence": "98.1% at batch 128, 1.93x, 133 MiB, 3 seeds"}
    assert claims.unsourced_numbers(entry) == []
    entry["evidence"] += ", 2.5x faster"
    assert claims.unsourced_numbers(entry) == ["2.5"]
    entry = {"claim": "x", "regime": "", "numbers": {"diff": 3.7e-9}, "evidence": "differ by 3.7e-09, not 4.1e-09"}
    assert claims.unsourced_numbers(entry) == ["4.1e-09"]


def test_result_file_rejects_what_would_break_the_table(tmp_path):
    res = claims.ResultFile("04_batch_size_and_lr", profile="quick", folder=tmp_path)
    good = dict(verdict="holds", evidence="e", numbers={"a": 1}, regime="r")
    with pytest.raises(claims.ClaimError, match="one of"):
        res.claim("04.double_batch_double_lr", **{**good, "verdict": "mostly true"})
    with pytest.raises(claims.ClaimError, match="NN.slug"):
        res.claim("double batch", **good)
    with pytest.raises(claims.ClaimError, match="not in claims.CATALOG"):
        res.claim("04.made_up", **good)
    with pytest.raises(claims.ClaimError, match="numbers"):
        res.claim("04.double_batch_double_lr", **{**good, "numbers": {}})
    res.claim("04.double_batch_double_lr", **good)
    data = json.loads(res.write().read_text())
    assert data["schema"] == claims.SCHEMA and data["claims"][0]["section"] == "3"
    with pytest.raises(claims.ClaimError, match="full run"):
        res.keep_as_reference()


def test_keep_refuses_a_quick_run(tmp_path, monkeypatch):
    monkeypatch.setenv("MNIST_RESULTS_DIR", str(tmp_path))
    res = claims.ResultFile("04_batch_size_and_lr", profile="quick")
    res.claim("04.double_batch_double_lr", verdict="holds", evidence="e", numbers={"a": 1}, regime="r")
    res.write()
    with pytest.raises(MC.UsageError, match="full"):
        MC.keep("04_batch_size_and_lr")


def test_unmeasured_claims_are_labelled_not_judged():
    table = MC.render(MC.collect([]), [])
    assert table.count(MC.NOT_MEASURED) == len(claims.CATALOG)


def test_several_machines_side_by_side():
    def ref(label, verdict):
        return {"_label": label, "_path": f"results/reference/{label}/05.json", "date": "2026-12-03", "profile": "full",
                "machine": {"cpu_model": "CPU", "logical_cores": 2, "torch": "2.14.1", "isa_flags": []},
                "claims": [{"id": "05.amp_memory_speed", "claim": "AMP", "section": "6", "verdict": verdict,
                            "evidence": f"{label} numbers", "numbers": {"a": 1}, "regime": "r"}]}
    table = MC.render(*(lambda refs: (MC.collect(refs), refs))([ref("a-amx", "holds"), ref("b-avx2", "wrong")]))
    row = next(line for line in table.splitlines() if "halves memory" in line)
    assert "a-amx: holds; b-avx2: wrong" in row and "*a-amx*" in row and "*b-avx2*" in row


def test_a_verdict_on_an_earlier_speedrun_recipe_is_labelled():
    """The table says when a kept speedrun verdict timed a recipe the code no longer trains, and what changed."""
    from mnist_helpers.lessons import l10_speedrun as speedrun

    def ref(label, **change):
        fast = speedrun.get_recipe("fast", "cpu", choice={"amp": "none", "channels_last": True, "compile": False})
        return {"_label": label, "_path": f"results/reference/{label}/bench_time_to_accuracy.json",
                "date": "2026-12-04", "profile": "full", "device": "cpu",
                "recipes": {"fast": {**fast.to_dict(), **change}},
                "machine": {"cpu_model": "CPU", "logical_cores": 2, "torch": "2.14.1", "isa_flags": []},
                "claims": [{"id": "10.speedrun_99", "claim": "speedrun", "section": "ours", "verdict": "holds",
                            "evidence": f"{label} numbers", "numbers": {"a": 1}, "regime": "r"}]}
    refs = [ref("today"), ref("then", batch_size=128, model="speednet")]
    row = next(line for line in MC.render(MC.collect(refs), refs).splitlines() if "fastest time to 99.0%" in line)
    assert "then: holds (earlier recipe); today: holds |" in row
    assert "*then*, 2026-12-04, an earlier recipe (model speednet -> speednet_s2; batch_size 128 -> 64): " in row
    assert "*today*, 2026-12-04: today numbers" in row
    refs = [ref("today")]
    row = next(line for line in MC.render(MC.collect(refs), refs).splitlines() if "fastest time to 99.0%" in line)
    assert "| holds |" in row and "earlier" not in row


def test_machine_labels():
    info = {"cpu_model": "Intel(R) Xeon(R) Processor", "logical_cores": 2, "cpu_capability": "AVX512",
            "isa_flags": ["amx_tile", "avx2"], "onednn_max_cpu_isa": None, "gpus": []}
    assert claims.machine_label(info) == "xeon-2core-amx"
    assert claims.machine_label({**info, "cpu_capability": "AVX2", "onednn_max_cpu_isa": "AVX2"}) == "xeon-2core-avx2only"
    assert claims.machine_label({**info, "cpu_model": "AMD EPYC 7B13", "cpu_capability": "AVX2",
                                 "isa_flags": ["avx2"]}) == "epyc-2core-avx2"
    assert claims.machine_label({**info, "gpus": [{"name": "NVIDIA H200"}]}) == "xeon-2core-amx-h200"


def test_spread_and_separation():
    s = claims.spread([3.0, 1.0, 2.0, 4.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 1.0, 4.0, 4)
    assert claims.separated([5, 6], [1, 2]) and not claims.separated([1, 3], [2, 4])


BUSY_LOOP = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the load rule reads /proc/stat (Linux)")
def test_contention_counts_other_processes_not_our_children():
    # an orphan (its parent exits at once) is not ours: its CPU is "other processes"
    with claims.Contention() as c:
        subprocess.run(["sh", "-c", f"{sys.executable} -c '{BUSY_LOOP.format(s=1.5)}' &"], check=True)
        time.sleep(1.5)
    assert c.others_share is not None and c.others_share > 0.15, c
    time.sleep(0.5)  # let the orphan finish
    # our own child's CPU time is subtracted: what is left cannot exceed the machine minus that child
    before = claims._own_seconds()
    subprocess.run([sys.executable, "-c", "import time\nwhile time.process_time() < 1.0: pass"], check=True)
    assert claims._own_seconds() - before >= 0.9


def test_busy_verdict():
    quiet, busy = claims.Contention(), claims.Contention()
    for c, share in ((quiet, 0.05), (busy, 0.6)):
        c.others_share, c.load_before, c.load_after, c.cores, c.wall_s = share, 1.0, 1.0, 2, 1.0
    assert claims.busy_verdict(quiet) is None and claims.busy_verdict(quiet, busy) == claims.BUSY
    assert claims.busy_verdict(None) is None
