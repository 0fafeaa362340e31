"""The experience library (notebook 09) over a temporary experiment log."""
import csv

import pytest

from mnist_helpers.course import experiments
from mnist_helpers.lessons.n09 import lesson as library

MACHINE_A = {"cpu_model": "CPU-A", "logical_cores": 2, "gpus": [], "hostname": "a"}
MACHINE_B = {"cpu_model": "CPU-B", "logical_cores": 8, "gpus": [], "hostname": "b"}


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "log.jsonl"

    def add(nb, name, config, metrics, machine=MACHINE_A, tags=()):
        experiments.log_run(nb, name, config=config, metrics=metrics, machine=machine, tags=tags, path=path)
    add("02", "baseline-dataloader", {"batch_size": 128, "num_workers": 0}, {"median_images_per_s": 100.0, "final_test_acc": 0.97})
    add("02", "baseline-tensor", {"batch_size": 128}, {"median_images_per_s": 300.0, "final_test_acc": 0.97})
    add("05", "precision-quick", {"batch_size": 128}, {"bf16_speedup": 1.2})
    add("06", "single", {"batch_size": 128}, {"world_size": 1, "images_per_s": 200.0, "final_test_acc": 0.96})
    add("06", "ddp x 2", {"batch_size": 64}, {"world_size": 2, "images_per_s": 220.0, "final_test_acc": 0.96})
    add("06", "single", {"batch_size": 256}, {"world_size": 1, "images_per_s": 900.0, "final_test_acc": 0.95},
        machine=MACHINE_B)
    add("09", "lr-optimizer", {}, {"lever": 2, "gain": 2.0, "how": "steps to accuracy"}, tags=["priority"])
    add("01", "threads-sweep", {}, {"images_per_s": {"1": 5.0}})  # no single number: left out of comparisons
    return path


def test_runs_compare_across_notebooks_and_machines(log):
    rows = library.load(log)
    assert len(library.comparable(rows)) == 5
    assert "CPU-B x8" in library.machines(rows) and "CPU-A x2" in library.machines(rows)
    runs = library.runs_table(rows)
    assert "baseline-tensor" in set(runs["name"]) and "threads-sweep" not in set(runs["name"])
    assert list(runs.columns) == library.RUN_COLUMNS
    assert list(library.runs_table(rows, last=2)["name"]) == ["ddp x 2", "single"]
    over = library.overview(rows)
    assert list(over.columns) == ["notebook", "machine", "runs"] and over["runs"].sum() == len(rows)
    assert set(over["notebook"]) == {"01", "02", "05", "06", "09"}


def test_best_configuration_per_machine(log):
    best = {b["machine"]: b for b in library.best_per_machine(library.load(log))}
    assert best["CPU-A x2"]["name"] == "baseline-tensor" and best["CPU-A x2"]["config"]["batch_size"] == 128
    assert best["CPU-B x8"]["throughput"] == 900.0
    slow_ok = library.best_per_machine(library.load(log), min_accuracy=0.965)
    assert [b["name"] for b in slow_ok] == ["baseline-tensor"]


def test_empty_log_degrades_to_messages(tmp_path, capsys):
    rows = library.load(tmp_path / "none.jsonl")
    assert rows == [] and library.overview(rows).empty and library.runs_table(rows).empty
    library.show_runs(rows)
    assert library.NO_THROUGHPUT in capsys.readouterr().out
    assert library.best_per_machine(rows) == []
    assert library.export_csv(rows, tmp_path / "e.csv").read_text().startswith("notebook,name")


def test_csv_export_and_static_dashboard(log, tmp_path, capsys):
    import matplotlib
    matplotlib.use("Agg")
    rows = library.load(log)
    path = library.export_csv(rows, tmp_path / "lib.csv")
    with open(path) as f:
        read = list(csv.DictReader(f))
    assert len(read) == len(rows) and "config.batch_size" in read[0]
    assert library.dashboard(rows, interactive=False) is None
    assert "baseline-tensor" in capsys.readouterr().out
    assert [r["name"] for r in library.filter_rows(rows, notebook="06", machine="CPU-B x8")] == ["single"]
    box = library.dashboard(rows, interactive=True)
    assert box is not None and len(box.children) == 2
    library.plot_runs([])
