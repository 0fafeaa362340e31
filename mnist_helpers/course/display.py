"""Tables and plots for every notebook, in one place (introduced in 00_setup_and_data).

Tables are pandas DataFrames: JupyterLab renders them, a learner can sort, filter and export them
(``df.to_csv``), and no column width is set by hand. ``table(rows)`` builds one from a list of dicts (or
one dict, shown as setting/value); ``show(rows, formats=...)`` displays it with number formats, as a
styled table in a notebook and as plain text in a terminal.

    from mnist_helpers.course.display import show
    show(rows, columns=["num_workers", "images_per_s"], formats={"images_per_s": "{:,.0f}"})
"""
from __future__ import annotations

from typing import Callable, Mapping

import pandas as pd

Format = str | Callable[[object], str]


def table(rows, columns: list[str] | None = None, *, rename: Mapping[str, str] | None = None) -> pd.DataFrame:
    """A DataFrame from a list of dicts (one row each), a dict (setting -> value) or a DataFrame.

    ``columns`` picks and orders columns (missing ones come out empty); ``rename`` relabels them."""
    if isinstance(rows, pd.DataFrame):
        df = rows.copy()
    elif isinstance(rows, Mapping):
        df = pd.DataFrame({"setting": list(rows), "value": [_cell(v) for v in rows.values()]})
    else:
        df = pd.DataFrame(list(rows))
    if columns is not None:
        df = df.reindex(columns=list(columns))
    if rename:
        df = df.rename(columns=dict(rename))
    # a column that is None in every row prints "None" (formatters skip it): make it a float column of NaN
    return df.apply(lambda c: c.astype(float) if c.dtype == object and len(c) and c.isna().all() else c)


def _cell(v):
    """Lists and dicts in a two-column table read better as one line of text."""
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items())
    return v


def _in_notebook() -> bool:
    from mnist_helpers.course.live import ipython_kernel_active

    return ipython_kernel_active()


def _formatter(fmt: Format) -> Callable[[object], str]:
    def apply(v):
        if v is None or (isinstance(v, float) and v != v):
            return "n/a"
        try:
            return fmt(v) if callable(fmt) else fmt.format(v)
        except (TypeError, ValueError):
            return str(v)
    return apply


def _plain(v) -> str:
    """A column without a format: floats short (pandas would print six decimals), the rest as text."""
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def show(rows, columns: list[str] | None = None, *, formats: Mapping[str, Format] | None = None,
         rename: Mapping[str, str] | None = None, caption: str | None = None) -> None:
    """Display ``rows`` as a table: styled in a notebook, plain text elsewhere.

    ``formats`` maps a column (after ``rename``) to a format string (``"{:.1%}"``) or a function."""
    df = table(rows, columns, rename=rename)
    fmts = {c: _formatter(f) for c, f in (formats or {}).items() if c in df.columns}
    for c in df.columns:
        fmts.setdefault(c, _formatter(_plain))
    if _in_notebook():
        from IPython.display import display

        styler = df.style.format(fmts, na_rep="n/a").hide(axis="index")
        if caption:
            styler = styler.set_caption(caption)
        display(styler)
        return
    if caption:
        print(caption)
    for c in df.columns:  # a terminal right-aligns text; prose columns read better left-aligned
        if c not in (formats or {}) and (df[c].dtype == object or pd.api.types.is_string_dtype(df[c])) and len(df):
            width = int(df[c].map(lambda v: len(_plain(v))).max())
            fmts[c] = (lambda w: lambda v: _formatter(_plain)(v).ljust(w))(width)
    print(df.to_string(index=False, formatters=fmts, na_rep="n/a") if len(df) else "(no rows)")

