"""Lesson 11: beyond data parallel on a CPU, measured (11_beyond_data_parallel).

The techniques live where a learner reads them: the wrapping code of DDP, ZeRO-1 and FSDP2 is
``workers/beyond/sharding.py``'s ``wrap`` (shown in the notebook), activation checkpointing is one line of
``workers/beyond/common.py``'s ``ResMLP.forward``, and the memory estimator is written in a notebook cell. This
module is the harness around them:

- ``n_params(width, blocks)``: the ResMLP's parameter count, in closed form (checked against the model);
- ``checkpoint_tradeoff``: activation memory and step time with and without checkpointing, in this process;
- ``per_rank_rows``: the sharding worker's results as one row per (strategy, world size), the largest rank's bytes;
- ``memory_explorer``: ipywidgets controls that show the notebook's estimate live and launch a measurement;
- ``pipelining_outcome``: what a bounded pipelining launch did (finished, hung inside ``schedule.step()``, or ran
  out of time before it started);
- ``verdict``: one word from a measured condition.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from mnist_helpers.io import MiB
from mnist_helpers.memory import peak_memory

STAGES = {"ddp": "ddp", "zero1": "zero1", "zero2": "fsdp2_zero2", "zero3": "fsdp2_zero3"}  # estimator -> worker


def n_params(width: int, blocks: int) -> int:
    """inp (784 w + w) + blocks x (up: 4w^2 + 4w, down: 4w^2 + w) + head (10 w + 10)."""
    return 784 * width + width + blocks * (8 * width * width + 5 * width) + 10 * width + 10


def verdict(ok: bool | None, *, yes: str = "holds", no: str = "does not hold here",
            unknown: str = "inconclusive") -> str:
    return unknown if ok is None else (yes if ok else no)


def checkpoint_tradeoff(build: Callable, batch_sizes, width: int, blocks: int, repeats: int = 3,
                        progress: bool = True) -> list[dict]:
    """For each batch size, one process: peak transient memory (``peak_memory``: activations and temporaries) and
    the median step time (``repeats`` interleaved steps) of ``build(width, blocks, checkpointing)`` with and without
    activation checkpointing. SGD, so the optimizer adds no state and the transient part is the activations."""
    from tqdm.auto import tqdm

    rows = []
    for batch in tqdm(list(batch_sizes), desc="batch sizes", disable=not progress):
        torch.manual_seed(0)
        X, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
        models = {ck: build(width, blocks, checkpointing=ck) for ck in (False, True)}
        opts = {ck: torch.optim.SGD(m.parameters(), lr=0.01) for ck, m in models.items()}

        def step(ck):
            opts[ck].zero_grad(set_to_none=True)
            F.nll_loss(models[ck](X), y).backward()
            opts[ck].step()

        seconds = {False: [], True: []}
        for ck in (False, True):
            step(ck)  # warm-up
        for _ in range(repeats):  # interleaved: a busy machine slows both alike
            for ck in (False, True):
                t0 = time.perf_counter()
                step(ck)
                seconds[ck].append(time.perf_counter() - t0)
        for ck in (False, True):
            report = peak_memory(lambda: step(ck), "cpu")
            rows.append({"batch_size": batch, "checkpointing": ck, "activations_mib": report.mib("transient"),
                         "peak_mib": report.mib("peak"), "step_ms": 1e3 * statistics.median(seconds[ck])})
    return rows


def per_rank_rows(results: dict) -> list[dict]:
    """``{world_size: sharding worker result}`` -> one row per strategy and world size: the largest rank's
    bytes in MiB (ranks differ a little where a shard is uneven) and rank 0's max parameter difference."""
    rows = []
    for world, res in sorted(results.items()):
        for strategy in dict.fromkeys(r["strategy"] for r in res["rows"]):
            ranks = [r for r in res["rows"] if r["strategy"] == strategy]
            top = {k: max(r.get(k) or 0 for r in ranks) / MiB
                   for k in ("params", "grads", "optimizer_state", "peak", "transient")}
            rank0 = next(r for r in ranks if r["rank"] == 0)
            rows.append({"strategy": strategy, "world_size": world, **{f"{k}_mib": v for k, v in top.items()},
                         "persistent_state_mib": top["params"] + top["grads"] + top["optimizer_state"],
                         "step_s": rank0.get("step_s"), "max_param_diff": rank0["max_param_diff"]})
    return rows


def memory_explorer(estimate: Callable, measure: Callable, *, width: int, blocks: int, batch_size: int,
                    interactive: bool = True):
    """Controls for width, batch, precision, world size, sharding stage and checkpointing: the estimate (the
    notebook's ``estimate(width, blocks, batch_size, precision, world_size, stage, checkpointing)``, a dict of MiB)
    updates as they move; the button calls ``measure(**settings)``, which launches the worker and shows the result."""
    if not interactive:
        return None
    try:
        import ipywidgets as w
        from IPython.display import display
    except ImportError:
        print("(ipywidgets is not installed: call estimate(...) and measure(...) yourself)")
        return None
    from mnist_helpers.display import show

    c = {"width": w.Dropdown(options=[128, 256, 512, 1024, 2048], value=width, description="width"),
         "batch_size": w.Dropdown(options=[32, 64, 128, 256, 512, 1024, 2048], value=batch_size,
                                  description="batch/rank"),
         "precision": w.Dropdown(options=["fp32", "bf16"], value="fp32", description="precision"),
         "world_size": w.Dropdown(options=[1, 2, 4], value=2, description="world size"),
         "stage": w.Dropdown(options=list(STAGES), value="zero3", description="sharding"),
         "checkpointing": w.Checkbox(value=False, description="checkpointing")}
    button = w.Button(description="Measure (launches torchrun)", button_style="primary",
                      layout=w.Layout(width="260px"))
    est_out, run_out = w.Output(), w.Output()

    def settings():
        return {k: v.value for k, v in c.items()}

    def refresh(_=None):
        est_out.clear_output()
        with est_out:
            e = estimate(blocks=blocks, **settings())
            show([{"part": k, "estimate_mib": v} for k, v in e.items()], formats={"estimate_mib": "{:,.1f}"},
                 caption=f"estimate per rank, {blocks} blocks")

    def run(_):
        run_out.clear_output()
        with run_out:
            measure(blocks=blocks, **settings())

    for ctl in c.values():
        ctl.observe(refresh, names="value")
    button.on_click(run)
    display(w.VBox([w.HBox(list(c.values())[:3]), w.HBox(list(c.values())[3:] + [button]), est_out, run_out]))
    refresh()
    return None


def pipelining_outcome(result: dict | None, output: str, timed_out: bool) -> dict:
    """Classify a bounded pipelining launch from what it returned and printed."""
    started = "schedule.step() started" in output
    done = "done in" in output
    if result is not None and not timed_out:
        return {"outcome": "finished", "hung": False, "step_seconds": result.get("step_seconds")}
    if timed_out and started and not done:
        return {"outcome": "hung inside schedule.step()", "hung": True}
    if timed_out and not started:
        return {"outcome": "timed out before the first step started (a slow start, not a hang)", "hung": None}
    return {"outcome": "failed or timed out after a step finished", "hung": None}
