"""Lesson 05: mixed precision, gradient accumulation and memory, measured (05_mixed_precision_and_memory).

Serves notebook 05. Its measurement harness (``deprecated_amp_warnings``, ``compare_precisions``, ``amp_gain`` and
``amp_verdict``, ``accumulated_gradients``, ``accumulation_memory``, ``allocator_fragmentation``,
``empty_cache_cost``) lives beside this module, ``mnist_helpers.lessons.n05.precision``, which ``scripts/bench_amp.py`` and
``scripts/device_check.py`` run too; notebook 05 and the tests import them from there. Every training step here is
``train.train_step`` (through ``train_one_epoch``); the notebook writes the autocast + GradScaler step out once, which
is the lesson; memory is measured with the core ``mnist_helpers.memory`` (``peak_memory``, ``run_isolated``).
Functions return rows (a list of dicts) or a dict; the notebook shows them with ``display.show``.

Today's API is ``torch.amp.autocast(device_type, dtype=...)`` and ``torch.amp.GradScaler(device_type)``;
the article's ``torch.cuda.amp.autocast()`` / ``torch.cuda.amp.GradScaler()`` still run but warn.

The API:
- ``supported_amp``: which ``TrainConfig.amp`` options work here (``train.check_amp`` for each, which
  also catches an autocast that silently disables itself);
- ``deprecated_amp_warnings`` (``precision``): the warnings the article's spelling raises.

Precision, measured:
- ``compare_precisions`` (``precision``): fp32, bf16, fp16 with or without GradScaler, channels_last (``MODES``;
  on CUDA ``fp32`` is IEEE float32 with TF32 switched off and ``tf32`` its own mode, and timed blocks last >= 0.2 s);
  speed (median of interleaved repeats), peak memory split into persistent and transient, test accuracy;
- ``gradient_underflow`` and ``scaler_skip_demo``: why fp16 needs a GradScaler, and what it does
  when the scale is too large (inf gradients -> the step is skipped, the scale halves).

The claim, judged: ``amp_gain`` (bf16 vs fp32 at one batch: ratios, halves, faster) and ``amp_verdict``
(``precision``).

Gradient accumulation:
- ``accumulated_gradients`` and ``accumulation_memory`` (``precision``): what k micro-batches do to the gradient
  (the big batch's) and to peak memory (the notebook writes the accumulation step and DDP's ``no_sync`` out in its
  cells; the 2-process timing is the worker ``workers/bench/accum_nosync``).

Memory experiments (run through ``memory.run_isolated`` for a fresh process):
- ``leak_demo``: summing the loss tensor instead of ``loss.item()`` keeps every batch's loss and its graph;
  ``kept_by_graph`` counts what such a graph still holds (after ``backward()``: no saved tensor);
- ``allocator_fragmentation`` (CUDA only, ``precision``): the caching allocator with and without
  ``expandable_segments``;
- ``empty_cache_cost`` (CUDA only, ``precision``): what ``torch.cuda.empty_cache()`` after every step costs;
- ``kept_allocator_run``: both, from a kept GPU run, for a machine without one.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mnist_helpers.course import claims
from mnist_helpers.io import MiB
from mnist_helpers.memory import current_bytes
from mnist_helpers.models import build_model
# the measurement harness lives beside this module (scripts/bench_amp.py and scripts/device_check.py run it too):
# mnist_helpers.lessons.n05.precision (compare_precisions, accumulation_memory, ...), imported from there by notebook 05
from mnist_helpers.lessons.n05.precision import ARTICLE_AMP_BATCH, amp_gain, amp_verdict, flat_grads
from mnist_helpers.train import AMP_DTYPES, check_amp, train_step

# --------------------------------------------------------------------------- the API

def graph_nodes(t) -> int:
    """How many autograd nodes are reachable from ``t`` (0 for a float or a tensor without history)."""
    root = getattr(t, "grad_fn", None)
    seen, stack = set(), [root] if root is not None else []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(n for n, _ in node.next_functions)
    return len(seen)


def supported_amp(device) -> dict:
    """{amp: None if it works here, else the reason} for every ``TrainConfig.amp`` (``train.AMP_DTYPES``)."""
    out = {}
    for amp in AMP_DTYPES:
        try:
            check_amp(amp, torch.device(device))
            out[amp] = None
        except ValueError as e:
            out[amp] = str(e)
    return out


# --------------------------------------------------------------------------- fp16 and the GradScaler

def gradient_underflow(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor,
                       scales=(1.0, 2.0**16), device_type: str | None = None) -> list[dict]:
    """Compare fp16-autocast gradients with the fp32 gradient of the same batch.

    For each loss ``scale`` the loss is multiplied before backward and the gradient divided after
    (what GradScaler does). Rows: scale, underflow_frac (entries nonzero in fp32 that came out
    exactly zero), rel_error (||g16 - g32|| / ||g32||), nonfinite (inf/nan entries).
    """
    # Not train_step: a fixed loss scale and no optimizer step, to read the raw fp16 gradient at each scale.
    device_type = device_type or X.device.type
    model.zero_grad(set_to_none=True)
    F.nll_loss(model(X).float(), y).backward()
    ref = flat_grads(model)
    rows = []
    for scale in scales:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=torch.float16):
            loss = F.nll_loss(model(X).float(), y)
        (loss * scale).backward()
        g = flat_grads(model) / scale
        nonzero = ref != 0
        rows.append({"scale": scale, "underflow_frac": float(((g == 0) & nonzero).sum() / nonzero.sum()),
                     "rel_error": float((g - ref).norm() / ref.norm()),
                     "nonfinite": int((~torch.isfinite(g)).sum())})
    model.zero_grad(set_to_none=True)
    return rows


def scaler_skip_demo(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor, init_scale: float = 2.0**24,
                     num_steps: int = 6, lr: float = 1e-3) -> list[dict]:
    """fp16 steps with a GradScaler whose scale starts too high: scaled gradients overflow to inf,
    ``scaler.step`` skips the update (weights unchanged) and ``update()`` halves the scale, until the
    gradients fit. Rows per step: step, scale, found_inf, skipped (weights unchanged), loss."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler(X.device.type, init_scale=init_scale, growth_interval=1000)
    rows = []
    for step in range(1, num_steps + 1):
        before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        scale = scaler.get_scale()
        loss = train_step(model, opt, X, y, amp="fp16", scaler=scaler)
        # scaler.step unscaled the gradients in place: an overflow is still inf/nan in .grad
        found_inf = any(not torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        after = torch.cat([p.detach().flatten() for p in model.parameters()])
        rows.append({"step": step, "scale": scale, "found_inf": bool(found_inf),
                     "skipped": bool(torch.equal(before, after)), "loss": float(loss)})
    return rows


# --------------------------------------------------------------------------- memory experiments

def leak_demo(num_steps: int = 8, accumulate: str = "tensor", backward: bool = True, batch_size: int = 64,
              device: str = "cpu", model: str = "net", seed: int = 0) -> dict:
    """Run ``num_steps`` batches summing the loss for logging; record memory in use after each batch.

    ``accumulate="tensor"`` sums the loss *tensor* (``total += loss``): every batch's graph stays
    reachable from ``total``. ``"item"`` sums ``loss.item()`` (a Python float): nothing is kept.
    ``backward=True`` is a training loop: ``backward()`` frees the activations each graph saved, so
    what piles up is the loss tensors themselves (4 bytes each) and their ``grad_fn`` chains, with no saved tensor
    left in them. ``backward=False`` is an evaluation loop without ``torch.no_grad()``: then each kept graph still
    holds its saved activations. ``kept_by_graph`` counts both exactly (``graph_nodes_kept``, ``saved_bytes_kept``);
    ``bytes_after_step`` is the process's meter (RSS on CPU: the allocator's and the OS's noise included).
    On CPU run it in a fresh process (``run_isolated(leak_demo, ...)``): the RSS is the meter there. Run so (the
    new process imports it by module and name) from notebook 05 and tests/core/test_memory.py: keep it at module level,
    its keyword arguments and its JSON-able result.
    """
    if accumulate not in ("tensor", "item"):
        raise ValueError(f"accumulate must be 'tensor' or 'item', got {accumulate!r}")
    dev = torch.device(device)
    torch.manual_seed(seed)
    net = build_model(model).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    X = torch.randn(batch_size, 1, 28, 28, device=dev)
    y = torch.randint(0, 10, (batch_size,), device=dev)
    total = 0.0
    used = []
    for _ in range(num_steps):
        # Not train_step: the demo needs the loss tensor with its graph (train_step returns it detached).
        loss = F.nll_loss(net(X), y)
        if backward:
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        total = total + (loss.item() if accumulate == "item" else loss)
        del loss
        used.append(current_bytes(dev))
    kept = kept_by_graph(total, exclude=[*net.parameters(), X, y])
    return {"accumulate": accumulate, "backward": backward, "bytes_after_step": used,
            "growth_per_step": (used[-1] - used[0]) / max(num_steps - 1, 1),
            "graph_nodes_kept": graph_nodes(total), "saved_bytes_kept": kept["saved_bytes"],
            "saved_tensors_kept": kept["saved_tensors"], "saved_freed": kept["freed"],
            "loss_tensors_kept": num_steps if accumulate == "tensor" else 0,
            "mean_loss": float(getattr(total, "detach", lambda: total)()) / num_steps}


def kept_by_graph(t, exclude=()) -> dict:
    """What the autograd graph reachable from ``t`` still holds: its ``nodes``, the distinct ``saved_tensors`` still
    alive in them and their ``saved_bytes`` (the tensors in ``exclude``, e.g. the parameters and the input batch,
    live anyway and are not counted), and ``freed``: saved slots that ``backward()`` already released."""
    skip = {x.untyped_storage().data_ptr() for x in exclude}
    root = getattr(t, "grad_fn", None)
    seen, stack, storages = set(), [root] if root is not None else [], {}
    freed = 0
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            try:
                value = getattr(node, name)
            except RuntimeError:  # "... saved tensors after they have already been freed": backward() released it
                freed += 1
                continue
            for x in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(x, torch.Tensor):
                    storage = x.untyped_storage()
                    if storage.data_ptr() not in skip:
                        storages[storage.data_ptr()] = storage.nbytes()
        stack.extend(n for n, _ in node.next_functions)
    return {"nodes": len(seen), "saved_tensors": len(storages), "saved_bytes": sum(storages.values()), "freed": freed}


def kept_allocator_run(reference_dir) -> dict | None:
    """The allocator experiment of a GPU run kept under ``reference_dir`` (results/reference/), for a machine without
    CUDA: ``scripts/device_check.sh``'s section (``<label>/device_check_allocator.json``, filed by ``device_check
    --keep``) or ``scripts/bench_amp.py --allocator``'s file (its ``allocator`` entry). A dict with ``default``,
    ``expandable_segments`` (``allocator_fragmentation`` under each PYTORCH_CUDA_ALLOC_CONF) and ``empty_cache``
    (``empty_cache_cost``), plus ``machine`` and ``path``; None when no kept run measured all three."""
    import json
    from pathlib import Path

    root = Path(reference_dir)
    for path in sorted(root.glob("*/device_check_allocator.json")) + sorted(root.glob("**/*amp*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("dry_run_on_cpu") or not doc.get("machine"):
            continue
        if path.name == "device_check_allocator.json":
            run = {"default": doc.get("fragmentation"),
                   "expandable_segments": (doc.get("fragmentation_expandable") or {}).get("result"),
                   "empty_cache": doc.get("empty_cache_cost")}
        else:
            run = dict(doc.get("allocator") or {})
        if all(run.get(k) for k in ("default", "expandable_segments", "empty_cache")):
            return {**run, "machine": doc["machine"], "path": path}
    return None


# --------------------------------------------------------------------------- the claims notebook 05 records

AMP_CPU_CLAIM = ("bf16 autocast on a CPU halves a training step's peak memory and speeds it up (the article's AMP "
                 "claim, tried on this CPU)")


def _busy(contention) -> bool:
    if contention is None:
        return False
    if isinstance(contention, dict):
        return bool(contention.get("busy"))
    return bool(contention.busy)


def _as_dict(contention):
    return contention.to_dict() if hasattr(contention, "to_dict") else contention


@dataclass(frozen=True, kw_only=True)
class Measured05:
    """What notebook 05 measured, the one input of :func:`claims_05` (its closing cell builds it once).

    ``device``: the device type the notebook measured on; ``precision``: ``compare_precisions``' rows by mode (``fp32``
    and ``bf16`` at ``batch_size``); ``small``: its fp32 and bf16 rows at batch 32; ``amp_load``: the
    ``claims.Contention`` (or its dict) of those timings; ``deprecations``: how many warnings the article's
    ``torch.cuda.amp`` spelling raised under ``torch_version``; ``accum``: ``accumulation_memory``'s rows; ``leak``:
    ``leak_demo``'s results by loop name (``"training loop, total += loss"``, ``"... total += loss.item()"``, ``"eval
    loop, ..."``) over ``leak_steps`` steps."""
    device: str
    precision: dict
    small: list[dict]
    batch_size: int
    amp_load: object = None
    deprecations: int
    torch_version: str
    accum: list[dict]
    leak: dict
    leak_steps: int


def claims_05(m: Measured05) -> list[dict]:
    """The claims of notebook 05, one dict per claim (the keyword arguments of ``claims.ResultFile.claim``), from
    what the notebook measured (:class:`Measured05`).

    - 05.amp_memory_speed (the article: a GPU at batch 128): *not testable here* without a CUDA GPU (the CPU's
      numbers are quoted as context and judged in 05.amp_on_cpu); on a GPU ``amp_verdict`` of bf16 against fp32, or
      ``claims.BUSY`` when the timings ran on a busy machine.
    - 05.amp_on_cpu (ours, CPU only): the same rule for bf16 autocast on this CPU.
    - 05.cuda_amp_api: *outdated* when both of the article's calls warn, *holds* when neither does.
    - 05.accumulation_memory: *wrong* when k micro-batches lower the peak below 0.9x of k=1's, *holds* above 1.1x.
    - 05.loss_leak: in the training loop (the article's case) *holds* when the kept graphs also keep saved tensors
      (at least a quarter of the eval loop's per batch), *holds with nuance* when they keep only the loss tensors and
      their ``grad_fn`` chains (``backward()`` freed the rest), *does not hold here* when nothing is kept.
    """
    return [*_c05_amp(m.device, m.precision, m.small, m.batch_size, m.amp_load),
            _c05_cuda_amp_api(m.device, m.deprecations, m.torch_version),
            _c05_accumulation_memory(m.device, m.accum, m.batch_size),
            _c05_loss_leak(m.device, m.leak, m.leak_steps)]


def _c05_amp(device, precision, small, batch_size, amp_load) -> list[dict]:
    """05.amp_memory_speed, and on a CPU 05.amp_on_cpu."""
    out = []
    fp32, bf16 = precision["fp32"], precision["bf16"]
    gain = amp_gain(fp32, bf16)
    small_ratio = small[1]["peak_mib"] / small[0]["peak_mib"]
    peak_how = "allocation replay" if fp32.get("memory_method") == "profiler" else \
        f"the {fp32.get('memory_method')} memory counters"
    amp_n = {"peak_ratio": gain["peak_ratio"], "transient_ratio": gain["transient_ratio"],
             "persistent_ratio": bf16["persistent_mib"] / fp32["persistent_mib"], "peak_ratio_batch32": small_ratio,
             "speedup": gain["speedup"], "bf16_blocks": bf16["block_images_per_s"],
             "fp32_blocks": fp32["block_images_per_s"], "batch": batch_size}
    measured = (f"bf16 vs fp32 at batch {batch_size}: peak x{gain['peak_ratio']:.2f} (activations "
                f"x{gain['transient_ratio']:.2f}, weights/grads/Adam x{amp_n['persistent_ratio']:.2f}; x{small_ratio:.2f} "
                f"at batch 32); speed x{gain['speedup']:.2f} (blocks {min(bf16['block_images_per_s']):,.0f}-"
                f"{max(bf16['block_images_per_s']):,.0f} vs {min(fp32['block_images_per_s']):,.0f}-"
                f"{max(fp32['block_images_per_s']):,.0f} img/s)")
    blocks = f"{len(bf16['block_images_per_s'])} interleaved timed blocks per mode, peak by {peak_how}"
    if device == "cuda":
        verdict = claims.BUSY if _busy(amp_load) else amp_verdict([gain])
        note = "" if batch_size == ARTICLE_AMP_BATCH else f" (the article's batch is {ARTICLE_AMP_BATCH})"
        out.append(dict(id="05.amp_memory_speed", verdict=verdict, evidence=measured, numbers=amp_n,
                        contention=_as_dict(amp_load),
                        regime=f"Net, Adam, batch {batch_size}{note} and 32, {blocks}; CUDA GPU"))
    else:
        out.append(dict(id="05.amp_memory_speed", verdict="not testable here",
                        evidence=f"no CUDA GPU here, and the article's claim is about one; on this {device}: " + measured,
                        numbers={**amp_n, "article_batch": ARTICLE_AMP_BATCH}, contention=_as_dict(amp_load),
                        regime=(f"the article's: one GPU at batch {ARTICLE_AMP_BATCH}; measured here: bf16 autocast "
                                f"on {device}, Net, Adam, batch {batch_size} and 32, {blocks}")))
        if device == "cpu":
            out.append(dict(id="05.amp_on_cpu", claim=AMP_CPU_CLAIM, section="ours",
                            verdict=claims.BUSY if _busy(amp_load) else amp_verdict([gain]), evidence=measured,
                            numbers=amp_n, contention=_as_dict(amp_load),
                            regime=f"bf16 autocast on this CPU, Net, Adam, batch {batch_size} and 32, {blocks}"))
    return out


def _c05_cuda_amp_api(device, deprecations, torch_version) -> dict:
    """05.cuda_amp_api: do the article's torch.cuda.amp calls warn?"""
    return dict(id="05.cuda_amp_api",
                verdict="outdated" if deprecations == 2 else "holds" if deprecations == 0 else "holds with nuance",
                evidence=(f"{deprecations} FutureWarning(s) from torch.cuda.amp.autocast()/GradScaler() on torch "
                          f"{torch_version}; torch.amp.autocast(device_type) and torch.amp.GradScaler(device_type) "
                          "run the same step (written out in the notebook)"),
                numbers={"future_warnings": deprecations}, regime=f"torch {torch_version}, {device}")


def _c05_accumulation_memory(device, accum, batch_size) -> dict:
    """05.accumulation_memory: one step's peak at k micro-batches against k=1."""
    ratio = accum[-1]["peak_mib"] / accum[0]["peak_mib"]
    acc_n = {"k": [r["k"] for r in accum], "peak_mib": [r["peak_mib"] for r in accum], "ratio": ratio,
             "max_grad_diff": max(r["max_grad_diff"] for r in accum), "batch": batch_size}
    return dict(id="05.accumulation_memory",
                verdict="wrong" if ratio < 0.9 else "holds" if ratio > 1.1 else "inconclusive",
                evidence=(f"one step over {batch_size} images: peak {accum[0]['peak_mib']:.1f} MiB at k=1, "
                          f"{accum[-1]['peak_mib']:.1f} MiB at k={accum[-1]['k']} (x{ratio:.2f}); same gradient "
                          f"within {acc_n['max_grad_diff']:.0e}"),
                numbers=acc_n,
                regime=f"Net, Adam, one optimizer step over {batch_size} images in k micro-batches, {device}")


def _c05_loss_leak(device, leak, leak_steps) -> dict:
    """05.loss_leak: what the summed loss's graph keeps."""
    tr_t, tr_i = leak["training loop, total += loss"], leak["training loop, total += loss.item()"]
    ev_t = leak["eval loop, total += loss"]
    leak_n = {"train_nodes": tr_t["graph_nodes_kept"], "train_item_nodes": tr_i["graph_nodes_kept"],
              "train_saved_mib": tr_t["saved_bytes_kept"] / MiB,
              "train_saved_mib_per_step": tr_t["saved_bytes_kept"] / MiB / leak_steps,
              "train_saved_freed": tr_t.get("saved_freed", 0), "loss_tensors_kept": tr_t.get("loss_tensors_kept", 0),
              "eval_nodes": ev_t["graph_nodes_kept"], "eval_saved_mib_per_step": ev_t["saved_bytes_kept"] / MiB / leak_steps,
              "steps": leak_steps, "meter_mib_per_step": {k: r["growth_per_step"] / MiB for k, r in leak.items()}}
    graphs_kept = leak_n["train_nodes"] > leak_n["train_item_nodes"]
    holds_memory = leak_n["train_saved_mib_per_step"] > 0.25 * max(leak_n["eval_saved_mib_per_step"], 1e-9)
    return dict(id="05.loss_leak",
                verdict=("holds" if graphs_kept and holds_memory else "holds with nuance" if graphs_kept
                         else "does not hold here"),
                evidence=(f"training loop, total += loss: {leak_n['loss_tensors_kept']} loss tensors and "
                          f"{leak_n['train_nodes']} grad_fn nodes kept after {leak_steps} steps "
                          f"({leak_n['train_item_nodes']} with .item()), holding "
                          f"{leak_n['train_saved_mib']:.2f} MiB of saved tensors (backward freed "
                          f"{leak_n['train_saved_freed']}); eval loop without no_grad: "
                          f"{leak_n['eval_saved_mib_per_step']:.1f} MiB of saved activations kept per batch"),
                numbers=leak_n,
                regime=(f"Net, batch 64, SGD, {leak_steps} steps per loop, each in a fresh process; what the "
                        f"summed loss's graph holds, counted by walking it (kept_by_graph), on {device}"))
