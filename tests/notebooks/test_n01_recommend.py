"""recommend_config on fake machines (notebook 01): each setting has a value and a reason."""
import pytest

from mnist_helpers.course.display import table
from mnist_helpers.lessons.n01.lesson import EXAMPLE_MACHINES, as_kwargs, recommend_config

SETTINGS = {"device", "processes_per_node", "batch_size", "num_workers", "threads_per_process", "pin_memory", "amp"}
LAPTOP = EXAMPLE_MACHINES["2-core CPU laptop"]
ARTICLE = EXAMPLE_MACHINES["article's 8-core + 8 GB GPU"]
EIGHT = EXAMPLE_MACHINES["8-GPU server"]


@pytest.mark.parametrize("machine", list(EXAMPLE_MACHINES.values()) + [None], ids=list(EXAMPLE_MACHINES) + ["this"])
def test_every_setting_has_a_reason(machine):
    rows = recommend_config(machine)
    assert {r["setting"] for r in rows} == SETTINGS
    assert all(isinstance(r["reason"], str) and len(r["reason"]) > 20 for r in rows)
    assert list(table(rows).columns) == ["setting", "value", "reason"], "rows show as a three-column DataFrame"


def test_two_core_laptop_trains_on_cpu_without_workers():
    k = as_kwargs(recommend_config(LAPTOP))
    assert k == {"device": "cpu", "processes_per_node": 1, "batch_size": 128, "num_workers": 0,
                 "threads_per_process": 2, "pin_memory": False, "amp": "none"}


def test_articles_box_gets_the_articles_advice():
    k = as_kwargs(recommend_config(ARTICLE))
    assert k["device"] == "cuda" and k["processes_per_node"] == 1 and k["batch_size"] == 128
    assert 2 <= k["num_workers"] <= 4, "the article: 1/4 to 1/2 of 8 cores"
    assert k["pin_memory"] is True and k["amp"] == "bf16"  # an RTX 3070 is capability 8.6


def test_eight_gpus_one_process_each():
    rows = recommend_config(EIGHT)
    k = as_kwargs(rows)
    assert k["processes_per_node"] == 8 and k["num_workers"] == 4 and k["threads_per_process"] >= 1
    assert "1024" in next(r["reason"] for r in rows if r["setting"] == "batch_size")  # global batch named


def test_older_or_unknown_gpu_falls_back_to_fp16_and_small_memory_shrinks_the_batch():
    old = {**ARTICLE, "gpus": [{"name": "Tesla V100", "memory_gib": 16, "capability": "7.0"}]}
    assert as_kwargs(recommend_config(old))["amp"] == "fp16"
    unknown = {**ARTICLE, "gpus": [{"name": "some GPU", "memory_gib": 8}]}
    assert as_kwargs(recommend_config(unknown))["amp"] == "fp16"
    tiny = {**ARTICLE, "gpus": [{"name": "tiny", "memory_gib": 0.6, "capability": "8.0"}]}
    assert as_kwargs(recommend_config(tiny))["batch_size"] < 128
    few_cores = {**EIGHT, "logical_cores": 8}
    assert as_kwargs(recommend_config(few_cores))["num_workers"] == 1


def test_cpu_with_bf16_instructions_is_told_to_measure_bf16():
    rows = recommend_config({**LAPTOP, "simd": ["avx512f", "amx_bf16"]})
    amp = next(r for r in rows if r["setting"] == "amp")
    assert amp["value"] == "none" and "measure it first" in amp["reason"]


@pytest.mark.parametrize("machine,match", [
    ("8 cores", "machine must be a dict"),
    ({"ram_gib": 16, "gpus": []}, r"machine\['logical_cores'\] must be an integer >= 1, got None"),
    ({"logical_cores": 0, "ram_gib": 16}, "logical_cores'] must be an integer >= 1, got 0"),
    ({"logical_cores": True, "ram_gib": 16}, "logical_cores"),
    ({"logical_cores": 4, "ram_gib": -1}, r"ram_gib'\] must be a positive number"),
    ({"logical_cores": 4, "ram_gib": float("nan")}, "ram_gib"),
    ({"logical_cores": 4, "ram_gib": 8, "usable_cores": 9}, "usable_cores"),
    ({"logical_cores": 4, "ram_gib": 8, "gpus": "RTX 3070"}, r"gpus'\] must be a list"),
    ({"logical_cores": 4, "ram_gib": 8, "gpus": ["RTX 3070"]}, r"gpus'\]\[0\] must be a dict"),
    ({"logical_cores": 4, "ram_gib": 8, "gpus": [{"memory_gib": 8}]}, r"\['name'\] must be a non-empty string"),
    ({"logical_cores": 4, "ram_gib": 8, "gpus": [{"name": "x", "memory_gib": "8GB"}]}, "memory_gib'] must be a positive"),
    ({"logical_cores": 4, "ram_gib": 8, "gpus": [{"name": "x", "memory_gib": 8, "capability": "Ampere"}]},
     "capability'] must look like '8.6'"),
])
def test_malformed_machines_are_rejected_clearly(machine, match):
    with pytest.raises(ValueError, match=match) as e:
        recommend_config(machine)
    assert "machine_info()" in str(e.value), "the message says how to make a valid description"


def test_measured_threads_reads_the_latest_sweep_for_this_host(tmp_path):
    from mnist_helpers.course import experiments
    from mnist_helpers.lessons.n01.lesson import measured_threads

    log = tmp_path / "log.jsonl"
    assert measured_threads("h", path=log)[0] is None
    machine = {"hostname": "h", "cpu_model": "x", "logical_cores": 2, "gpus": []}
    for tags, ips in ((["full"], {"1": 100.0, "2": 180.0}), (["full"], {"1": 300.0, "2": 120.0}),
                      (["quick"], {"1": 50.0, "4": 400.0})):
        experiments.log_run("01", "threads-sweep", config={}, metrics={"images_per_s": ips}, tags=tags,
                            machine=machine, path=log)
    threads, reason = measured_threads("h", path=log)
    assert threads == 1 and "full profile" in reason, "the latest full sweep wins over a later quick one"
    assert measured_threads("other-host", path=log)[0] is None
