"""The claims: docs/CLAIMS.md and the README's summary == generator output, every quoted number held by its reference
file, the schema, the load rule."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mnist_helpers.course import claims

ROOT = Path(__file__).resolve().parents[2]


def _make_claims():
    spec = importlib.util.spec_from_file_location("make_claims", ROOT / "scripts" / "make_claims.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MC = _make_claims()
REFS = MC.load_references()


def test_readme_summary_and_claims_doc_are_the_generators_output():
    summary, doc = MC.generate(REFS)
    readme = (ROOT / "README.md").read_text()
    assert readme == MC.replace_table(readme, summary), "README's claims summary is stale: run `make claims`"
    assert MC.CLAIMS_DOC.read_text() == doc, "docs/CLAIMS.md is stale: run `make claims`"


def _copies(tmp_path):
    readme, doc = tmp_path / "README.md", tmp_path / "CLAIMS.md"
    readme.write_text((ROOT / "README.md").read_text())
    doc.write_text(MC.CLAIMS_DOC.read_text())
    return readme, doc


def _make_claims_cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "make_claims.py"), *map(str, args)],
                          capture_output=True, text=True)


@pytest.mark.process
@pytest.mark.parametrize("edit", ["readme", "doc"])
def test_check_mode_fails_on_a_hand_edit(tmp_path, edit):
    readme, doc = _copies(tmp_path)
    if edit == "readme":
        readme.write_text(readme.read_text().replace(MC.BEGIN + "\n", MC.BEGIN + "\n65 claims, typed by hand\n"))
    else:
        doc.write_text(doc.read_text().replace("| wrong |", "| holds |", 1))
    out = _make_claims_cli("--check", "--readme", readme, "--doc", doc)
    assert out.returncode == 1 and "make claims" in out.stdout, out.stdout[-2000:]


@pytest.mark.process
def test_make_claims_twice_changes_nothing(tmp_path):
    """`make claims` regenerates both files; a second run finds them current and leaves them byte for byte."""
    readme, doc = _copies(tmp_path)
    doc.write_text("stale\n")
    assert _make_claims_cli("--readme", readme, "--doc", doc).returncode == 0
    first = readme.read_bytes(), doc.read_bytes()
    out = _make_claims_cli("--readme", readme, "--doc", doc)
    assert out.returncode == 0 and out.stdout.count("already current") == 2, out.stdout
    assert (readme.read_bytes(), doc.read_bytes()) == first
    assert _make_claims_cli("--check", "--readme", readme, "--doc", doc).returncode == 0


def _verdict_table(doc: str) -> list[str]:
    section = doc.split("\n## Verdicts\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| [")]


def test_every_catalogued_claim_has_a_short_row():
    rows = _verdict_table(MC.generate(REFS)[1])
    for c in claims.CATALOG:
        assert any(f"| {MC._cell(c['claim'])} ({c['section']}) |" in row for row in rows), c["id"]
    too_long = [row for row in rows if len(row) > 300]
    assert not too_long, f"verdict rows over 300 characters (the evidence belongs below): {too_long[:2]}"


def test_every_row_links_to_its_evidence_section():
    doc = MC.generate(REFS)[1]
    for row in _verdict_table(doc):
        cid = row.split("[", 1)[1].split("]", 1)[0]
        assert f"](#{MC.anchor(cid)})" in row and f"\n### {cid}\n" in doc, cid
    assert MC.anchor("12.local_rank_arg") == "12local_rank_arg"


def test_summary_counts_every_verdict_once():
    rows = MC.collect(REFS)
    summary = MC.render_summary(rows)
    for label in MC.machines(rows):
        line = next(ln for ln in summary.splitlines() if ln.startswith(f"| `{label}` |"))
        judged, *counts = [int(x) for x in line.strip("|").split("|")[1:]]
        assert judged == sum(counts) == sum(m["label"] == label and MC.counted(m) for r in rows
                                            for m in r["by_machine"]), label
    assert "(docs/CLAIMS.md)" in summary and len(summary) < 2000


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
        if c and c.get("busy"):  # a busy machine voids a judgement; "not testable here" judges nothing
            assert entry["verdict"] in (claims.BUSY, "not testable here"), \
                f"{entry['id']}: measured on a busy machine but judged"


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
    rows = MC.collect([])
    table = _verdict_table(MC.render_doc(rows, []))
    assert len(table) == len(claims.CATALOG) and all(MC.NOT_MEASURED in row for row in table)
    assert f"{len(claims.CATALOG)} not measured yet on any machine" in MC.render_summary(rows)


def test_several_machines_side_by_side():
    def ref(label, verdict):
        return {"_label": label, "_path": f"results/reference/{label}/05.json", "date": "2026-12-03", "profile": "full",
                "machine": {"cpu_model": "CPU", "logical_cores": 2, "torch": "2.14.1", "isa_flags": []},
                "claims": [{"id": "05.amp_memory_speed", "claim": "AMP", "section": "6", "verdict": verdict,
                            "evidence": f"{label} numbers", "numbers": {"a": 1}, "regime": "r",
                            "rule": claims.rule("05.amp_memory_speed")}]}
    refs = [ref("a-amx", "holds"), ref("b-avx2", "wrong")]
    doc = MC.render_doc(MC.collect(refs), refs)
    assert "| `a-amx` | `b-avx2` |" in doc
    row = next(line for line in _verdict_table(doc) if "halves memory" in line)
    assert row.endswith("| holds | wrong |")
    assert next(line for line in _verdict_table(doc) if "Double the batch" in line).endswith(
        f"| {MC.NOT_MEASURED} | {MC.NOT_MEASURED} |")
    assert "- *a-amx*, 2026-12-03: **holds**. a-amx numbers. Regime: r." in doc and "- *b-avx2*, 2026-12-03: **wrong**" in doc


def test_a_verdict_on_an_earlier_speedrun_recipe_is_labelled():
    """The claims page says when a kept speedrun verdict timed a recipe the code no longer trains, and what changed."""
    from mnist_helpers.lessons.n10 import speedrun

    def ref(label, **change):
        fast = speedrun.get_recipe("fast", "cpu", choice={"amp": "none", "channels_last": True, "compile": False})
        return {"_label": label, "_path": f"results/reference/{label}/bench_speedrun.json",
                "date": "2026-12-04", "profile": "full", "device": "cpu",
                "recipes": {"fast": {**fast.to_dict(), **change}},
                "machine": {"cpu_model": "CPU", "logical_cores": 2, "torch": "2.14.1", "isa_flags": []},
                "claims": [{"id": "10.speedrun_99", "claim": "speedrun", "section": "ours", "verdict": "holds",
                            "evidence": f"{label} numbers", "numbers": {"a": 1}, "regime": "r",
                            "rule": claims.rule("10.speedrun_99")}]}
    refs = [ref("today"), ref("then", batch_size=128, model="speednet")]
    doc = MC.render_doc(MC.collect(refs), refs)
    row = next(line for line in _verdict_table(doc) if "99.0% mean final accuracy" in line)
    assert row.endswith("| holds (earlier recipe) | holds |")  # columns sorted: then, today
    assert "*then*, 2026-12-04, an earlier recipe (model speednet -> speednet_s2; batch_size 128 -> 64): " in doc
    assert "*today*, 2026-12-04: **holds**. today numbers" in doc
    assert "on an earlier speedrun recipe: `then` 1" in MC.render_summary(MC.collect(refs))
    refs = [ref("today")]
    doc = MC.render_doc(MC.collect(refs), refs)
    row = next(line for line in _verdict_table(doc) if "99.0% mean final accuracy" in line)
    assert row.endswith("| holds |") and "earlier" not in row


def test_a_verdict_of_a_test_that_changed_since_is_shown_not_counted(tmp_path):
    """claims.RULES: an entry judged by an earlier rule is labelled, keeps its old verdict in the evidence only and
    is not counted; a rule changed only without a GPU leaves a GPU machine's entry current; new entries carry the
    current rule."""
    def ref(label, rule=None, gpus=()):
        entry = {"id": "04.batch4096", "claim": "4096", "section": "3", "verdict": "holds",
                 "evidence": f"{label} numbers", "numbers": {"a": 1}, "regime": "r"}
        amp = {**entry, "id": "05.amp_memory_speed"}
        if rule is not None:
            entry["rule"] = amp["rule"] = rule
        return {"_label": label, "_path": f"results/reference/{label}/x.json", "date": "2026-12-04",
                "profile": "full", "machine": {"cpu_model": "CPU", "logical_cores": 2, "torch": "2.14.1",
                                               "isa_flags": [], "gpus": list(gpus)}, "claims": [entry, amp]}
    assert claims.rule("04.batch4096") >= 2 and claims.rule("02.baseline") == 1
    refs = [ref("new", rule=claims.rule("04.batch4096")), ref("old"), ref("old-gpu", gpus=[{"name": "H200"}])]
    rows = MC.collect(refs)
    doc, summary = MC.render_doc(rows, refs), MC.render_summary(rows)
    table = _verdict_table(doc)
    assert next(line for line in table if "4096" in line).endswith(
        f"| holds | {MC.EARLIER_RULE} | {MC.EARLIER_RULE} |")  # columns: new, old, old-gpu
    assert next(line for line in table if "halves memory" in line).endswith(f"| holds | {MC.EARLIER_RULE} | holds |")
    assert f"the test has changed since: {claims.RULES['04.batch4096'][1]}" in doc
    assert "not counted (it gave: holds)" in doc
    assert "| `old` | 0 |" in summary and "| `old-gpu` | 1 |" in summary and "`old` 2, `old-gpu` 1" in summary
    res = claims.ResultFile("x", profile="full", folder=tmp_path)
    kept = res.claim("04.batch4096", verdict="holds", evidence="e", numbers={"a": 1}, regime="r")
    assert kept["rule"] == claims.rule("04.batch4096") and MC.earlier_rule(kept) is None


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


@pytest.mark.process
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
