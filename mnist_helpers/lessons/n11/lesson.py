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
- ``verdict``: one word from a measured condition;
- ``claims_11``: the notebook's claims (all the series' own) judged from what it measured, as the entries
  ``claims.record`` writes to ``results/11_beyond_data_parallel.json`` (tests/notebooks/test_n11_claims.py).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from mnist_helpers.course.live import widgets
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
    updates as they move; the button calls ``measure(**settings)``, which launches the worker and shows the result.

    The starting estimate is the cell's own output (what a saved or CI-run notebook keeps), shown before the
    controls; their Output areas are written only by the callbacks. Writing into an Output widget while the cell
    itself runs made nbclient 0.11 with ipykernel 7.4 wait out its whole cell timeout (900 s under nbmake)."""
    from mnist_helpers.course.display import show

    def estimate_table(**settings):
        e = estimate(blocks=blocks, **settings)
        show([{"part": k, "estimate_mib": v} for k, v in e.items()], formats={"estimate_mib": "{:,.1f}"},
             caption=f"estimate per rank, {blocks} blocks: " + ", ".join(f"{k} {v}" for k, v in settings.items()))

    start = {"width": width, "batch_size": batch_size, "precision": "fp32", "world_size": 2, "stage": "zero3",
             "checkpointing": False}
    estimate_table(**start)
    w = widgets(interactive, "call estimate(...) and measure(...) yourself")
    if w is None:
        return None
    from IPython.display import display

    c = {"width": w.Dropdown(options=[128, 256, 512, 1024, 2048], value=width, description="width"),
         "batch_size": w.Dropdown(options=[32, 64, 128, 256, 512, 1024, 2048], value=batch_size,
                                  description="batch/rank"),
         "precision": w.Dropdown(options=["fp32", "bf16"], value=start["precision"], description="precision"),
         "world_size": w.Dropdown(options=[1, 2, 4], value=start["world_size"], description="world size"),
         "stage": w.Dropdown(options=list(STAGES), value=start["stage"], description="sharding"),
         "checkpointing": w.Checkbox(value=start["checkpointing"], description="checkpointing")}
    button = w.Button(description="Measure (launches torchrun)", button_style="primary",
                      layout=w.Layout(width="260px"))
    est_out, run_out = w.Output(), w.Output()

    def settings():
        return {k: v.value for k, v in c.items()}

    def refresh(_=None):
        est_out.clear_output()
        with est_out:
            estimate_table(**settings())

    def run(_):
        run_out.clear_output()
        with run_out:
            measure(blocks=blocks, **settings())

    for ctl in c.values():
        ctl.observe(refresh, names="value")
    button.on_click(run)
    display(w.VBox([w.HBox(list(c.values())[:3]), w.HBox(list(c.values())[3:] + [button]), est_out, run_out]))
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


# --------------------------------------------------------------------------- the claims, from the measurements

BUSY = "no verdict: the machine is busy"  # claims.BUSY: a timing taken while others used the CPU


def _contention(c) -> dict | None:
    """A ``claims.Contention`` or its dict, as the dict a result file keeps (None stays None)."""
    return c.to_dict() if hasattr(c, "to_dict") else c


def _busy(c) -> bool:
    c = _contention(c)
    return bool(c and c.get("busy"))


def _own(slug: str, claim: str, verdict_word: str, evidence: str, regime: str, contention=None, **numbers) -> dict:
    entry = {"id": f"11.{slug}", "claim": claim, "section": "ours", "verdict": verdict_word, "evidence": evidence,
             "numbers": numbers or {"measured": True}, "regime": regime}
    if contention is not None:
        entry["contention"] = _contention(contention)
    return entry


@dataclass(frozen=True, kw_only=True)
class Measured11:
    """What notebook 11 measured, the one input of :func:`claims_11` (its closing cell builds it once).

    ``config``: width, blocks, batch_size, steps, worlds, ckpt_width, ckpt_batches. ``mem_rows``: ``per_rank_rows``
    with the notebook's estimate added (``estimated_state_mib``, ``peak_vs_estimate``). ``ckpt_rows``:
    ``checkpoint_tradeoff``'s. ``dcp_saved`` / ``dcp_loaded``: the DCP worker's save result and ``{world size:
    load result}`` (each with ``digests``). ``torch_save``: ``{"local_shape", "full_shape", "full_error"}`` of
    rank 0's ``torch.save`` file. ``tp``: ``{ranks: tensor-parallel result}``. ``compile_result``: the compile
    worker's result, None when it was not run. ``pipe``: ``pipelining_outcome``'s dict, ``pipeline_timeout_s`` its
    limit. Contentions: a ``claims.Contention`` or its dict; a busy one turns a timing's verdict into "no verdict:
    the machine is busy"."""
    config: dict
    mem_rows: list[dict]
    ckpt_rows: list[dict]
    ckpt_contention: object = None
    dcp_saved: dict
    dcp_loaded: dict
    torch_save: dict
    tp: dict
    compile_result: dict | None = None
    compile_contention: object = None
    pipe: dict
    pipeline_timeout_s: float


def claims_11(m: Measured11) -> list[dict]:
    """The notebook's claims (all the series' own, section "ours"), judged from what it measured
    (:class:`Measured11`); no I/O. Returns one dict per claim (``claims.record``'s entries), section by section
    (``_c11_<section>``)."""
    config = m.config
    width, blocks, batch = config["width"], config["blocks"], config["batch_size"]
    worlds, steps = list(config["worlds"]), config["steps"]
    regime = f"ResMLP width {width}, {blocks} blocks, batch {batch} per rank, AdamW, gloo on the CPU, world sizes {worlds}"
    return [*_c11_estimates(m.mem_rows, regime),
            *_c11_checkpointing(config, blocks, m.ckpt_rows, m.ckpt_contention),
            *_c11_sharding(worlds, steps, m.mem_rows, regime),
            *_c11_checkpoints(m.dcp_saved, m.dcp_loaded, m.torch_save, regime),
            *_c11_tensor_parallel(m.tp),
            *_c11_compile(m.compile_result, m.compile_contention),
            *_c11_pipelining(m.pipe, m.pipeline_timeout_s)]


def _c11_estimates(mem_rows, regime) -> list[dict]:
    """The estimate against the measurement."""
    out = []
    state_err = max(abs(r["persistent_state_mib"] / r["estimated_state_mib"] - 1) for r in mem_rows)
    peak_ratios = [r["peak_vs_estimate"] for r in mem_rows]
    out.append(_own("estimate_state", "the estimator predicts parameters + gradients + optimizer state per rank "
                    "(within 10%)", verdict(state_err < 0.10),
                    f"largest relative error {state_err:.1%} over {len(mem_rows)} runs", regime,
                    state_err=state_err, runs=len(mem_rows)))
    out.append(_own("estimate_peak", "the estimator predicts the measured peak per rank (within 25%)",
                    verdict(all(0.75 <= x <= 1.25 for x in peak_ratios)),
                    f"measured peak / estimate from {min(peak_ratios):.2f} to {max(peak_ratios):.2f}", regime,
                    peak_ratios=peak_ratios))
    return out


def _c11_checkpointing(config, blocks, ckpt_rows, ckpt_contention) -> list[dict]:
    """Activation checkpointing: memory (deterministic) and time (a timing: the load rule applies)."""
    out = []
    ck_regime = (f"ResMLP(width={config['ckpt_width']}, blocks={blocks}), SGD, one process, "
                 f"batches {list(config['ckpt_batches'])}")
    big = max(r["batch_size"] for r in ckpt_rows)
    plain, ck = (next(r for r in ckpt_rows if r["batch_size"] == big and r["checkpointing"] == c)
                 for c in (False, True))
    mem_ratio, time_ratio = ck["activations_mib"] / plain["activations_mib"], ck["step_ms"] / plain["step_ms"]
    out.append(_own("checkpointing_memory", "activation checkpointing cuts activation memory (below 70% of plain)",
                    verdict(mem_ratio < 0.7),
                    f"batch {big}: {ck['activations_mib']:.1f} vs {plain['activations_mib']:.1f} MiB "
                    f"(x{mem_ratio:.2f})", ck_regime, batch=big, checkpointed_mib=ck["activations_mib"],
                    plain_mib=plain["activations_mib"], ratio=mem_ratio))
    # recomputing the forward costs about one more forward (~1.33x a step); below 1.05x it is not told from noise
    out.append(_own("checkpointing_time", "activation checkpointing costs extra step time",
                    BUSY if _busy(ckpt_contention) else verdict(True if time_ratio > 1.05 else None),
                    f"batch {big}: {ck['step_ms']:.0f} vs {plain['step_ms']:.0f} ms (x{time_ratio:.2f}), median of "
                    "3 interleaved steps", ck_regime, ckpt_contention, batch=big, checkpointed_ms=ck["step_ms"],
                    plain_ms=plain["step_ms"], ratio=time_ratio))
    return out


def _c11_sharding(worlds, steps, mem_rows, regime) -> list[dict]:
    """ZeRO-1 and FSDP2 against DDP, at the largest world size."""
    out = []
    top = max(worlds)

    def row(strategy):
        return next(r for r in mem_rows if r["strategy"] == strategy and r["world_size"] == top)
    ddp, z1, z2, z3 = (row(s) for s in ("ddp", "zero1", "fsdp2_zero2", "fsdp2_zero3"))
    zero1_opt = z1["optimizer_state_mib"] / ddp["optimizer_state_mib"]
    fsdp_state = z3["persistent_state_mib"] / ddp["persistent_state_mib"]
    worst_diff = max(r["max_param_diff"] for r in mem_rows)
    out.append(_own("zero1_optimizer_state", "ZeRO-1 keeps about 1/N of the optimizer state per rank",
                    verdict(zero1_opt < 1 / top + 0.15) if top > 1 else "not testable here",
                    f"ZeRO-1 / DDP optimizer state per rank x{zero1_opt:.2f} at {top} ranks (1/N = {1 / top:.2f}; "
                    "the split is by whole parameters, so it is uneven)", regime,
                    ratio=zero1_opt, ranks=top, one_over_n=1 / top))
    out.append(_own("fsdp2_state", "FSDP2 keeps about 1/N of parameters + gradients + optimizer state per rank",
                    verdict(fsdp_state < 1 / top + 0.05) if top > 1 else "not testable here",
                    f"FSDP2 / DDP state per rank x{fsdp_state:.2f} at {top} ranks", regime,
                    ratio=fsdp_state, ranks=top))
    # within 5% either way is below what repeated runs here reproduce: inconclusive
    out.append(_own("zero3_peak", "ZeRO-3 (reshard after forward) peaks lower than ZeRO-2-like (keep gathered)",
                    verdict(True if z3["peak_mib"] < 0.95 * z2["peak_mib"] else
                            False if z3["peak_mib"] > 1.05 * z2["peak_mib"] else None) if top > 1
                    else "not testable here",
                    f"peak per rank at {top} ranks: {z3['peak_mib']:.1f} vs {z2['peak_mib']:.1f} MiB", regime,
                    zero3_peak_mib=z3["peak_mib"], zero2_peak_mib=z2["peak_mib"], ranks=top))
    # AdamW moves each weight by about lr = 1e-3 per step, so a missed or wrong reduction shows up near 1e-3; summing
    # the same numbers in another order (per-rank halves, then all-reduce) differs by float rounding, ~1e-6 to 1e-5
    out.append(_own("same_weights", "DDP, ZeRO-1 and FSDP2 train the same weights as one process",
                    verdict(worst_diff < 1e-4),
                    f"largest parameter difference after {steps} AdamW steps: {worst_diff:.1e} (world sizes "
                    f"{worlds})", regime, max_param_diff=worst_diff, steps=steps, world_sizes=worlds))
    return out


def _c11_checkpoints(dcp_saved, dcp_loaded, torch_save, regime) -> list[dict]:
    """Distributed checkpoints."""
    out = []
    dcp_ok = all(r["digests"] == dcp_saved["digests"] for r in dcp_loaded.values())
    out.append(_own("dcp_reshard", "DCP: saved from 2 ranks, loads into other world sizes bit for bit",
                    verdict(dcp_ok),
                    f"sha256 of every tensor {'equal' if dcp_ok else 'NOT equal'} after loading into "
                    f"{sorted(dcp_loaded)} process(es)",
                    "DCP async save from 2 ranks (gloo), loaded in this kernel and by torchrun workers",
                    loaded_into=sorted(dcp_loaded), tensors=len(dcp_saved["digests"])))
    local, full = tuple(torch_save["local_shape"]), tuple(torch_save["full_shape"])
    out.append(_own("torch_save_sharded", "torch.save of a sharded model saves only the saving rank's shards",
                    verdict(local != full),
                    f"rank0.pt: local {local} of {full}; full_tensor(): "
                    f"{'failed' if torch_save.get('full_error') else 'worked'}",
                    regime, local_shape=list(local), full_shape=list(full),
                    full_tensor_error=torch_save.get("full_error") or ""))
    return out


def _c11_tensor_parallel(tp) -> list[dict]:
    """Tensor parallel."""
    out = []
    tp_ok = all(r["output_max_diff"] < 1e-5 and r["grad_max_diff"] < 1e-6 for r in tp.values())
    out.append(_own("tensor_parallel", "ColwiseParallel + RowwiseParallel reproduce the unsharded Linear pair",
                    verdict(tp_ok),
                    "; ".join(f"{n} ranks: output {r['output_max_diff']:.1e}, gradients {r['grad_max_diff']:.1e}"
                              for n, r in tp.items()),
                    f"DTensor ColwiseParallel + RowwiseParallel, Linear pair of width 64, gloo, {list(tp)} ranks",
                    **{f"output_diff_{n}": r["output_max_diff"] for n, r in tp.items()},
                    **{f"grad_diff_{n}": r["grad_max_diff"] for n, r in tp.items()}))
    return out


def _c11_compile(compile_result, compile_contention) -> list[dict]:
    """Torch.compile with DDP (the full profile runs it)."""
    out = []
    comp_regime = "DDP, 2 processes, ResMLP(256, 2), batch 64 per process, 10 steps, gloo on the CPU"
    same = "torch.compile(DDP(model)) trains the same weights as eager DDP"
    speed = "torch.compile speeds up a DDP step here"
    if compile_result is None:
        out += [_own(slug, text, "not testable here", "not run in the quick profile (the first compiled step takes "
                     "seconds per process)", comp_regime, skipped=True)
                for slug, text in (("compile_ddp_same", same), ("compile_ddp_speed", speed))]
    else:
        c = compile_result
        ratio = c["step_s"]["compiled"] / c["step_s"]["eager"]
        out.append(_own("compile_ddp_same", same, verdict(c["max_param_diff"] < 1e-5),
                        f"max parameter difference {c['max_param_diff']:.1e}", comp_regime,
                        max_param_diff=c["max_param_diff"]))
        out.append(_own("compile_ddp_speed", speed,
                        BUSY if _busy(compile_contention) else
                        verdict(True if ratio < 0.9 else False if ratio > 1.1 else None),
                        f"compiled / eager median step x{ratio:.2f}; first compiled step "
                        f"{c['first_step_s']['compiled']:.1f} s", comp_regime, compile_contention,
                        ratio=ratio, first_compiled_step_s=c["first_step_s"]["compiled"]))
    return out


def _c11_pipelining(pipe, pipeline_timeout_s) -> list[dict]:
    """Pipelining on gloo."""
    out = []
    secs = pipe.get("step_seconds") or []
    out.append(_own("pipelining_gloo", "torch.distributed.pipelining hangs on gloo (CPU)", verdict(pipe["hung"]),
                    f"{pipe['outcome']} within {pipeline_timeout_s:g} s"
                    + (f"; steps took {', '.join(f'{s:.2f}' for s in secs)} s" if secs else ""),
                    "torch.distributed.pipelining ScheduleGPipe, 2 stages, 2 steps, gloo on the CPU",
                    timeout_s=pipeline_timeout_s, step_seconds=list(secs), hung=pipe["hung"]))
    return out
