"""A live training-curve figure for notebooks (introduced in 02_single_device_baseline).

    from mnist_helpers.course.live import LiveCurves
    live = LiveCurves(num_epochs=5, title="Net, DataLoader")
    result = fit(cfg, on_epoch=live.on_epoch, on_step=live.on_step)
    live.close()                       # draws the final figure and returns it

How it updates: the figure is rendered to a PNG and shown with ``IPython.display.display(...,
display_id=True)``; every redraw replaces that one output in place (``handle.update``). In JupyterLab
you watch it move; under nbmake/nbclient the same update messages leave the last frame in the saved
notebook, so the output degrades to a static figure with nothing to install (no widget JavaScript).
Outside IPython nothing is displayed and ``close()`` still returns the figure. Redraws are throttled
(``redraw_every_s``) so that drawing never costs the training loop more than a few percent.
"""
from __future__ import annotations

import io
import time


def ipython_kernel_active() -> bool:
    """True inside a Jupyter/IPython kernel (JupyterLab, nbclient/nbmake), False in plain Python or a terminal
    IPython. The one check behind every "display this live?" default in the package (curves, widgets)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def widgets(interactive: bool | None, without: str):
    """The ``ipywidgets`` module when this cell should show widgets, else None: ``interactive`` False, or None outside
    a live kernel (:func:`ipython_kernel_active`), or ipywidgets not installed (then it prints what the learner has
    instead, ``without``). Every widget in the series starts with it."""
    if interactive is None:
        interactive = ipython_kernel_active()
    if not interactive:
        return None
    try:
        import ipywidgets
    except ImportError:
        print(f"(ipywidgets is not installed: {without})")
        return None
    return ipywidgets


class LiveCurves:
    """Running training loss per step, train/test loss and test accuracy per epoch, redrawn as they come.

    ``on_step(step, running_loss)`` and ``on_epoch(row)`` match ``train.fit``'s callbacks
    (``step`` restarts at 1 each epoch; ``row`` has epoch, train_loss, test_loss, test_acc, images_per_s).
    """

    def __init__(self, num_epochs: int | None = None, title: str = "training", *, redraw_every_s: float = 2.0,
                 display: bool | None = None):
        if num_epochs is not None and (not isinstance(num_epochs, int) or num_epochs < 1):
            raise ValueError(f"num_epochs must be a positive integer or None, got {num_epochs!r}")
        if not isinstance(redraw_every_s, (int, float)) or redraw_every_s < 0:
            raise ValueError(f"redraw_every_s must be a number >= 0, got {redraw_every_s!r}")
        self.num_epochs, self.title, self.redraw_every_s = num_epochs, title, redraw_every_s
        self.display = ipython_kernel_active() if display is None else display
        self.steps: list[tuple[float, float]] = []   # (epoch position, running loss), epoch position 0..num_epochs
        self.epochs: list[dict] = []
        self._last_step, self._epoch_base, self._last_draw, self._handle = 0, 0, 0.0, None
        self._steps_per_epoch: int | None = None
        self.redraws = 0

    # ------------------------------------------------------------------ callbacks
    def on_step(self, step: int, loss: float) -> None:
        if step <= self._last_step:  # a new epoch started
            self._steps_per_epoch = self._steps_per_epoch or self._last_step
            self._epoch_base += 1
        self._last_step = step
        per = self._steps_per_epoch
        x = self._epoch_base + (step / per if per else 0.0)
        self.steps.append((x, float(loss)))
        if time.perf_counter() - self._last_draw >= self.redraw_every_s:
            self.redraw()

    def on_epoch(self, row: dict) -> None:
        missing = {"epoch", "train_loss", "test_loss", "test_acc"} - set(row)
        if missing:
            raise ValueError(f"on_epoch needs a history row with {sorted(missing)} (train.fit passes one)")
        self.epochs.append(dict(row))
        if self._steps_per_epoch is None and self._last_step:
            self._steps_per_epoch = self._last_step
            # place the first epoch's steps now that its length is known
            self.steps = [(i / self._last_step, l) for i, (_, l) in enumerate(self.steps, 1)]
        self.redraw()

    # ------------------------------------------------------------------ drawing
    def figure(self):
        """A fresh matplotlib Figure of the curves so far (not registered with pyplot)."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 3.4), layout="constrained")
        ax1, ax2 = fig.subplots(1, 2)
        if self.steps:
            xs, ls = zip(*self.steps)
            ax1.plot(xs, ls, lw=1, alpha=0.6, label="running train loss (per step)")
        if self.epochs:
            ep = [r["epoch"] for r in self.epochs]
            ax1.plot(ep, [r["train_loss"] for r in self.epochs], "o-", label="train loss (epoch)")
            ax1.plot(ep, [r["test_loss"] for r in self.epochs], "s-", label="test loss")
            ax2.plot(ep, [100 * r["test_acc"] for r in self.epochs], "o-", color="C3")
            for e, a in zip(ep, (r["test_acc"] for r in self.epochs)):
                ax2.annotate(f"{100 * a:.2f}%", (e, 100 * a), textcoords="offset points", xytext=(0, 6),
                             ha="center", fontsize=8)
        xmax = self.num_epochs or max([len(self.epochs), 1])
        for ax in (ax1, ax2):
            ax.set_xlim(0, xmax + 0.2)
            ax.set_xlabel("epoch")
        ax1.set_ylabel("NLL loss")
        ax1.set_yscale("log")
        if self.steps or self.epochs:
            ax1.legend(fontsize=8)
        ax2.set_ylabel("test accuracy (%)")
        done = f"epoch {len(self.epochs)}/{self.num_epochs or '?'}"
        speed = f", {self.epochs[-1]['images_per_s']:,.0f} img/s" if self.epochs and "images_per_s" in self.epochs[-1] else ""
        fig.suptitle(f"{self.title}: {done}{speed}")
        return fig

    def redraw(self) -> None:
        self._last_draw = time.perf_counter()
        self.redraws += 1
        if not self.display:
            return
        from IPython.display import Image, display

        buf = io.BytesIO()
        self.figure().savefig(buf, format="png", dpi=80)
        img = Image(data=buf.getvalue(), format="png")
        if self._handle is None:
            self._handle = display(img, display_id=True)
        else:
            self._handle.update(img)

    def close(self):
        """Final redraw (the frame that stays in the notebook); returns the figure."""
        self.redraw()
        return self.figure()
