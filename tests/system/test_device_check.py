"""scripts/device_check.sh cannot rot: its CPU dry run runs every section with tiny sizes and the same file packing
as on the GPU machine (at most 8 files in OUT, an archive with every section's JSON, a manifest with statuses), a
failing run is recorded while its section carries on, and a section over its limit keeps its place as a timeout."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mnist_helpers.course import claims
from mnist_helpers.errors import UsageError
from mnist_helpers.memory import gpu_memory_verdict

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "device_check.sh"
_spec = importlib.util.spec_from_file_location("device_check", REPO / "scripts" / "device_check.py")
dc = importlib.util.module_from_spec(_spec)  # the sections: a script (it runs the lessons' code), not a worker
_spec.loader.exec_module(dc)
MAX_FILES = 8  # what the device machine sends back from $OUT


def run_script(args, out=None, timeout=600, **env):
    full = {**os.environ, "PYTHON": sys.executable, **env}
    full.pop("OUT", None)
    if out is not None:
        full["OUT"] = str(out)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=full)


def archive_members(out: Path) -> dict[str, dict]:
    """{section file name: its JSON} from OUT/device_check.tar.gz."""
    docs = {}
    with tarfile.open(out / dc.ARCHIVE) as tar:
        for m in tar.getmembers():
            if m.isfile() and m.name.endswith(".json"):
                docs[Path(m.name).name] = json.load(tar.extractfile(m))
    return docs


@pytest.mark.process  # every section on the CPU: about 2 minutes on 2 busy cores
def test_cpu_dry_run_packs_every_section(tmp_path, mnist_root):
    out = tmp_path / "out"  # given as $OUT, as on the device machine
    fail = "speedrun_chain:onecycle,nccl:all_reduce 4096"  # two runs fail: recorded, the rest goes on
    done = run_script(["--cpu-dry-run"], out=out, DEVICE_CHECK_FAIL=fail, MNIST_DATA_ROOT=str(mnist_root))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert len(files) <= MAX_FILES and not [p for p in out.iterdir() if p.is_dir()], files
    assert set(files) == {dc.ARCHIVE, *dc.KEY_FILES}, files
    docs = archive_members(out)
    assert {f"{s}.json" for s in dc.SECTIONS} <= set(docs), sorted(docs)
    manifest = json.loads((out / "manifest.json").read_text())
    status = {s["section"]: s["status"] for s in manifest["sections"]}
    assert list(status) == list(dc.SECTIONS)
    assert status == {**{s: "ok" for s in dc.SECTIONS}, "speedrun_chain": "errors", "nccl": "errors"}, status
    assert manifest["dry_run_on_cpu"] is True and manifest["torch"]
    for name in dc.SECTIONS:
        assert docs[f"{name}.json"]["complete"] is True, name
    chain = docs["speedrun_chain.json"]
    assert [e["what"] for e in chain["errors"]] == ["onecycle"]
    ran = [r["recipe"] for r in chain["runs"]]
    assert "onecycle" not in ran and {"tensors", "smallnet", "article"} <= set(ran), ran
    assert ran[-1] == "article"  # the article's step runs last (time_to_accuracy measured it already)
    assert [r["bytes"] for r in docs["nccl.json"]["rows"]] == [2**20]
    assert docs["nccl.json"]["measures"] == dc.NCCL_MEASURES and "not communication" in dc.NCCL_MEASURES
    assert {s["section"]: s.get("measures") for s in manifest["sections"]}["nccl"] == dc.NCCL_MEASURES
    assert "notebooks" not in status  # not part of a CPU dry run unless named
    assert "asked for 2 processes on cuda" in docs["nccl.json"]["two_ranks_on_one_gpu_launcher_says"]
    bench = docs["time_to_accuracy.json"]["bench"]
    assert {r["recipe"] for r in bench["runs"]} == {"article", "fast", "fast995"} and bench["errors"] == []
    assert {c["id"] for c in bench["claims"]} == {"10.speedrun_99", "10.speedrun_995"}
    assert docs["machine.json"]["versions"]["torch"] and docs["machine.json"]["matmul_peak_flops"]
    assert [r["mode"] for r in docs["amp.json"]["rows"]] == ["fp32", "bf16"]
    assert len(docs["loader.json"]["rows"]) == 4
    assert (out / "time_to_accuracy.json").read_text() == json.dumps(docs["time_to_accuracy.json"], indent=1)


@pytest.mark.process
def test_a_section_over_its_limit_is_a_timeout_with_its_place_kept(tmp_path, mnist_root):
    done = run_script([str(tmp_path / "out"), "--cpu-dry-run"], timeout=120, DEVICE_CHECK_SECTIONS="nccl",
                      DEVICE_CHECK_LIMIT_nccl="1", MNIST_DATA_ROOT=str(mnist_root))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [(s["section"], s["status"], s["limit_s"]) for s in manifest["sections"]] == [("nccl", "timeout", 1)]
    assert archive_members(tmp_path / "out")["nccl.json"]["status"] == "timeout"


def test_the_nccl_section_says_it_measures_launch_overhead_not_communication(tmp_path, capsys):
    """One rank: no byte crosses a link, so the times are the launch of a collective; the JSON, every row, the
    output and --judge say so."""
    assert dc.main(["--section", "nccl", "--res", str(tmp_path), "--dry-run"]) == 0
    doc = json.loads((tmp_path / "nccl.json").read_text())
    assert doc["measures"] == dc.NCCL_MEASURES == "launch overhead at world size 1, not communication"
    assert doc["rows"] and all(r["measures"] == dc.NCCL_MEASURES and r["world_size"] == 1 for r in doc["rows"])
    assert dc.NCCL_MEASURES in capsys.readouterr().out
    dc.main(["--judge", str(tmp_path)])
    assert f"section nccl settles no claim: {dc.NCCL_MEASURES}" in capsys.readouterr().out


@pytest.mark.process
def test_the_notebooks_section_is_last_bounded_and_skippable():
    """Static (it needs a GPU to run for real): the script parses, the section runs notebooks 00-11 in the quick
    profile under nbmake on copies, after every other section, under limits cut to the budget."""
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    body = text[text.index("notebooks_section() {"):]
    for piece in ("MNIST_PROFILE=quick", '"$PY" -m pytest --nbmake --nbmake-timeout="$t" --overwrite',
                  '"$REPO"/notebooks/[0-9]*.ipynb', 'cp "$nb" "$dir/$base"', "timeout --kill-after=5",
                  "--notebooks-report", "no time left"):
        assert piece in body, piece
    calls = [line.split()[0:2] for line in text.splitlines() if line.startswith(("section ", "notebooks_section "))]
    assert calls[-1] == ["notebooks_section", "450"] and len(calls) == len(dc.SECTIONS) + 1
    assert "machine time_to_accuracy speedrun_chain amp loader allocator nccl notebooks}" in text


def _tiny_notebook(path, source):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.mark.process  # two notebooks, each its own pytest and kernel: about 30 s on 2 busy cores
def test_the_notebooks_section_records_each_notebook(tmp_path, mnist_root):
    pytest.importorskip("nbmake")
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    ok = _tiny_notebook(nbs / "00_ok.ipynb", "import os\nprint('profile', os.environ['MNIST_PROFILE'])")
    _tiny_notebook(nbs / "01_bad.ipynb", "raise RuntimeError('boom')")
    before = ok.read_text()
    out = tmp_path / "out"
    done = run_script([str(out), "--cpu-dry-run"], timeout=300, DEVICE_CHECK_SECTIONS="notebooks",
                      DEVICE_CHECK_NOTEBOOKS=f"{nbs}/*.ipynb", MNIST_DATA_ROOT=str(mnist_root))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["device_check.tar.gz", "manifest.json", "notebooks/executed_notebooks.tar.gz",
                     "notebooks/notebooks.json"], files
    doc = json.loads((out / "notebooks" / "notebooks.json").read_text())
    assert [(n["notebook"], n["status"]) for n in doc["notebooks"]] == [("00_ok.ipynb", "passed"),
                                                                          ("01_bad.ipynb", "failed")]
    assert doc["complete"] and doc["passed"] == 1 and all(n["seconds"] >= 0 for n in doc["notebooks"])
    assert [e["what"] for e in doc["errors"]] == ["01_bad.ipynb"] and "boom" in doc["errors"][0]["log_tail"]
    with tarfile.open(out / "notebooks" / dc.NOTEBOOKS_ARCHIVE) as tar:
        executed = json.load(tar.extractfile("notebooks/00_ok.ipynb"))
    assert "profile quick" in json.dumps(executed["cells"][0]["outputs"])  # executed, in the quick profile
    assert ok.read_text() == before  # run on a copy: the original keeps its (stripped) outputs
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(s["section"], s["status"]) for s in manifest["sections"]] == [("notebooks", "errors")]


def test_notebooks_report_keeps_what_finished(tmp_path):
    """A time limit mid-way: notebooks not reached are "pending" (killed) or "not run" (no time left)."""
    res, out = tmp_path / "res", tmp_path / "out"
    (res / "notebooks").mkdir(parents=True)
    (res / "notebooks" / "00_a.ipynb").write_text("{}")
    (res / "notebooks.todo").write_text("00_a.ipynb\n01_b.ipynb\n02_c.ipynb\n03_d.ipynb\n")
    (res / "notebooks.tsv").write_text("00_a.ipynb\t0\t40\t120\n01_b.ipynb\t124\t120\t120\n02_c.ipynb\t-1\t0\t0\n")
    doc = dc.notebooks_report(res, out)
    assert [n["status"] for n in doc["notebooks"]] == ["passed", "timeout", "not run (no time left)", "pending"]
    assert not doc["complete"] and [e["what"] for e in doc["errors"]] == ["01_b.ipynb"]
    assert json.loads((out / "notebooks" / "notebooks.json").read_text()) == doc
    with tarfile.open(out / "notebooks" / dc.NOTEBOOKS_ARCHIVE) as tar:
        assert tar.getnames() == ["notebooks/00_a.ipynb"]


@pytest.mark.process
def test_without_an_output_folder_it_says_how_to_give_one(tmp_path):
    done = run_script([], timeout=60)
    assert done.returncode == 2 and "set OUT" in done.stderr, done.stderr
    done = run_script(["a", "b"], timeout=60)
    assert done.returncode == 2 and "usage" in done.stderr


@pytest.mark.process
def test_on_a_machine_without_gpu_the_real_run_refuses(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = run_script([], out=tmp_path / "out", timeout=120)
    assert done.returncode == 1 and "--cpu-dry-run" in done.stderr, done.stderr


def test_finalize_statuses_and_packing(tmp_path):
    res, out = tmp_path / "res", tmp_path / "out"
    res.mkdir()
    rows = [("machine", 0, []), ("time_to_accuracy", 0, [{"what": "fast seed 1"}]), ("speedrun_chain", 124, None),
            ("amp", 1, None), ("loader", -1, None)]
    for name, _, errors in rows:
        if errors is not None:
            (res / f"{name}.json").write_text(json.dumps({"section": name, "complete": True, "torch": "x",
                                                          "errors": errors}))
    (res / "speedrun_chain.json").write_text(json.dumps({"section": "speedrun_chain", "complete": False,
                                                         "runs": [{"recipe": "tensors"}], "errors": []}))
    (res / "manifest.tsv").write_text("".join(f"{n}\t{rc}\t3\t30\n" for n, rc, _ in rows))
    manifest = dc.finalize(res, out, 42.0)
    got = {s["section"]: (s["status"], s["partial_data"]) for s in manifest["sections"]}
    assert got == {"machine": ("ok", False), "time_to_accuracy": ("errors", False),
                   "speedrun_chain": ("timeout", True), "amp": ("failed", True), "loader": ("skipped", False)}
    docs = archive_members(out)
    assert {f"{n}.json" for n, *_ in rows} <= set(docs)
    assert docs["speedrun_chain.json"]["runs"] == [{"recipe": "tensors"}]  # what finished before the limit
    # a section killed after its first save says so in its own JSON, as one that never saved does
    assert (docs["speedrun_chain.json"]["status"], docs["speedrun_chain.json"]["returncode"]) == ("timeout", 124)
    assert (docs["amp.json"]["status"], docs["loader.json"]["status"]) == ("failed", "skipped")
    assert len(list(out.iterdir())) <= MAX_FILES
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_device_check_is_documented():
    """The README points to docs/CLUSTERS.md, which gives the command and its CPU dry run (since 03bb568 the README
    no longer names this workplace's device call)."""
    readme, clusters = (REPO / "README.md").read_text(), (REPO / "docs" / "CLUSTERS.md").read_text()
    assert "bash scripts/device_check.sh" in readme and "docs/CLUSTERS.md" in readme
    assert "bash scripts/device_check.sh" in clusters and "--cpu-dry-run" in clusters


def test_fp32_on_cuda_is_ieee_and_tf32_its_own_mode():
    """The GPU-only switch of compare_precisions, checked without a GPU: the flags are plain attributes."""
    import torch

    from mnist_helpers.lessons.n05.precision import MODES, cuda_math

    assert "tf32" in MODES
    flags = (torch.backends.cudnn, "allow_tf32"), (torch.backends.cuda.matmul, "allow_tf32")
    before = [getattr(o, a) for o, a in flags]
    cuda = torch.device("cuda", 0)
    for mode, want in (("fp32", False), ("fp32 channels_last", False), ("tf32", True)):
        with cuda_math(mode, cuda):
            assert [getattr(o, a) for o, a in flags] == [want, want], mode
        assert [getattr(o, a) for o, a in flags] == before
    torch.backends.cudnn.allow_tf32 = not before[0]
    try:
        with cuda_math("fp32", torch.device("cpu")), cuda_math("bf16", cuda):  # CPU and autocast: untouched
            assert torch.backends.cudnn.allow_tf32 is (not before[0])
    finally:
        torch.backends.cudnn.allow_tf32 = before[0]


def test_a_failing_run_does_not_end_the_benchmark(tmp_path, monkeypatch, capsys):
    """scripts/bench_speedrun.py: a run that raises (a graph capture, a compilation) is recorded and the others go
    on; the JSON says so and the exit code is 1."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_speedrun", REPO / "scripts" / "bench_speedrun.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def fake_run(recipe, seed, **kw):
        if recipe.name == "fast" and seed == 1:
            raise RuntimeError("CUDA graph capture failed")
        t = 120.0 if recipe.name == "article" else 1.0
        return {"recipe": recipe.name, "seed": seed, "protocol": "fixed-schedule", "final_acc": 0.996,
                "train_s": t, "setup_s": 0.1, "eval_s": 0.1, "wall_s": t + 1, "images_per_s": 256.0,
                "compute_dtype": "float32"}

    monkeypatch.setattr(bench.speedrun, "fixed_schedule", fake_run)
    out = tmp_path / "speedrun.json"
    code = bench.main(["--seeds", "2", "--device", "cpu", "--fast", "smallnet", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert code == 1 and doc["complete"] is True and doc["protocol"] == "fixed-schedule"
    assert doc["errors"] == [{"recipe": "fast", "seed": 1, "error": "RuntimeError: CUDA graph capture failed"}]
    assert [(r["recipe"], r["seed"]) for r in doc["runs"]] == [("article", 0), ("fast", 0), ("fast995", 0),
                                                                ("article", 1), ("fast995", 1)]
    assert "failed" in capsys.readouterr().err
    # 2 seeds of a 10-seed protocol: never "holds"
    assert {c["id"]: c["verdict"] for c in doc["claims"]}["10.speedrun_995"] in ("inconclusive", claims.BUSY)


# --------------------------------------------------------------------------- the GPU claims (judged by code)

GPU_MACHINE = {"cpu_model": "Intel(R) Xeon(R) Processor", "logical_cores": 16, "torch": "2.x", "isa_flags": ["amx_tile"],
               "gpus": [{"name": "NVIDIA H200", "memory_gib": 139.8}]}


def _amp_row(batch, mode, img_s, peak, transient, spread=0.02):
    return {"batch_size": batch, "mode": mode, "images_per_s": img_s, "peak_mib": peak, "transient_mib": transient,
            "block_images_per_s": [img_s * (1 - spread), img_s, img_s * (1 + spread)]}


def _fake_run(res: Path, amp_rows, loader_rates, dry=False, passes=None, copy=None):
    """Section JSONs as scripts/device_check.sh writes them, with the numbers given (``passes``: steady passes per
    setting, as many as given around each rate by these relative offsets; ``copy``: pinned/pageable copy times)."""
    res.mkdir(parents=True, exist_ok=True)
    head = {"complete": True, "dry_run_on_cpu": dry, "device": "cpu" if dry else "cuda:0", "torch": "2.x",
            "date_utc": "2026-12-04T12:00:00Z", "machine": GPU_MACHINE, "errors": []}
    (res / "amp.json").write_text(json.dumps({**head, "section": "amp", "rows": amp_rows}))
    rows = [{"num_workers": w, "pin_memory": p, "steady_img_s": v, "first_pass_img_s": 0.9 * v, "images_per_pass": 7680,
             **({"steady_passes_img_s": [v * (1 + d) for d in passes]} if passes else {})}
            for (w, p), v in loader_rates.items()]
    extra = {"host_to_device_copy_us_per_512_batch": {"pinned=False": copy[0], "pinned=True": copy[1]}} if copy else {}
    (res / "loader.json").write_text(json.dumps({**head, "section": "loader", "rows": rows, **extra}))
    return res


def _amp_rows(cases):
    """fp32 and bf16 rows per batch: {batch: (bf16 speed factor, bf16 peak factor)}."""
    rows = []
    for batch, (speed, peak) in cases.items():
        rows += [_amp_row(batch, "fp32", 1000.0 * batch, 0.5 * batch, 0.3 * batch),
                 _amp_row(batch, "bf16", 1000.0 * batch * speed, 0.5 * batch * peak, 0.3 * batch * peak)]
    return rows


@pytest.mark.parametrize("bf16, want", [
    # {batch: (bf16 speed factor, bf16 peak factor)} -> 05.amp_memory_speed
    ({128: (2.0, 0.5), 2048: (2.0, 0.5)}, "holds"),
    ({128: (1.6, 0.9), 2048: (1.6, 0.9)}, "holds with nuance"),       # faster, the peak not halved
    ({128: (0.8, 0.7), 2048: (1.6, 0.47)}, "does not hold here"),     # the H200's shape: only batch 2048 gains
    ({128: (0.9, 1.0), 2048: (0.5, 0.45)}, "does not hold here"),
    ({512: (0.9, 0.9), 2048: (1.6, 0.47)}, "holds with nuance"),      # no batch 128: every batch measured is judged
])
def test_amp_is_judged_at_the_articles_batch(tmp_path, bf16, want):
    """05.amp_memory_speed on a GPU: bf16 against fp32 at the article's batch 128; other batches only reported."""
    rf = dc.judge(_fake_run(tmp_path / "res", _amp_rows(bf16), {}))
    entry = rf.claims["05.amp_memory_speed"]
    assert entry["verdict"] == want
    assert entry["numbers"]["judged_batches"] == ([128] if 128 in bf16 else sorted(bf16))
    assert not claims.unsourced_numbers(entry)


@pytest.mark.parametrize("peak_mib, want", [(400.0, "holds"), (2000.0, "holds with nuance"),
                                            (5000.0, "does not hold here")])
def test_gpu_memory_is_the_articles_step_against_its_8_gb(tmp_path, peak_mib, want):
    """01.gpu_memory_enough on a GPU: the fp32 step at batch 128 against the article's 8 GB GPU (7.5 GiB usable),
    whatever the measuring GPU holds (139.8 GiB here), by notebook 01's own rule."""
    rows = [_amp_row(128, "fp32", 1.0e5, peak_mib, 0.4 * peak_mib),
            _amp_row(128, "bf16", 1.0e5, 0.7 * peak_mib, 0.2 * peak_mib),
            _amp_row(2048, "fp32", 3.0e5, 6000.0, 5000.0), _amp_row(2048, "bf16", 4.0e5, 3000.0, 2500.0)]
    entry = dc.judge(_fake_run(tmp_path / "res", rows, {})).claims["01.gpu_memory_enough"]
    assert entry["verdict"] == want == gpu_memory_verdict(peak_mib)["verdict"]
    assert entry["numbers"]["largest_peak_mib"] == 6000.0 and not claims.unsourced_numbers(entry)


def test_one_loader_pass_per_setting_is_not_judged(tmp_path):
    """07.workers_4_to_8 from single passes (the kept H200 run): inconclusive, whatever the ratio, with the first
    pass's swing and the pending rerun said; repeated passes decide it (test below)."""
    rates = {(4, False): 2.0e4, (8, False): 3.0e4, (4, True): 2.0e4, (8, True): 3.0e4}   # x1.5 in both
    entry = dc.judge(_fake_run(tmp_path / "res", [], rates)).claims["07.workers_4_to_8"]
    assert entry["verdict"] == "inconclusive" and "pending" in entry["evidence"]
    assert entry["numbers"]["first_vs_steady_max"] == pytest.approx(1 / 0.9)
    assert not claims.unsourced_numbers(entry)
    rf = dc.judge(_fake_run(tmp_path / "rep", [], rates, passes=(-0.02, 0.0, 0.02)))
    assert rf.claims["07.workers_4_to_8"]["verdict"] == "holds"
    slow = {k: (v if k[0] == 4 else v / 2) for k, v in rates.items()}
    rf = dc.judge(_fake_run(tmp_path / "slow", [], slow, passes=(-0.02, 0.0, 0.02)))
    assert rf.claims["07.workers_4_to_8"]["verdict"] == "does not hold here"


@pytest.mark.parametrize("copy, pin_factor, passes, want", [
    ((120.0, 35.0), 1.2, (-0.02, 0.0, 0.02), "holds"),             # copies 3.4x faster, the loader too
    ((120.0, 35.0), 1.2, None, "holds with nuance"),               # one pass per setting: the loader not judged
    ((120.0, 35.0), 0.7, (-0.02, 0.0, 0.02), "holds with nuance"),  # copies faster, the loader slower
    ((120.0, 100.0), 1.2, (-0.02, 0.0, 0.02), "does not hold here"),  # copies x1.2: under the bar
])
def test_pin_memory_on_a_gpu_is_judged_from_the_copy_and_the_loader(tmp_path, copy, pin_factor, passes, want):
    rates = {(w, p): 2.0e4 * (pin_factor if p else 1.0) for w in (0, 4) for p in (False, True)}
    rf = dc.judge(_fake_run(tmp_path / "res", [], rates, passes=passes, copy=copy))
    entry = rf.claims["03.pin_memory_gpu"]
    assert entry["verdict"] == want and not claims.unsourced_numbers(entry)
    assert entry["numbers"]["copy_speedup"] == copy[0] / copy[1]


def test_a_dry_run_settles_no_gpu_claim(tmp_path):
    amp = [_amp_row(128, "fp32", 1000.0, 100.0, 60.0), _amp_row(128, "bf16", 3000.0, 40.0, 20.0)]
    assert dc.judge(_fake_run(tmp_path / "res", amp, {(4, False): 1.0, (8, False): 2.0}, dry=True)) is None
    assert dc.judge(tmp_path / "empty") is None


def test_keep_files_a_gpu_run_as_a_reference_and_refuses_a_dry_run(tmp_path):
    amp = [_amp_row(2048, "fp32", 2.0e5, 1700.0, 1450.0), _amp_row(2048, "bf16", 4.0e5, 800.0, 550.0)]
    res = _fake_run(tmp_path / "res", amp, {(4, True): 2.0e4, (8, True): 2.6e4})
    (res / "manifest.tsv").write_text("amp\t0\t30\t40\nloader\t0\t20\t25\n")
    dc.finalize(res, tmp_path / "out", 60.0)
    folder = dc.keep(tmp_path / "out", reference=tmp_path / "reference")
    assert folder == tmp_path / "reference" / "xeon-16core-amx-h200"
    assert {p.name for p in folder.iterdir()} == {"device_check_amp.json", "device_check_loader.json",
                                                  "device_check_manifest.json", "device_check.json"}
    kept = json.loads((folder / "device_check.json").read_text())
    assert kept["schema"] == claims.SCHEMA and {c["id"] for c in kept["claims"]} == {
        "05.amp_memory_speed", "07.workers_4_to_8"}  # no batch 128 measured: no article step for 01's claim
    assert dc.judge(folder).to_dict()["claims"] == kept["claims"]  # a kept folder judges as its run did
    dry = _fake_run(tmp_path / "dry", amp, {}, dry=True)
    (dry / "manifest.tsv").write_text("amp\t0\t3\t40\n")
    dc.finalize(dry, tmp_path / "dry_out", 5.0)
    with pytest.raises(UsageError, match="dry-run"):
        dc.keep(tmp_path / "dry_out", reference=tmp_path / "reference")


@pytest.mark.parametrize("label", sorted(p.parent.name for p in (REPO / "results" / "reference").glob(
    f"*/{dc.CLAIMS_NAME}.json")))
def test_committed_gpu_claims_are_what_their_sections_give(label):
    """A kept run's claims file is the judgement of its kept sections (rerun it: python
    scripts/device_check.py --keep OUT)."""
    folder = REPO / "results" / "reference" / label
    kept = json.loads((folder / f"{dc.CLAIMS_NAME}.json").read_text())
    assert dc.judge(folder).to_dict()["claims"] == kept["claims"]


@pytest.mark.parametrize("spread, want", [(0.02, "holds"), (0.25, "inconclusive")])
def test_repeated_loader_passes_must_clear_their_spread(tmp_path, spread, want):
    """With several steady passes per setting, 8 workers count as faster only outside the passes' spread."""
    res = _fake_run(tmp_path / "res", [], {(4, False): 2.0e4, (8, False): 2.4e4, (4, True): 2.0e4, (8, True): 2.4e4})
    doc = json.loads((res / "loader.json").read_text())
    for row in doc["rows"]:
        v = row["steady_img_s"]
        row["steady_passes_img_s"] = [v * (1 - spread), v, v * (1 + spread)]
    (res / "loader.json").write_text(json.dumps(doc))
    entry = dc.judge(res).claims["07.workers_4_to_8"]
    assert entry["verdict"] == want and "3 steady passes" in entry["regime"]
    assert not claims.unsourced_numbers(entry)
