"""Each reproduction of 08_troubleshooting raises its real error, and its fix passes.

The reproductions launch torchrun or fresh interpreters, and notebook 08 runs every one of them: the tests read
the records of that one run (the ``executed`` fixture, tests/conftest.py: 08 top to bottom once per session, quick
profile), which its record step writes to ``08_troubleshooting.json`` (its ``records``), instead of running
them all again (issue 46: a second run of the same reproductions took 167 s on a 2-core CPU). The helpers that
need no process (the batch-size search, the OOM checklist) are tested directly below.
"""
from __future__ import annotations

import json

import pytest
import torch

from mnist_helpers.lessons.n08 import lesson as ts
from notebook_runs import WHOLE_TIMEOUT, assert_ran_cleanly
from mnist_helpers.lessons.n08.lesson import find_batch_size_limited
from mnist_helpers.memory import find_batch_size, is_oom
from mnist_helpers.ports import find_port_holders, free_port, hold_port, port_is_free

NOTEBOOK = "08_troubleshooting"  # whose run the records come from (tests/conftest.py: the same xdist group)

# the reproduction's function in l08 -> (the name its record carries, a regex the record's error line must match)
CASES = {
    "port_in_use": ("Address already in use", r"EADDRINUSE|address already in use"),
    "backend_interface": ("gloo: wrong network interface", r"Unable to find address for: eth-typo9"),
    "unused_parameters": ("Expected to have finished reduction in the prior iteration",
                          r"Expected to have finished reduction"),
    "collective_mismatch": ("collective mismatch (hang)", r"Timed out waiting"),
    "out_of_memory": ("out of memory", r"can't allocate memory|out of memory"),
    "spawn_main": ("Can't get attribute ... on <module '__main__'>",
                   r"Can't get attribute 'train' on <module '__main__'"),
    "local_rank_argparse": ("--local_rank argparse bug", r"unrecognized arguments: --local-rank=0"),
    "loss_accumulation": ("graphs kept alive by accumulating loss", r"^$"),  # silent: memory grows, nothing raises
    "download_race": ("per-rank downloads racing on the data folder",
                      r"t10k-images-idx3-ubyte is (truncated|corrupt|too long)"),
    "eval_through_ddp": ("rank-0 evaluation through the DDP wrapper (hang)", r"Timed out waiting|timeout|timed out"),
    "omp_threads": ("torchrun sets OMP_NUM_THREADS=1", r"Setting OMP_NUM_THREADS"),
}


@pytest.fixture(scope="class")
def records(executed):
    """Notebook 08's records, as ``ts.Repro`` objects, from its one run in this session."""
    run = executed(NOTEBOOK)
    doc = json.loads((run.results / "08_troubleshooting.json").read_text())
    found = {r["name"]: ts.Repro(**r) for r in doc["records"]}
    missing = {f: title for f, (title, _) in CASES.items() if title not in found}
    assert not missing, f"notebook 08 no longer records {missing} (it records {sorted(found)})"
    return {f: found[title] for f, (title, _) in CASES.items()}


class TestNotebook08:
    """Notebook 08's one run (tests/notebooks/test_all_run.py: ``RUN_BY``), then what its records hold: one class, so that
    pytest-xdist gives the run and its readers to the same worker."""

    @pytest.mark.kernel
    @pytest.mark.timeout(WHOLE_TIMEOUT)
    def test_the_notebook_runs_top_to_bottom(self, executed):
        assert_ran_cleanly(NOTEBOOK, executed)

    @pytest.mark.parametrize("name", sorted(CASES))
    def test_reproduction_raises_its_error_and_the_fix_passes(self, records, name):
        import re

        rec = records[name]
        assert re.search(CASES[name][1], rec.error), f"{name}: unexpected error line {rec.error!r}"
        assert rec.fixed_ok is True, f"{name}: the fixed run did not pass: {rec.details}"
        assert rec.diagnosis and rec.fix


    def test_records_carry_what_the_notebook_prints(self, records):
        assert records["port_in_use"].details["holders"], "the port holder was found with psutil"
        assert records["port_in_use"].details["port_free_after_stopping_holder"]
        assert "aux" in records["unused_parameters"].diagnosis  # INFO debug names the unused parameters
        assert "Detected mismatch" in records["collective_mismatch"].details["detail_line"]
        assert not records["collective_mismatch"].details["info_names_mismatch"]  # only DETAIL wraps the group
        assert records["eval_through_ddp"].details["no_buffer_model_passed"]  # Net has no buffers: no broadcast, no hang
        assert records["eval_through_ddp"].details["fixed_all_passed"]
        assert records["omp_threads"].details["torchrun_threads"] == 1
        oom = records["out_of_memory"].details
        assert oom["micro_batch_size"] * oom["grad_accum"] >= 512 and not oom["tried"][0]["ok"]
        assert records["download_race"].details["safe"]["writers"].count("wrote") == 1
        assert records["download_race"].details["naive"]["reader_saw"]["truncated"] > 0
        assert set(records["port_in_use"].as_dict()) >= {"error", "diagnosis", "fix", "fixed_ok"}
        # what the "the fix" cells print: the two commands, the real message of the plain-Python runs
        commands = records["port_in_use"].details["commands"]
        assert "--master-port" in commands["bug"] and "--master-port" not in commands["fixed"]
        assert records["omp_threads"].details["fixed_command"].startswith("OMP_NUM_THREADS=")
        assert "Can't get attribute" in records["spawn_main"].details["bug_output"]
        assert "unrecognized arguments" in records["local_rank_argparse"].details["bug_output"]


    def test_records_display_as_tables(self, records, capsys):
        summary = ts.records_table(records.values())
        assert list(summary.columns) == ["problem", "error reproduced", "fixed run"] and len(summary) == len(records)
        assert set(summary["fixed run"]) == {"passes"}
        assert dict(zip(summary["problem"], summary["error reproduced"]))["graphs kept alive by accumulating loss"] == "silent"
        records["port_in_use"].show()
        out = capsys.readouterr().out
        assert "Address already in use" in out and "diagnosis" in out and "passes" in out


def test_oom_checklist_measures_each_item():
    rows = {r["check"]: r for r in ts.oom_checklist(model="net", batch_size=32)}
    assert len(rows) == 6 and rows["losses kept as tensors"]["nodes"] > 0
    assert rows["halve the batch"]["ratio"] < 1 and rows["gradient accumulation"]["ratio"] < 1


def test_cuda_fork_is_explained_without_a_gpu():
    rec = ts.cuda_fork()
    if not torch.cuda.is_available():
        assert rec.fixed_ok is None and "no CUDA" in rec.error
    else:
        assert "re-initialize CUDA" in rec.error and rec.fixed_ok


def test_find_batch_size_halves_until_it_fits():
    def fits(bs):
        if bs > 100:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
    res = find_batch_size(fits, 1000)
    assert res["batch_size"] == 62 and [r["batch_size"] for r in res["tried"]] == [1000, 500, 250, 125, 62]
    assert find_batch_size(lambda bs: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory")), 4,
                           min_batch_size=2)["batch_size"] is None


def test_find_batch_size_does_not_hide_bugs_and_checks_input():
    with pytest.raises(ValueError, match="shape"):
        find_batch_size(lambda bs: (_ for _ in ()).throw(ValueError("bad shape")), 8)
    with pytest.raises(ValueError, match="start must be a positive integer"):
        find_batch_size(lambda bs: None, 0)
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate")) and not is_oom(RuntimeError("shape"))


@pytest.mark.process
def test_find_batch_size_limited_really_runs_out_of_memory():
    res = find_batch_size_limited("net", start=1024, budget_mib=150)
    assert res["limit"]["method"] in ("RLIMIT_AS", "set_per_process_memory_fraction")
    assert res["tried"][0]["ok"] is False and res["batch_size"] and res["batch_size"] < 1024


@pytest.mark.process
def test_port_holder_is_found_and_released():
    with hold_port() as (port, proc):
        assert not port_is_free(port)
        assert [h["pid"] for h in find_port_holders(port)] == [proc.pid]
    assert port_is_free(port)
    assert find_port_holders(free_port()) == []


def test_telling_line_strips_prefixes():
    text = "noise\n[rank 0] [rank0]: RuntimeError: Timed out waiting 3000ms\nmore"
    assert ts.telling_line(text, "timed out") == "RuntimeError: Timed out waiting 3000ms"
    assert ts.telling_line(text, "absent") == ""


def test_confirm_reports_without_raising(capsys):
    rec = ts.Repro("demo", "RuntimeError: EADDRINUSE", "why", "fix", True)
    assert rec.confirm("EADDRINUSE", checks={"a fact": True}) and rec.details["as_described"]
    assert "shown as described" in capsys.readouterr().out
    bad = ts.Repro("demo", "something else", "why", "fix", False)
    assert not bad.confirm("EADDRINUSE", checks={"a fact": False})
    out = capsys.readouterr().out
    assert "NOT as described" in out and "'EADDRINUSE'" in out and "a fact" in out and "STILL FAILS" in out
    gpu_only = ts.Repro("demo", "", "why", "fix", None)
    assert gpu_only.confirm(fix_shown=False) and "not shown on this machine" in capsys.readouterr().out
    assert not gpu_only.confirm()


# the bugs as code (issue 48): each bug the notebook reproduces has its broken lines on screen and its fix as an edit
SHOWN = {  # the bug -> (the worker, the fix regions the notebook diffs against its "bug" region)
    "a collective on rank 0 only": ("bugs/collective_mismatch.py", ["fix"]),
    "unused parameters": ("bugs/unused_param.py", ["fix"]),
    "evaluation through the DDP wrapper on rank 0": ("bugs/eval_through_ddp.py", ["fix", "fix:all"]),
    "a missing set_epoch": ("demos/sampler.py", ["fix"]),
    "--local_rank": ("bugs/local_rank.py", ["fix"]),
    "mp.spawn of a function in __main__": ("bugs/spawn_main.py", ["fix"]),
    "a port in use": ("bugs/port_in_use.py", []),          # the fix is the launch command (ts.command_diff)
    "torchrun's OMP_NUM_THREADS=1": ("bugs/omp_threads.py", []),
}


@pytest.mark.parametrize("bug", sorted(SHOWN))
def test_each_bug_has_its_broken_lines_and_a_small_fix(bug):
    worker, fixes = SHOWN[bug]
    if worker != "bugs/omp_threads.py":  # the OMP problem has no broken line in its worker: it is in the command
        first, last, text = ts.region(worker, "bug")
        assert text.strip() and 1 <= first <= last and "# [" not in text
        assert "lines" in ts.bug_code(worker).data.splitlines()[0] or "line" in ts.bug_code(worker).data
    for fix in fixes:
        diff = ts.fix_diff_text(worker, "bug", fix).splitlines()
        removed = [ln for ln in diff[2:] if ln.startswith("-")]
        added = [ln for ln in diff[2:] if ln.startswith("+")]
        assert removed and added and len(removed) <= 3 and len(added) <= 3, (bug, fix, diff)


def test_regions_name_their_problems():
    with pytest.raises(ValueError, match=r"no single '# \[nothing\]'"):
        ts.region("bugs/collective_mismatch.py", "nothing")
    first, last, whole = ts.region("bugs/spawn_main.py", None)
    assert whole.startswith("import argparse") and "mp.spawn(" in whole and '"""' not in whole.splitlines()[0]


def test_notebook_shows_each_bug_as_code():
    """08's cells show each bug's broken lines, then the fix as an edit, after the run that made both runs."""
    from notebook_runs import path_of

    nb = json.loads(path_of(NOTEBOOK).read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    for bug, (worker, fixes) in SHOWN.items():
        if worker == "bugs/omp_threads.py":
            assert 'l08.command_diff(omp.details["bug_command"], omp.details["fixed_command"])' in code
            continue
        assert f'l08.bug_code("{worker}"' in code, f"08 does not show the broken lines of {bug}"
        if fixes:
            assert f'l08.fix_diff("{worker}"' in code, f"08 does not show the fix of {bug} as an edit"
    assert 'l08.command_diff(port.details["commands"]["bug"], port.details["commands"]["fixed"])' in code
    for rec in ("port", "unused", "coll", "evalhang", "spawn", "lr"):
        assert f"l08.error_excerpt({rec}" in code, f"08 does not print the real message of {rec}"


def test_error_excerpt_prints_the_message_lines():
    rec = ts.Repro("demo", "RuntimeError: Timed out", "", "", True,
                   {"root_cause": "RuntimeError: [x.cc:78] Timed out waiting 3000ms\n  File \"y.py\", line 3, in f\n"
                                  "    work.wait()", "failing_rank": 0})
    out = ts.error_excerpt(rec).splitlines()
    assert out == ["the real message (rank 0):", "    RuntimeError: [x.cc:78] Timed out waiting 3000ms"]
    plain = ts.Repro("d", "", "", "", True, {"bug_output": "usage: x\nlocal_rank.py: error: unrecognized arguments: "
                                                           "--local-rank=0\n"})
    message = "    local_rank.py: error: unrecognized arguments: --local-rank=0"
    assert ts.error_excerpt(plain).splitlines()[1:] == [message]
    assert ts.error_excerpt(ts.Repro("d", "", "", "", True, {"bug_output": "a\nb"})).endswith("    a\n    b")
