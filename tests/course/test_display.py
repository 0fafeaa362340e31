"""Tables are DataFrames: built from rows or a dict, shown with formats, plain text outside a notebook."""
import pandas as pd

from mnist_helpers.course.display import show, table


def test_table_from_rows_and_from_a_dict():
    df = table([{"a": 1, "b": 2.5}, {"a": 2}], columns=["a", "b", "c"], rename={"a": "workers"})
    assert isinstance(df, pd.DataFrame) and list(df.columns) == ["workers", "b", "c"] and len(df) == 2
    kv = table({"torch": "2.14.1", "gpus": ["A", "B"]})
    assert list(kv.columns) == ["setting", "value"] and kv.loc[1, "value"] == "A, B"


def test_show_formats_columns_and_prints_outside_a_notebook(capsys):
    show([{"n": 1234.5678, "acc": 0.98765, "other": 0.123456789}], formats={"acc": "{:.1%}"}, caption="demo")
    out = capsys.readouterr().out
    assert "demo" in out and "98.8%" in out and "1,235" in out and "0.1235" in out
    show([], columns=["x"])
    assert "(no rows)" in capsys.readouterr().out
