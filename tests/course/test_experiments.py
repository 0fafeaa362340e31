import json

import pytest
import torch

from mnist_helpers.course import experiments as ex

MACHINE = {"cpu_model": "Test CPU", "logical_cores": 2, "gpus": [], "hostname": "h"}


def test_log_and_query_round_trip(tmp_path):
    log = tmp_path / "log.jsonl"
    ex.log_run("02", "a", config={"batch_size": 128}, metrics={"test_acc": torch.tensor(0.98)},
               machine=MACHINE, tags=["baseline"], path=log)
    ex.log_run("03", "b", config={"batch_size": 64}, metrics={"test_acc": 0.97}, machine=MACHINE, path=log)
    rows = ex.query(log)
    assert [r["name"] for r in rows] == ["a", "b"]
    assert rows[0]["test_acc"] == pytest.approx(0.98) and rows[0]["config.batch_size"] == 128
    assert [r["name"] for r in ex.query(log, notebook="03")] == ["b"]
    assert [r["name"] for r in ex.query(log, tag="baseline")] == ["a"]
    df = ex.table(rows, ["name", "test_acc", "config.num_workers"])
    assert list(df.columns) == ["name", "test_acc", "config.num_workers"] and list(df["name"]) == ["a", "b"]
    assert df["config.num_workers"].isna().all()  # a column no run logged comes out empty
    csv_text = ex.to_csv(rows, tmp_path / "out.csv").read_text()
    assert csv_text.splitlines()[0].startswith("time,notebook,name")


def test_corrupt_line_is_reported_and_skipped_never_losing_others(tmp_path):
    log = tmp_path / "log.jsonl"
    ex.log_run("02", "first", config={}, metrics={"x": 1}, machine=MACHINE, path=log)
    with open(log, "a") as f:
        f.write('{"notebook": "02", "name": "torn", "conf\n')
        f.write("not json at all\n")
    ex.log_run("02", "last", config={}, metrics={"x": 2}, machine=MACHINE, path=log)
    with pytest.warns(UserWarning, match=r"skipped 2 corrupt line\(s\) \(line 2, 3\)"):
        rows = ex.query(log)
    assert [r["name"] for r in rows] == ["first", "last"]


@pytest.mark.parametrize("kwargs,match", [
    ({"notebook": ""}, "notebook must be a non-empty string"),
    ({"config": [1, 2]}, "config must be a dict"),
    ({"metrics": {"model": torch.nn.Linear(1, 1)}}, r"metrics.model has a Linear"),
    ({"metrics": {1: 2}}, "keys must be strings"),
])
def test_malformed_records_are_rejected_clearly(tmp_path, kwargs, match):
    args = {"notebook": "02", "name": "x", "config": {}, "metrics": {}} | kwargs
    with pytest.raises(ex.ExperimentLogError, match=match):
        ex.log_run(args.pop("notebook"), args.pop("name"), machine=MACHINE, path=tmp_path / "l.jsonl", **args)
    assert not (tmp_path / "l.jsonl").exists()


def test_nan_metrics_stay_valid_json(tmp_path):
    log = tmp_path / "l.jsonl"
    ex.log_run("04", "diverged", config={}, metrics={"loss": float("nan")}, machine=MACHINE, path=log)
    assert json.loads(log.read_text())["metrics"]["loss"] == "nan"
