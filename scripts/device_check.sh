#!/usr/bin/env bash
# device_check.sh: every GPU-only measurement of the series in one run, for a machine with one NVIDIA GPU and
# no internet. Budget: <= 8 minutes in all (each section has its own timeout; a failed or timed-out section is
# recorded and the script moves on).
#
#   bash scripts/device_check.sh OUT_DIR                 # on the GPU machine (MNIST already in data/)
#   bash scripts/device_check.sh OUT_DIR --cpu-dry-run   # here: every section on the CPU, tiny sizes, gloo
#
# Writes into OUT_DIR (one JSON per section, manifest.json with each section's status and seconds, logs/):
#   machine.json         machine_info(), nvidia-smi, torch/CUDA/cuDNN/NCCL versions
#   speedrun_chain.json  the notebook-10 ladder on the GPU, one seed per step (article ... torch.compile, CUDA graphs)
#   time_to_accuracy.json  scripts/bench_time_to_accuracy.py: article vs fast, 10 seeds fast / 3 article
#   amp.json             mnist_helpers.lessons.l05_precision_memory.compare_precisions (fp32/bf16/fp16): speed and memory (if present)
#   loader.json          DataLoader with and without pin_memory, 0/2/4/8 workers, delivered to the GPU
#   allocator.json       mnist_helpers.lessons.l05_precision_memory allocator demos (fragmentation, empty_cache cost), if present,
#                        and the same training run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#   nccl.json            NCCL all_reduce on one node (world size 1: one GPU), latency and bus bandwidth per size
# Copy the JSON files into results/reference/ to make them the reference the notebooks show without a GPU.
set -u -o pipefail

usage() { echo "usage: bash scripts/device_check.sh OUT_DIR [--cpu-dry-run]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT=$1
DRY=0
[ "${2:-}" = "--cpu-dry-run" ] && DRY=1
[ $# -le 2 ] || usage
[ $# -eq 1 ] || [ "$DRY" = 1 ] || usage

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export MNIST_OFFLINE=1 DEVICE_CHECK_DRY=$DRY DEVICE_CHECK_OUT=$OUT
export PYTHONUNBUFFERED=1
START=$(date +%s)
MANIFEST="$OUT/manifest.tsv"
: > "$MANIFEST"

if [ "$DRY" = 0 ]; then
    if ! command -v nvidia-smi > /dev/null || ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
        echo "device_check: no usable NVIDIA GPU here (nvidia-smi or torch.cuda missing); for a test of this script" \
             "on a CPU run: bash scripts/device_check.sh $OUT --cpu-dry-run" >&2
        exit 1
    fi
fi
"$PY" -m mnist_helpers.data --check > /dev/null || { echo "device_check: MNIST missing or corrupt under data/" \
    "(no internet here): copy data/MNIST/raw from a machine that has it" >&2; exit 1; }

DRIVER=$(mktemp -d)/device_check_sections.py
trap 'rm -rf "$(dirname "$DRIVER")"' EXIT

# section NAME TIMEOUT_S: run one section of the Python driver below; record status and seconds, never stop.
section() {
    local name=$1 limit=$2 t0 rc
    if [ "$DRY" = 1 ]; then limit=900; fi  # a dry run tests code paths on a (possibly busy) CPU, not the budget
    t0=$(date +%s)
    echo "=== $name (limit ${limit}s, elapsed $(( t0 - START ))s)"
    timeout --kill-after=10 "$limit" "$PY" "$DRIVER" "$name" 2>&1 | tee "$OUT/logs/$name.log"
    rc=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$MANIFEST"
    [ "$rc" = 0 ] || echo "--- $name failed or timed out (rc $rc); continuing"
}

cat > "$DRIVER" <<'PYEOF'
"""The sections of device_check.sh; `python device_check_sections.py NAME` writes $DEVICE_CHECK_OUT/NAME.json."""
import json, os, subprocess, sys, time, traceback
from pathlib import Path

import torch

OUT = Path(os.environ["DEVICE_CHECK_OUT"])
DRY = os.environ.get("DEVICE_CHECK_DRY") == "1"
DEV = torch.device("cpu" if DRY else "cuda")


def save(name, payload):
    from mnist_helpers.resources import machine_info
    doc = {"section": name, "dry_run_on_cpu": DRY, "device": str(DEV), "torch": torch.__version__,
           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine_info(), **payload}
    (OUT / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str))


def guarded(label, fn, errors):
    """Run one measurement; a failure is recorded with its traceback, the section carries on."""
    try:
        return fn()
    except Exception as e:
        errors.append({"what": label, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]})
        print(f"  {label} failed: {type(e).__name__}: {e}", flush=True)
        return None


def machine():
    info = {}
    for cmd in (["nvidia-smi"], ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,power.limit,"
                                 "clocks.max.sm", "--format=csv"], ["nvidia-smi", "topo", "-m"]):
        try:
            info[" ".join(cmd[:2])] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        except Exception as e:
            info[" ".join(cmd[:2])] = f"unavailable: {e}"
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    if torch.cuda.is_available():
        versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        p = torch.cuda.get_device_properties(0)
        versions.update(gpu=p.name, sm=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2**30, 1),
                        multiprocessors=p.multi_processor_count, bf16=torch.cuda.is_bf16_supported())
    from mnist_helpers.lessons import l10_speedrun as speedrun
    peaks = {}
    for dt in (torch.float32, torch.bfloat16) + (() if DRY else (torch.float16,)):
        peaks[str(dt)] = speedrun.measure_peak_flops(DEV, dt, n=512 if DRY else 8192)
    if not DRY:
        torch.backends.cuda.matmul.allow_tf32 = True
        peaks["torch.float32 (tf32)"] = speedrun.measure_peak_flops(DEV, torch.float32, n=8192)
    save("machine", {"versions": versions, "tools": info, "matmul_peak_flops": peaks})


def speedrun_chain():
    from mnist_helpers.lessons import l10_speedrun as speedrun
    from mnist_helpers.models import build_model, flops_per_image
    errors, runs, skipped = [], [], {}
    kw = dict(device=DEV, subset=2048, test_subset=1000, num_epochs=0.5) if DRY else dict(device=DEV)
    for recipe in speedrun.chain(DEV):
        why = speedrun.skip_reason(recipe, DEV)
        if why:
            skipped[recipe.name] = why
            continue
        extra = dict(stop_when="first", num_epochs=2.0) if recipe.name in ("article", "tensors") and not DRY else {}
        if DRY:
            recipe = recipe.replace(num_workers=min(recipe.num_workers, 2))
        run = guarded(recipe.name, lambda: speedrun.time_to_accuracy(recipe, (0.99, 0.995), seed=0, **{**kw, **extra}),
                      errors)
        if run:
            run["flops_per_train_image"] = 3 * flops_per_image(build_model(recipe.model, recipe.width))
            run["recipe_def"] = recipe.to_dict()
            runs.append(run)
            print("  " + speedrun.run_line(run), flush=True)
        save("speedrun_chain", {"runs": runs, "skipped": skipped, "errors": errors,
                                "summary": speedrun.summarize(runs) if runs else []})


def time_to_accuracy():
    repo = Path(os.environ["PYTHONPATH"].split(":")[0])
    args = ["--quick"] if DRY else ["--seeds", "10", "--baseline-seeds", "3", "--device", "cuda",
                                    "--article-epochs", "2"]
    cmd = [sys.executable, str(repo / "scripts" / "bench_time_to_accuracy.py"), *args,
           "--out", str(OUT / "time_to_accuracy.json")]
    print("  " + " ".join(cmd), flush=True)
    sys.exit(subprocess.run(cmd).returncode)


def amp():
    errors, payload = [], {}
    try:
        from mnist_helpers.lessons import l05_precision_memory as amp_bench
    except ImportError as e:
        save("amp", {"skipped": f"mnist_helpers.lessons.l05_precision_memory not available: {e}"})
        return
    from mnist_helpers.data import load_mnist
    X, y, Xt, yt = load_mnist(device=DEV, subset=(1024, 500) if DRY else (16384, 10000))
    modes = [m for m in (("fp32", "bf16") if DRY else ("fp32", "bf16", "fp16+scaler", "bf16 channels_last"))
             if m in getattr(amp_bench, "MODES", {m: None})]
    for bs in ((128,) if DRY else (128, 512, 2048)):
        payload[f"batch_{bs}"] = guarded(f"compare_precisions batch {bs}", lambda: amp_bench.compare_precisions(
            modes, X=X, y=y, X_test=Xt, y_test=yt, model="net", batch_size=bs, device=DEV,
            repeats=2 if DRY else 5), errors)
    save("amp", {**payload, "errors": errors})


def loader():
    """The article's DataLoader feeding a GPU: pin_memory on/off x workers, images/s delivered to the device."""
    from mnist_helpers.data import mnist_datasets
    from torch.utils.data import DataLoader, Subset
    train, _ = mnist_datasets()
    if DRY:
        train = Subset(train, range(2048))
    rows = []
    for workers in ((0, 2) if DRY else (0, 2, 4, 8)):
        for pin in (False, True):
            dl = DataLoader(train, batch_size=128, shuffle=True, num_workers=workers, pin_memory=pin and not DRY,
                            persistent_workers=workers > 0)
            rates = []
            for epoch in range(2):  # epoch 0 starts the workers; epoch 1 is the steady state
                t0, n = time.perf_counter(), 0
                for i, (X, y) in enumerate(dl):
                    X = X.to(DEV, non_blocking=pin)
                    n += len(X)
                    if i >= (10 if DRY else 200):
                        break
                if DEV.type == "cuda":
                    torch.cuda.synchronize()
                rates.append(n / (time.perf_counter() - t0))
            rows.append({"num_workers": workers, "pin_memory": pin, "first_epoch_img_s": rates[0],
                         "steady_img_s": rates[1]})
            print(f"  workers {workers} pin {pin!s:>5}: {rates[1]:>10,.0f} img/s", flush=True)
    copy = {}
    x = torch.randn(512, 1, 28, 28)
    for pin in (False, True):
        src = x.pin_memory() if pin and not DRY else x
        for _ in range(3):
            src.to(DEV, non_blocking=pin)
        t0 = time.perf_counter()
        for _ in range(200):
            src.to(DEV, non_blocking=pin)
        if DEV.type == "cuda":
            torch.cuda.synchronize()
        copy[f"pinned={pin}"] = (time.perf_counter() - t0) / 200 * 1e6
    save("loader", {"rows": rows, "host_to_device_copy_us_per_512_batch": copy})


def allocator():
    errors, payload = [], {}
    try:
        from mnist_helpers.lessons import l05_precision_memory as memory
    except ImportError as e:
        memory = None
        payload["skipped_memory_module"] = str(e)
    if memory is not None and not DRY:
        payload["fragmentation"] = guarded("allocator_fragmentation", memory.allocator_fragmentation, errors)
        from mnist_helpers.memory import run_isolated
        payload["fragmentation_expandable"] = guarded("expandable_segments", lambda: run_isolated(
            "mnist_helpers.lessons.l05_precision_memory:allocator_fragmentation",
            env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, timeout=120), errors)
        payload["empty_cache_cost"] = guarded("empty_cache_cost", memory.empty_cache_cost, errors)
    # Always: allocated vs reserved around a few training steps of the article's Net.
    from mnist_helpers.models import Net
    model = Net().to(DEV)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    X, y = torch.randn(512, 1, 28, 28, device=DEV), torch.randint(0, 10, (512,), device=DEV)
    for _ in range(3):
        torch.nn.functional.nll_loss(model(X), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if DEV.type == "cuda":
        torch.cuda.synchronize()
        payload["after_3_steps"] = {"allocated_mib": torch.cuda.memory_allocated() / 2**20,
                                    "reserved_mib": torch.cuda.memory_reserved() / 2**20,
                                    "max_allocated_mib": torch.cuda.max_memory_allocated() / 2**20}
    save("allocator", {**payload, "errors": errors})


def nccl():
    """One node, one GPU: NCCL all_reduce at world size 1 in this process (latency floor, bus bandwidth is moot),
    then two ranks on the one GPU through the series' launcher: NCCL refuses that ('duplicate GPU'); we record
    the message as the demonstration of 'NCCL wants one GPU per process'. Dry run: gloo on the CPU."""
    import torch.distributed as dist
    from mnist_helpers.ports import free_port
    errors, payload = [], {}
    backend = "gloo" if DRY else "nccl"

    def world_one():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
        dist.init_process_group(backend, rank=0, world_size=1)
        rows = []
        try:
            for nbytes in ([4096, 2**20] if DRY else [4096, 2**16, 2**20, 2**24, 2**27]):
                t = torch.ones(nbytes // 4, device=DEV)
                for _ in range(3):
                    dist.all_reduce(t)
                times = []
                for _ in range(5):
                    if DEV.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(20):
                        dist.all_reduce(t)
                    if DEV.type == "cuda":
                        torch.cuda.synchronize()
                    times.append((time.perf_counter() - t0) / 20)
                times.sort()
                rows.append({"bytes": nbytes, "latency_us": times[len(times) // 2] * 1e6, "backend": backend})
                print(f"  all_reduce {nbytes:>12,} B: {rows[-1]['latency_us']:9.1f} us", flush=True)
        finally:
            dist.destroy_process_group()
        return rows

    payload["world_size_1"] = guarded("all_reduce world size 1", world_one, errors)
    if not DRY:
        try:
            from mnist_helpers.lessons import l07_scaling as comm_bench
            payload["two_ranks_one_gpu"] = guarded("2 ranks on 1 GPU", lambda: comm_bench.allreduce_sweep(
                [4096], world_sizes=[2], device="cuda", timeout=45), errors)
        except ImportError as e:
            payload["two_ranks_one_gpu"] = f"mnist_helpers.lessons.l07_scaling not available: {e}"
    save("nccl", {**payload, "errors": errors})


if __name__ == "__main__":
    globals()[sys.argv[1]]()
PYEOF

# Timeouts add up to 8 minutes at most (480 s), start-up included.
section machine 30
section speedrun_chain 150
section time_to_accuracy 120
section amp 60
section loader 45
section allocator 35
section nccl 40

"$PY" - "$MANIFEST" "$OUT/manifest.json" "$DRY" "$START" <<'PYEOF'
import json, sys, time
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
sections = [{"section": n, "returncode": int(rc), "ok": rc == "0", "seconds": int(s)} for n, rc, s in rows]
doc = {"script": "scripts/device_check.sh", "dry_run_on_cpu": sys.argv[3] == "1",
       "total_seconds": int(time.time()) - int(sys.argv[4]), "sections": sections}
json.dump(doc, open(sys.argv[2], "w"), indent=1)
print(f"device_check: {sum(s['ok'] for s in sections)}/{len(sections)} sections ok in {doc['total_seconds']} s; "
      f"JSON in {sys.argv[2].rsplit('/', 1)[0]}")
PYEOF
rm -f "$MANIFEST"
