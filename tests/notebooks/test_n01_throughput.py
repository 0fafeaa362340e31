"""The framework-settings sweep (notebook 01) on a tiny workload; no timing assertions."""
import pytest

from mnist_helpers.lessons.n01 import lesson as tp


def test_step_throughput_in_process_returns_one_value_per_block():
    import torch
    before = torch.get_num_threads()
    try:
        res = tp.step_throughput(model="fastnet", batch_size=8, threads=1, steps=2, warmup=1, repeats=2)
    finally:
        torch.set_num_threads(before)
    assert res["threads"] == 1 and len(res["images_per_s"]) == 2 and len(res["cpu_cores_busy"]) == 2
    assert all(v > 0 for v in res["images_per_s"])


@pytest.mark.process
def test_sweep_runs_each_setting_in_its_own_process(capsys):
    rows = tp.threads_sweep([1, 2], rounds=1, model="fastnet", batch_size=8, steps=2, warmup=1, repeats=2)
    printed = capsys.readouterr().out
    assert printed.index("threads=1") < printed.index("threads=2")
    assert [r["threads"] for r in rows] == [1, 2], "each subprocess really ran with its thread count"
    assert all(r["blocks"] == 2 for r in rows)
    assert max(r["vs_best"] for r in rows) == pytest.approx(1.0)
    assert all(r["label"] == f"threads={r['threads']}" for r in rows)


@pytest.mark.process
def test_the_module_runs_itself_with_dashed_flags():
    settings = {"model": "fastnet", "batch_size": 8, "threads": 1, "channels_last": False, "tf32": True,
                "steps": 1, "warmup": 0, "repeats": 1}
    argv = tp.command(settings)
    assert argv[1:3] == ["-m", "mnist_helpers.lessons.n01.lesson"]
    assert "--batch-size" in argv and "--no-channels-last" in argv and "--tf32" in argv
    assert not any(a.startswith("--") and "_" in a for a in argv), "flags are dashed"
    res = tp.measure(settings)
    assert res["batch_size"] == 8 and res["threads"] == 1 and res["tf32"] is True and len(res["images_per_s"]) == 1


def test_thread_counts():
    assert tp.thread_counts(2) == [1, 2, 4]
    assert tp.thread_counts(8, oversubscribe=False) == [1, 2, 4, 8]
    assert tp.thread_counts(6) == [1, 2, 4, 6, 12]


@pytest.mark.parametrize("call,match", [
    (lambda: tp.framework_sweep([]), "non-empty list"),
    (lambda: tp.framework_sweep([{"threads": 1}], rounds=0), "rounds must be a positive integer"),
    (lambda: tp.threads_sweep([0]), "threads must be positive integers"),
    (lambda: tp.measure({"thread": 2}), r"unknown setting\(s\) \['thread'\]"),
    (lambda: tp.step_throughput(steps=0), "steps must be a positive integer"),
])
def test_bad_input_is_rejected(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.process
def test_a_failing_subprocess_raises_with_its_error():
    with pytest.raises(RuntimeError, match="failed"):
        tp.measure({"model": "no-such-model", "steps": 1, "warmup": 0, "repeats": 1})
