"""A small widget to re-run the DataLoader sweep with chosen settings (introduced in 03_dataloader_tuning).

``loader_widget(dataset)`` always runs once with the given settings and prints the result as plain text, so
the cell has a static output under nbmake/CI or in a viewer without a live kernel; with ``interactive=True``
(and ipywidgets importable) it also shows sliders and a button to measure again.
"""
from __future__ import annotations

from .loader_bench import loader_sweep


def _line(r: dict) -> str:
    return (f"num_workers={r['num_workers']} pin_memory={r['pin_memory']} prefetch_factor={r['prefetch_factor']} "
            f"persistent_workers={r['persistent_workers']} batch_size={r['batch_size']}: "
            f"{r['images_per_s']:,.0f} img/s steady, {r['first_epoch_images_per_s']:,.0f} img/s first epoch, "
            f"first batch after {r['first_batch_s']:.2f} s")


def measure(dataset, *, num_workers: int, batch_size: int, pin_memory: bool = False, prefetch_factor: int = 2,
            persistent_workers: bool = False, max_batches: int | None = 20) -> list[dict]:
    rows = loader_sweep(dataset, num_workers=(num_workers,), batch_size=batch_size, pin_memory=(pin_memory,),
                        prefetch_factor=(prefetch_factor,), persistent_workers=(persistent_workers,), epochs=2,
                        max_batches=max_batches)
    for r in rows:
        print(_line(r))
    return rows


def loader_widget(dataset, *, num_workers: int = 0, batch_size: int = 128, pin_memory: bool = False,
                  prefetch_factor: int = 2, persistent_workers: bool = False, max_batches: int | None = 20,
                  max_workers: int = 8, interactive: bool = True) -> list[dict]:
    """Measure once with these settings (printed: the static output), then, if ``interactive``, display
    controls to measure again. Returns the first measurement's rows."""
    rows = measure(dataset, num_workers=num_workers, batch_size=batch_size, pin_memory=pin_memory,
                   prefetch_factor=prefetch_factor, persistent_workers=persistent_workers, max_batches=max_batches)
    if not interactive:
        return rows
    try:
        import ipywidgets as w
        from IPython.display import display
    except ImportError:
        print("(ipywidgets is not installed: the static result above is all this cell shows)")
        return rows
    controls = {
        "num_workers": w.IntSlider(value=num_workers, min=0, max=max_workers, description="num_workers"),
        "batch_size": w.Dropdown(options=[32, 64, 128, 256, 512, 1024], value=batch_size, description="batch_size"),
        "pin_memory": w.Checkbox(value=pin_memory, description="pin_memory"),
        "prefetch_factor": w.IntSlider(value=prefetch_factor, min=1, max=8, description="prefetch"),
        "persistent_workers": w.Checkbox(value=persistent_workers, description="persistent"),
    }
    button = w.Button(description="Measure", button_style="primary")
    out = w.Output()

    def run(_):
        with out:
            measure(dataset, max_batches=max_batches, **{k: c.value for k, c in controls.items()})

    button.on_click(run)
    display(w.VBox([w.HBox(list(controls.values())[:3]), w.HBox(list(controls.values())[3:] + [button]), out]))
    return rows
