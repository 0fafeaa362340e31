"""Profiling helpers (notebook 09): labelled steps, the trace, the time breakdown, the DDP worker (profile and
time-to-accuracy modes)."""
import json

import pytest

from mnist_helpers.lessons.n09.lesson import bottleneck
from mnist_helpers.lessons.n09.profiling import LABELS, profile_training, time_breakdown


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, mnist_root):
    trace = tmp_path_factory.mktemp("prof") / "trace.json"
    return profile_training("fastnet", batch_size=16, subset=64, wait=1, warmup=1, active=2, trace_path=trace)


def test_profile_records_every_label_and_writes_a_chrome_trace(profiled):
    names = {e["name"] for e in profiled["events"]}
    assert {"data", "forward", "backward", "optimizer"} <= names
    assert "all-reduce" not in names  # a single process has nothing to communicate
    assert any(n.startswith("ProfilerStep") for n in names)
    trace = json.loads(profiled["trace_path"].read_text())
    assert any(ev.get("name") == "forward" for ev in trace["traceEvents"])
    assert "aten::" in profiled["table"] and profiled["images_per_step"] == 16


def test_breakdown_shares_add_up_and_name_the_bottleneck(profiled):
    rows = time_breakdown(profiled["events"], profiled["steps"])
    assert [r["part"] for r in rows] == ["data wait", "compute", "communication", "other"]
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-6
    shares = {r["part"]: r["share"] for r in rows}
    assert shares["compute"] > shares["data wait"]  # in-memory tensors: the model dominates
    assert bottleneck(rows).startswith("compute dominates")


def test_breakdown_finds_unlabelled_communication():
    events = [{"name": "ProfilerStep#3", "cpu_us": 1000.0, "self_cpu_us": 10.0, "device_us": 0, "count": 1},
              {"name": "backward", "cpu_us": 600.0, "self_cpu_us": 0.0, "device_us": 0, "count": 1},
              {"name": "gloo:all_reduce", "cpu_us": 200.0, "self_cpu_us": 200.0, "device_us": 0, "count": 1},
              {"name": "data", "cpu_us": 100.0, "self_cpu_us": 100.0, "device_us": 0, "count": 1}]
    shares = {r["part"]: r["share"] for r in time_breakdown(events)}
    assert shares == pytest.approx({"data wait": 0.1, "compute": 0.4, "communication": 0.2, "other": 0.3})
    with pytest.raises(ValueError, match="no profiler events"):
        time_breakdown([])


def test_bad_schedule_is_refused():
    with pytest.raises(ValueError, match="active must be a positive integer"):
        profile_training("fastnet", active=0)
    with pytest.raises(ValueError, match="wait must be"):
        profile_training("fastnet", wait=-1)


@pytest.mark.process
def test_two_process_worker_labels_the_all_reduce(tmp_path, mnist_root):
    from mnist_helpers.launch import torchrun

    trace = tmp_path / "rank0.json"
    res = torchrun("mnist_helpers.workers.bench.profile_ddp",
                   ["--model", "fastnet", "--batch-size", "8", "--subset", "64", "--active", "2", "--trace", trace],
                   nproc=2, timeout=120, echo=False)
    assert res["world_size"] == 2 and res["mode"] == "explicit all-reduce"
    assert [r["rank"] for r in res["ranks"]] == [0, 1]
    for r in res["ranks"]:
        shares = {b["part"]: b["share"] for b in r["breakdown"]}
        assert shares["communication"] > 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(ev.get("name") == "all-reduce" for ev in events)
    assert set(LABELS) <= {ev.get("name") for ev in events}


@pytest.mark.process
def test_two_process_worker_trains_to_a_target_accuracy(mnist_root):
    from mnist_helpers.launch import torchrun

    res = torchrun("mnist_helpers.workers.bench.profile_ddp",
                   ["--time-to-accuracy", "0.3", "--model", "fastnet", "--batch-size", "16", "--subset", "512",
                    "--test-subset", "100", "--eval-every-images", "64", "--max-images", "2048", "--lr", "0.003"],
                   nproc=2, timeout=120, echo=False)
    assert res["world_size"] == 2 and res["mode"] == "time to accuracy"
    tta = res["time_to_accuracy"]
    assert tta["reached"] and tta["seconds"] > 0 and tta["final_acc"] >= 0.3
    assert all(images % 64 == 0 for images, _, _ in tta["curve"])  # evaluated every 64 images counted over both ranks
