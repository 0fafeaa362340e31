"""Exercises for the end of every notebook, with checks that give immediate, specific feedback (issue 11).

Every exercise is defined once, here: its prompt (markdown), the learner's starter cell (``...`` placeholders; the
check only runs once an answer is filled in, so an untouched notebook still runs top to bottom), and the solution
cell. ``scripts/build_exercises.py`` writes the starter cells into ``notebooks/NN_*.ipynb`` (cells marked with the
metadata key ``exercise``) and the solutions into ``notebooks/solutions/NN_solutions.ipynb`` from this one source,
and ``tests/test_exercises.py`` runs every solution through its check.

    from mnist_helpers.exercises import check_global_batch_size
    check_global_batch_size(4 * 32)      # prints what is right or wrong and why, returns a Feedback

A ``check_...`` function never raises on a wrong answer (a learner should read a hint, not a traceback): it
prints the feedback and returns a ``Feedback`` that is truthy only when the answer is right. ``answer_box(id)``
shows a text box and a Check button in JupyterLab (ipywidgets) and only the prompt's one-line question elsewhere.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Feedback:
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:  # what a cell shows if the learner leaves the call as the last line
        return ("✔ " if self.ok else "✘ ") + self.message


def _say(ok: bool, message: str) -> Feedback:
    fb = Feedback(ok, message)
    print(repr(fb))
    return fb


def _number(answer, what: str) -> float | None:
    if answer is ... or answer is None:
        return None
    if isinstance(answer, bool):
        return None
    try:
        import torch
        if isinstance(answer, torch.Tensor):
            answer = answer.item()
    except ImportError:  # pragma: no cover
        pass
    try:
        return float(answer)
    except (TypeError, ValueError):
        return None


def _not_a_number(answer, what: str) -> Feedback:
    return _say(False, f"expected a number for {what}, got {answer!r} ({type(answer).__name__}). "
                       "Replace the `...` with an expression such as `4 * 32`.")


def _close(a: float, b: float, rel: float = 0.01) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


# --------------------------------------------------------------------------------------------- 00 set-up and data
def check_global_batch_size(answer) -> Feedback:
    """00-1: global batch size for 4 processes with batch_size=32 each."""
    value, truth = _number(answer, "the global batch size"), 4 * 32
    if value is None:
        return _not_a_number(answer, "the global batch size")
    if value == truth:
        return _say(True, f"{truth:g} images per optimizer step: `batch_size` is per process and DDP averages the "
                          "gradients of all 4 processes, so one step sees 4 x 32. LR rules (notebook 04) use this number.")
    if value == 32:
        return _say(False, "32 is the per-process batch (`batch_size`). Each of the 4 processes takes its own 32 "
                           "images per step; how many does one optimizer step see in total?")
    if value == 8:
        return _say(False, "8 = 32 / 4 would be right if `batch_size` were the global batch split across processes, "
                           "but in this series (and in DDP) `batch_size` is per process. Multiply instead.")
    return _say(False, f"{value:g} is not it. Hint: global_batch_size = world_size x batch_size (x grad_accum, here 1).")


def check_steps_per_epoch(answer) -> Feedback:
    """00-2: optimizer steps in one epoch of 60,000 images, batch 128, drop_last=False, one process."""
    value, truth = _number(answer, "the number of steps"), math.ceil(60_000 / 128)
    if value is None:
        return _not_a_number(answer, "the number of steps")
    if value == truth:
        return _say(True, f"{truth} steps: 468 full batches of 128 and one last batch of {60_000 - 468 * 128} "
                          "images, because drop_last=False keeps the remainder (math.ceil).")
    if value == 60_000 // 128:
        return _say(False, f"{value:g} counts only the full batches (floor division). With drop_last=False the "
                           "remaining images still form one smaller last batch: round up (math.ceil).")
    if _close(value, 60_000 / 128):
        return _say(False, f"{value:g} is a fraction of a step; steps are whole. Round: up or down with drop_last=False?")
    return _say(False, f"{value:g} is not it. Hint: steps = number of batches = images / batch_size, rounded up.")


# --------------------------------------------------------------------------------------- 01 resource inspection
def check_threads_per_process(answer) -> Feedback:
    """01-1: torch threads per process for 4 processes on 8 usable cores without oversubscribing."""
    value, truth = _number(answer, "threads per process"), 8 // 4
    if value is None:
        return _not_a_number(answer, "threads per process")
    if value == truth:
        return _say(True, f"{truth} threads: 4 processes x {truth} threads = 8 busy cores and none shared. "
                          "torchrun itself sets OMP_NUM_THREADS=1 unless you set it, which would leave 4 cores idle.")
    if value == 8:
        return _say(False, "8 threads in each of 4 processes is 32 threads on 8 cores: they oversubscribe and "
                           "slow each other down. Share the cores out between the processes.")
    if value > truth:
        return _say(False, f"{value:g} x 4 processes = {value * 4:g} threads on 8 cores: oversubscribed. Divide the cores.")
    return _say(False, f"{value:g} x 4 = {value * 4:g} threads leaves cores idle. Hint: usable cores // processes.")


def check_num_workers_range(answer) -> Feedback:
    """01-2: the article's num_workers rule (1/4 to 1/2 of the cores) for a 16-core machine, as (low, high)."""
    truth = (16 // 4, 16 // 2)
    try:
        low, high = (int(x) for x in answer)
    except (TypeError, ValueError):
        return _say(False, f"expected a pair (low, high) such as (1, 2), got {answer!r}.")
    if (low, high) == truth:
        return _say(True, f"{truth}: a quarter to a half of 16 cores. It is only a starting point: notebook 03 "
                          "measures where the loader stops getting faster on this machine.")
    if (high, low) == truth:
        return _say(False, "right numbers, wrong order: write (low, high).")
    if (low, high) == (16 // 2, 16):
        return _say(False, f"({low}, {high}) is half to all of the cores; the rule says a quarter to a half.")
    return _say(False, f"({low}, {high}) is not it. Hint: 16 cores x 1/4 and 16 cores x 1/2.")


# ------------------------------------------------------------------------------------- 02 single-device baseline
def check_images_per_s(answer) -> Feedback:
    """02-1: throughput of an epoch of 60,000 images that took 12.5 s."""
    value, truth = _number(answer, "images/s"), 60_000 / 12.5
    if value is None:
        return _not_a_number(answer, "images/s")
    if _close(value, truth):
        return _say(True, f"{truth:,.0f} img/s = 60,000 images / 12.5 s. This is the number the `epoch N:` line of "
                          "section 1 prints, and the one to compare between configurations (accuracy aside).")
    if _close(value, 12.5 / 60_000):
        return _say(False, "that is seconds per image; invert it to get images per second.")
    return _say(False, f"{value:,.4g} is not it. Hint: images / seconds.")


CONFUSION = [[50, 2, 0],
             [3, 45, 2],
             [0, 1, 47]]  # rows: true class 0..2, columns: predicted class 0..2


def check_accuracy_from_confusion(answer) -> Feedback:
    """02-2: accuracy from the 3-class confusion matrix ``CONFUSION``."""
    value = _number(answer, "the accuracy")
    correct = sum(CONFUSION[i][i] for i in range(3))
    total = sum(map(sum, CONFUSION))
    truth = correct / total
    if value is None:
        return _not_a_number(answer, "the accuracy")
    if _close(value, truth, 1e-3):
        return _say(True, f"{truth:.4f}: the diagonal ({correct} correct) over all {total} images.")
    if _close(value, truth * 100, 1e-3):
        return _say(False, f"{value:g} is a percentage; give a fraction between 0 and 1.")
    if _close(value, 1 - truth, 1e-3):
        return _say(False, "that is the error rate: the off-diagonal share. Accuracy is the diagonal.")
    return _say(False, f"{value:g} is not it. Hint: sum(CONFUSION[i][i]) / sum of every entry.")


# -------------------------------------------------------------------------------------- 03 dataloader tuning
LOADER_TABLE = {0: 2_100, 1: 3_900, 2: 6_100, 4: 6_300, 8: 5_200}  # num_workers -> measured loader img/s


def check_pick_num_workers(answer) -> Feedback:
    """03-1: the smallest num_workers within 5% of the fastest in ``LOADER_TABLE``."""
    value = _number(answer, "num_workers")
    best = max(LOADER_TABLE.values())
    truth = min(n for n, r in LOADER_TABLE.items() if r >= 0.95 * best)
    if value is None:
        return _not_a_number(answer, "num_workers")
    if value == truth:
        return _say(True, f"num_workers={truth}: {LOADER_TABLE[truth]:,} img/s is within "
                          f"{1 - LOADER_TABLE[truth] / best:.1%} of the best ({best:,}) with half the worker processes "
                          "(each one is a process with its own memory).")
    if value not in LOADER_TABLE:
        return _say(False, f"{value:g} was not measured; pick one of {sorted(LOADER_TABLE)}.")
    rate = LOADER_TABLE[int(value)]
    if rate == best:
        return _say(False, f"{value:g} is the fastest, but the question asks for the smallest setting within 5% of it: "
                           "is a smaller num_workers already within 5%?")
    if rate < 0.95 * best:
        return _say(False, f"num_workers={value:g} gives {rate:,} img/s, {1 - rate / best:.0%} below the best. "
                           f"Hint: keep rows with rate >= 0.95 x {best:,}, then take the smallest num_workers.")
    return _say(False, f"{value:g} is within 5%, but is it the smallest such setting?")


def check_last_batch_size(answer) -> Feedback:
    """03-2: size of the last batch of 10,000 test images at batch 128, drop_last=False."""
    value, truth = _number(answer, "the last batch size"), 10_000 % 128
    if value is None:
        return _not_a_number(answer, "the last batch size")
    if value == truth:
        return _say(True, f"{truth} images: 78 full batches take 9,984, the remaining {truth} form the last batch. "
                          "With drop_last=True they would be skipped, which is fine for training, not for evaluation.")
    if value == 128:
        return _say(False, "only the full batches have 128 images; 10,000 is not a multiple of 128.")
    if value == 0:
        return _say(False, "0 would mean drop_last=True dropped it; here drop_last=False keeps the remainder.")
    return _say(False, f"{value:g} is not it. Hint: 10,000 % 128.")


# ---------------------------------------------------------------------------------- 04 batch size and LR
def check_linear_scaled_lr(answer) -> Feedback:
    """04-1: SGD lr 0.1 at batch 256, scaled linearly to batch 1024."""
    value, truth = _number(answer, "the learning rate"), 0.1 * 1024 / 256
    if value is None:
        return _not_a_number(answer, "the learning rate")
    if _close(value, truth):
        return _say(True, f"lr {truth:g}: 4x the batch, 4x the LR (Goyal et al. 2017), best with a few epochs of warm-up.")
    if _close(value, 0.1 * math.sqrt(1024 / 256)):
        return _say(False, "that is square-root scaling (often used for Adam). The linear rule for SGD multiplies "
                           "the LR by the batch ratio itself.")
    if _close(value, 0.1 * 256 / 1024):
        return _say(False, "you scaled the LR down; a bigger batch averages more gradients and takes fewer steps, "
                           "so the linear rule scales the LR *up*.")
    return _say(False, f"{value:g} is not it. Hint: lr_new = lr_base x batch_new / batch_base.")


def check_sqrt_scaled_lr(answer) -> Feedback:
    """04-2: Adam lr 1e-3 at batch 128, square-root scaled to batch 512."""
    value, truth = _number(answer, "the learning rate"), 1e-3 * math.sqrt(512 / 128)
    if value is None:
        return _not_a_number(answer, "the learning rate")
    if _close(value, truth):
        return _say(True, f"lr {truth:g}: 4x the batch, sqrt(4) = 2x the LR. Notebook 04 measures whether that "
                          "beats keeping Adam's LR fixed.")
    if _close(value, 1e-3 * 512 / 128):
        return _say(False, "that is linear scaling (4x). Square-root scaling multiplies by sqrt(batch ratio).")
    return _say(False, f"{value:g} is not it. Hint: 1e-3 x math.sqrt(512 / 128).")


# ------------------------------------------------------------------------- 05 mixed precision and memory
def check_grad_accum(answer) -> Feedback:
    """05-1: micro-batches per step for a global batch of 512 with 64 per micro-batch on 2 processes."""
    value, truth = _number(answer, "grad_accum"), 512 // (64 * 2)
    if value is None:
        return _not_a_number(answer, "grad_accum")
    if value == truth:
        return _say(True, f"grad_accum={truth}: 2 processes x 64 images x {truth} micro-batches = 512 per optimizer "
                          "step; wrap the first 3 backward passes in `no_sync()` to skip their all-reduce.")
    if value == 512 // 64:
        return _say(False, "that ignores the second process: both contribute 64 images per micro-batch.")
    return _say(False, f"{value:g} is not it. Hint: global = world_size x batch_size x grad_accum; solve for grad_accum.")


def check_adam_state_mib(answer) -> Feedback:
    """05-2: persistent fp32 memory (weights, gradients, Adam's two moments) of the article's Net, in MiB."""
    from mnist_helpers.models import Net, count_parameters

    value = _number(answer, "MiB")
    n = count_parameters(Net())
    truth = 4 * n * 4 / 2**20
    if value is None:
        return _not_a_number(answer, "MiB")
    if _close(value, truth):
        return _say(True, f"{truth:.1f} MiB = {n:,} parameters x 4 tensors (weights, grads, exp_avg, exp_avg_sq) x "
                          "4 bytes. AMP does not shrink it (the fp32 master weights stay); it shrinks activations.")
    if _close(value, n * 4 / 2**20):
        return _say(False, "that is the weights alone. Training also keeps a gradient and Adam's two moments "
                           "per parameter.")
    if _close(value, 3 * n * 4 / 2**20):
        return _say(False, "that counts three copies per parameter; Adam keeps two moments besides weights and grads.")
    if _close(value, truth * 2**20 / 1e6):
        return _say(False, "that is megabytes (10^6); MiB is 2**20 bytes.")
    return _say(False, f"{value:g} is not it. Hint: count_parameters(Net()) x 4 tensors x 4 bytes / 2**20.")


# ---------------------------------------------------------------------------------------- 06 DDP fundamentals
# The workers of exercises 06-1 and 06-2: short DDP scripts with one bug each. The learner fixes the text; the check
# writes it to a file and launches it with torchrun on 2 CPU processes (gloo), as notebook 06 launches train_ddp.py.
BUGGY_SAMPLER_WORKER = '''import argparse
import json

import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--out")
args = parser.parse_args()
dist.init_process_group("gloo")
dataset = list(range(100))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=10, sampler=sampler)
first_batches = []
for epoch in range(3):
    first_batches.append([int(i) for i in next(iter(loader))])  # this epoch's first batch
per_rank = [None] * dist.get_world_size()
dist.all_gather_object(per_rank, first_batches)
if dist.get_rank() == 0:
    json.dump(per_rank, open(args.out, "w"))
dist.barrier()
dist.destroy_process_group()
'''

BUGGY_LOCAL_RANK_WORKER = '''import argparse
import json

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)  # the old torch.distributed.launch contract
parser.add_argument("--out")
args = parser.parse_args()
dist.init_process_group("gloo")
device = f"cuda:{args.local_rank}"  # the GPU this process would train on
devices = [None] * dist.get_world_size()
dist.all_gather_object(devices, device)
if dist.get_rank() == 0:
    json.dump(devices, open(args.out, "w"))
dist.barrier()
dist.destroy_process_group()
'''

# The measurement behind exercise 06-3: DDP's all-reduce calls per step for Net, counted by a communication hook.
BUCKET_COUNTER_WORKER = '''import argparse
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.models import Net

parser = argparse.ArgumentParser()
parser.add_argument("--out")
args = parser.parse_args()
dist.init_process_group("gloo")
calls = []


def counting_allreduce(state, bucket):  # DDP calls its hook once per bucket of gradients
    calls.append(bucket.buffer().numel())
    work = dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


result = {}
for cap in (25, 1):  # bucket_cap_mb: 25 is DDP's default
    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=cap)
    model.register_comm_hook(None, counting_allreduce)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):  # DDP settles its buckets after the first step: count the last one
        calls.clear()
        model(torch.randn(8, 1, 28, 28)).sum().backward()
        opt.step()
        opt.zero_grad()
    result[cap] = list(calls)
    del model  # release DDP's hold on the process group before leaving it
if dist.get_rank() == 0:
    json.dump(result, open(args.out, "w"))
dist.barrier()
dist.destroy_process_group()
'''


# 07-3: the starter the learner completes and a solution, as real files (mnist_helpers/workers/exercises/)
_EXERCISE_SCRIPTS = Path(__file__).resolve().parent / "workers" / "exercises"
FT_STARTER, FT_SOLUTION = str(_EXERCISE_SCRIPTS / "ft_starter.py"), str(_EXERCISE_SCRIPTS / "ft_solution.py")

def _launch_script(text: str, nproc: int = 2):
    """Run a worker's text under torchrun on ``nproc`` CPU processes; (its JSON, None) or (None, the error)."""
    import tempfile
    from pathlib import Path

    from mnist_helpers.launch import LaunchError, torchrun

    with tempfile.TemporaryDirectory(prefix="mnist_exercise_") as tmp:
        script = Path(tmp) / "worker.py"
        script.write_text(text)
        try:
            return torchrun(str(script), nproc=nproc, device="cpu", echo=False, timeout=180, provision=False,
                            threads_per_proc=1), None
        except LaunchError as e:
            return None, e.root_cause or str(e)


def _script_text(answer) -> str | None:
    """The learner's script: its text, or the path of a file holding it."""
    from pathlib import Path

    if not isinstance(answer, (str, Path)):
        return None
    text = str(answer)
    if "\n" not in text and text.endswith(".py") and Path(text).is_file():
        return Path(text).read_text()
    return text


def check_set_epoch_fix(answer) -> Feedback:
    """06-1: ``BUGGY_SAMPLER_WORKER`` fixed so that every epoch is shuffled anew; launched on 2 processes."""
    text = _script_text(answer)
    if text is None:
        return _say(False, f"expected the fixed script as a string (or a path to it), got {type(answer).__name__}.")
    got, error = _launch_script(text)
    if error is not None:
        return _say(False, f"the script failed under torchrun with 2 processes:\n{error}")
    if not isinstance(got, list) or len(got) != 2:
        return _say(False, "the script ran but did not write each rank's first batches to --out (keep the last lines).")
    same_epochs = [r for r, epochs in enumerate(got) if len({tuple(e) for e in epochs}) < len(epochs)]
    overlap = any(set(got[0][e]) & set(got[1][e]) for e in range(len(got[0])))
    if same_epochs:
        hint = ("set_epoch(epoch) must be called with the loop's epoch, before the epoch's first batch"
                if "set_epoch" in text else "which sampler call changes its shuffle from one epoch to the next?")
        return _say(False, f"rank(s) {same_epochs} still began two epochs with the same batch: {got[same_epochs[0]]}. "
                           + hint)
    if overlap:
        return _say(False, "every epoch now differs, but the two ranks drew the same images: each rank must keep "
                           "its own DistributedSampler shard.")
    return _say(True, f"launched on 2 processes: each rank began its 3 epochs with different batches (rank 0: "
                      f"{[e[:3] for e in got[0]]}...) and the ranks never overlapped. The sampler shuffles with "
                      "seed + epoch, so without set_epoch every epoch replays epoch 0's order.")


def check_local_rank_fix(answer) -> Feedback:
    """06-2: ``BUGGY_LOCAL_RANK_WORKER`` fixed to read torchrun's LOCAL_RANK; launched on 2 processes."""
    text = _script_text(answer)
    if text is None:
        return _say(False, f"expected the fixed script as a string (or a path to it), got {type(answer).__name__}.")
    got, error = _launch_script(text)
    if error is not None:
        return _say(False, f"the script failed under torchrun with 2 processes:\n{error}")
    if got == ["cuda:0", "cuda:1"]:
        return _say(True, "launched on 2 processes: rank 0 picks cuda:0 and rank 1 cuda:1. torchrun puts LOCAL_RANK "
                          "in each process's environment and passes no --local_rank argument, so the argparse "
                          "default 0 put both on GPU 0.")
    if got == ["cuda:0", "cuda:0"]:
        return _say(False, "both processes still pick cuda:0: torchrun never passes --local_rank, so the argparse "
                           "default is used. Read the environment: int(os.environ[\"LOCAL_RANK\"]).")
    return _say(False, f"the processes picked {got}; expected ['cuda:0', 'cuda:1'] (one GPU per process on a node).")


def check_bucket_prediction(answer) -> Feedback:
    """06-3: predict DDP's all-reduce calls per step for Net at bucket_cap_mb 25 and 1, then measure them."""
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in answer)):
        return _say(False, f"expected a pair of whole numbers (calls at 25 MB, calls at 1 MB), got {answer!r}.")
    got, error = _launch_script(BUCKET_COUNTER_WORKER)
    if error is not None:
        return _say(False, f"the measurement itself failed (not your answer):\n{error}")
    calls = {int(k): v for k, v in got.items()}
    measured = (len(calls[25]), len(calls[1]))
    sizes = {cap: ", ".join(f"{n * 4 / 2**20:.2f}" for n in v) for cap, v in calls.items()}
    why = (f"Measured on 2 processes: {measured[0]} call(s) per step at 25 MB (bucket sizes {sizes[25]} MiB) and "
           f"{measured[1]} at 1 MB ({sizes[1]} MiB). DDP packs gradients into buckets of bucket_cap_mb and "
           "all-reduces a bucket as soon as all its gradients are ready; a tensor larger than the cap "
           "(fc1.weight, 4.5 MiB) closes its bucket at once, so at 1 MB the rest form a second one. Fewer, larger "
           "calls cost less latency; smaller ones start communicating earlier in backward().")
    return _say(tuple(answer) == measured, ("right. " if tuple(answer) == measured else
                                            f"you predicted {tuple(answer)}. ") + why)


# -------------------------------------------------------------------------------- 07 scaling and multi-node
def check_scaling_efficiency(answer) -> Feedback:
    """07-1: weak-scaling efficiency of 4 processes at 3,200 img/s against 1 process at 1,000 img/s."""
    value, truth = _number(answer, "the efficiency"), 3_200 / (4 * 1_000)
    if value is None:
        return _not_a_number(answer, "the efficiency")
    if _close(value, truth):
        return _say(True, f"{truth:.0%}: a 3.2x speedup out of an ideal 4x; the rest is communication and waiting.")
    if _close(value, 3.2):
        return _say(False, "3.2 is the speedup. Efficiency divides it by the number of processes.")
    if _close(value, truth * 100):
        return _say(False, "give a fraction (0.5 for 50%), not a percentage.")
    return _say(False, f"{value:g} is not it. Hint: speedup / processes = (3,200 / 1,000) / 4.")


def check_ring_allreduce_mb(answer) -> Feedback:
    """07-2: MB each rank sends in a ring all-reduce of 100 MB on 4 ranks."""
    value, truth = _number(answer, "MB"), 2 * (4 - 1) / 4 * 100
    if value is None:
        return _not_a_number(answer, "MB")
    if _close(value, truth):
        return _say(True, f"{truth:g} MB: 2(N-1)/N x 100 MB; it tends to 2x the message as N grows, so the volume "
                          "per rank hardly grows with N (the article says it grows linearly: notebook 07 checks it).")
    if _close(value, (4 - 1) / 4 * 100):
        return _say(False, "that is one phase; a ring all-reduce has two (reduce-scatter, then all-gather).")
    if _close(value, 400) or _close(value, 300):
        return _say(False, "that grows linearly with N; in a ring each rank sends only a 1/N chunk per step.")
    return _say(False, f"{value:g} is not it. Hint: 2 x (N - 1) / N x size.")


def _snapshot_contents(path) -> dict:
    """What a learner's snapshot holds, whatever its keys are called: an optimizer's state dict, torch's RNG state."""
    import torch

    found = {"optimizer": False, "rng": False}

    def walk(v):
        if isinstance(v, dict):
            if {"state", "param_groups"} <= set(v):
                found["optimizer"] = True
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.numel() >= 5000:
            found["rng"] = True  # torch.get_rng_state(): 5,056 bytes

    walk(torch.load(path, map_location="cpu", weights_only=False))
    return found


def _kill_and_resume(text: str) -> tuple[dict | None, str | None]:
    """Launch the learner's script on 2 CPU processes twice: uninterrupted, then with rank 1 killed (SIGKILL) once the
    first snapshot exists, under ``--max-restarts 1``. ({"ref", "killed", "kill", "snapshot"}, None) or (None, error)."""
    import tempfile
    from pathlib import Path

    from mnist_helpers.launch import LaunchError, torchrun
    from mnist_helpers.launch import kill_rank_when

    args = ["--epochs", 2, "--subset", 512, "--test-images", 500, "--batch-size", 32, "--snapshot-every", 3,
            "--device", "cpu"]
    with tempfile.TemporaryDirectory(prefix="mnist_exercise_") as tmp:
        script, ref_snap, killed_snap = Path(tmp) / "ft_exercise.py", Path(tmp) / "ref.pt", Path(tmp) / "killed.pt"
        script.write_text(text)
        kw = dict(nproc=2, device="cpu", echo=False, timeout=240, provision=False, threads_per_proc=1)
        try:
            ref = torchrun(str(script), [*args, "--snapshot", ref_snap], **kw)
            if not ref_snap.is_file():
                return {"ref": ref, "snapshot": None}, None
            snapshot = _snapshot_contents(ref_snap)
            thread, kill = kill_rank_when(killed_snap, script.name, rank=1, timeout=120)
            killed = torchrun(str(script), [*args, "--snapshot", killed_snap], max_restarts=1, **kw)
            thread.join(timeout=10)
        except LaunchError as e:
            return None, e.root_cause or str(e)
    return {"ref": ref, "killed": killed, "kill": kill, "snapshot": snapshot}, None


def check_snapshot_resume(answer) -> Feedback:
    """07-3: snapshot and resume written into ``ft_starter.py``; launched, killed, resumed, compared."""
    text = _script_text(answer)
    if text is None:
        return _say(False, f"expected the path of your script (\"work/ft_exercise.py\"), got {type(answer).__name__}.")
    runs, error = _kill_and_resume(text)
    if error is not None:
        return _say(False, f"your script failed under torchrun with 2 processes:\n{error}")
    if runs["snapshot"] is None:
        return _say(False, "the uninterrupted run wrote no snapshot at --snapshot: save_snapshot() must write the file "
                           "(rank 0, every --snapshot-every steps).")
    ref, killed, kill = runs["ref"], runs["killed"], runs["kill"]
    if "error" in kill or not killed.get("restarts"):
        return _say(False, f"no rank was killed ({kill.get('error', 'torchrun did not restart')}), so nothing was "
                           "resumed: run the check again (a busy machine can end the run before the kill).")
    if not killed.get("resumed_at_step"):
        return _say(False, "the resumed run started from step 0: did you load the snapshot before training (and take "
                           "start_epoch and start_step from it)?")
    if killed["digest"] != ref["digest"]:
        if not runs["snapshot"]["optimizer"]:
            return _say(False, f"resumed at step {killed['resumed_at_step']} but with other final weights: the "
                               "snapshot holds no optimizer state (optimizer.state_dict()), so Adam's moments "
                               "started again from zero.")
        if not runs["snapshot"]["rng"]:
            return _say(False, f"resumed at step {killed['resumed_at_step']} but with other final weights: the "
                               "snapshot holds no RNG state (torch.get_rng_state()), so dropout drew other masks.")
        return _say(False, f"resumed at step {killed['resumed_at_step']} but ended with other weights "
                           f"({killed['digest']}, uninterrupted {ref['digest']}): did you skip the batches of the epoch "
                           "already trained, and restore the RNG states after skipping them?")
    if "os.replace" not in text and "os.rename" not in text:
        return _say(False, "the resumed run ends with the uninterrupted run's weights, but the snapshot is written in "
                           "place: a kill during torch.save leaves a torn file. Save to a temporary file, then "
                           "os.replace it.")
    return _say(True, f"rank 1 was killed, torchrun restarted the group, and your script resumed at step "
                      f"{killed['resumed_at_step']} of {killed['steps']} and ended with the uninterrupted run's weights "
                      f"(digest {ref['digest']}) and accuracy ({ref['correct'] / ref['count']:.2%}): the snapshot "
                      "held everything the next step depends on.")


# ---------------------------------------------------------------------------------------- 08 troubleshooting
def check_free_port(answer) -> Feedback:
    """08-1: a TCP port that is free right now (for MASTER_PORT / --master-port)."""
    import socket

    value = _number(answer, "a port")
    if value is None or value != int(value):
        return _not_a_number(answer, "a port")
    port = int(value)
    if not 1024 <= port <= 65535:
        return _say(False, f"{port} is outside 1024-65535 (ports below 1024 need root).")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return _say(False, f"port {port} is taken right now ({e.strerror}): that is exactly `Address already in "
                               "use`. Ask `free_port()` for one instead of guessing.")
    return _say(True, f"port {port} is free (bound and released just now). Pass it as `--master-port {port}` or "
                      f"MASTER_PORT={port}; `mnist_helpers.launch.torchrun` does this for you.")


def check_detached_total(answer) -> Feedback:
    """08-2: a running loss total that keeps no autograd graph alive."""
    try:
        import torch
        if isinstance(answer, torch.Tensor):
            if answer.requires_grad or answer.grad_fn is not None:
                return _say(False, "the total is a tensor that still requires grad: every `total += loss` chains "
                                   "another step's graph onto it, and memory grows each step. Add `loss.item()`.")
            return _say(False, "a detached tensor no longer holds the graph, but it still lives on the device and "
                               "syncs lazily; `loss.item()` gives a plain Python float.")
    except ImportError:  # pragma: no cover
        pass
    if answer is ... or not isinstance(answer, float):
        return _say(False, f"expected a Python float, got {type(answer).__name__}. Hint: `total += loss.item()`.")
    if not answer > 0:
        return _say(False, f"the total is {answer}; a sum of cross-entropy losses is positive. Did the loop run?")
    return _say(True, f"a plain float ({answer:.4f}): `.item()` copies the number out and lets each step's graph be "
                      "freed. With `total += loss` memory grows every step until out of memory.")


# ----------------------------------------------------------------------------- 09 profiling and autotune
STEP_PROFILE_MS = {"data": 12.0, "forward": 9.0, "backward": 17.0, "all-reduce": 8.0, "optimizer": 4.0}


def check_data_wait_share(answer) -> Feedback:
    """09-1: fraction of a step spent waiting for data in ``STEP_PROFILE_MS``."""
    value = _number(answer, "the share")
    truth = STEP_PROFILE_MS["data"] / sum(STEP_PROFILE_MS.values())
    if value is None:
        return _not_a_number(answer, "the share")
    if _close(value, truth):
        return _say(True, f"{truth:.0%} of the step waits for data: enough to try in-memory tensors or more "
                          "workers before touching the model (the article's priority 1).")
    if _close(value, truth * 100):
        return _say(False, "give a fraction (0.5 for 50%), not a percentage.")
    if _close(value, STEP_PROFILE_MS["data"] / (sum(STEP_PROFILE_MS.values()) - STEP_PROFILE_MS["data"])):
        return _say(False, "you divided by the rest of the step; divide by the whole step (data included).")
    return _say(False, f"{value:g} is not it. Hint: data / sum of every phase.")


TUNING_PRIORITY = ["batch_size_and_workers", "lr_and_optimizer", "amp_and_accumulation", "distribution"]


def check_tuning_priority(answer) -> Feedback:
    """09-2: the article's tuning order, as a list of the four names in ``TUNING_PRIORITY`` (shuffled in the prompt)."""
    try:
        order = [str(x) for x in answer]
    except TypeError:
        return _say(False, f"expected a list of the four names, got {answer!r}.")
    if sorted(order) != sorted(TUNING_PRIORITY):
        missing = sorted(set(TUNING_PRIORITY) - set(order))
        return _say(False, f"use each of the four names exactly once; missing: {missing}.")
    if order == TUNING_PRIORITY:
        return _say(True, "batch size & workers, then LR & optimizer, then AMP & accumulation, then distribution: "
                          "cheapest levers first. Notebook 09 measures each lever's gain in time to accuracy; the "
                          "order of effort is the article's advice, which a measurement of gains does not judge.")
    first = next(i for i, (a, b) in enumerate(zip(order, TUNING_PRIORITY)) if a != b)
    return _say(False, f"position {first + 1} is wrong ({order[first]!r}). Hint: the article starts with what feeds "
                       "the device and ends with adding devices.")


# ------------------------------------------------------------------------------------------ 10 speedrun
EVAL_LOG = [(100, 2.0, 0.950), (200, 4.1, 0.982), (300, 6.0, 0.9905), (400, 8.2, 0.9921)]  # step, train s, acc


def check_time_to_accuracy(answer) -> Feedback:
    """10-1: training seconds until test accuracy first reaches 99% in ``EVAL_LOG``."""
    value = _number(answer, "seconds")
    truth = next(t for _, t, acc in EVAL_LOG if acc >= 0.99)
    if value is None:
        return _not_a_number(answer, "seconds")
    if _close(value, truth):
        return _say(True, f"{truth} s: the first evaluation at >= 99% (step 300). Evaluation time is kept out of "
                          "it, and the step interval bounds its resolution.")
    if _close(value, 300):
        return _say(False, "300 is the step; the question asks for training seconds.")
    if _close(value, EVAL_LOG[-1][1]):
        return _say(False, "that is the end of the run; time-to-accuracy stops at the *first* evaluation >= 99%.")
    return _say(False, f"{value:g} is not it. Hint: the first row whose accuracy is >= 0.99.")


def check_flops_bound(answer) -> Feedback:
    """10-2: upper bound on training images/s for FastNet at 1 TFLOP/s (training ~ 3x the forward FLOPs, Kaplan et
    al. 2020's 6N-vs-2N approximation)."""
    from mnist_helpers.models import FastNet, flops_per_image

    value = _number(answer, "images/s")
    truth = 1e12 / (3 * flops_per_image(FastNet()))
    if value is None:
        return _not_a_number(answer, "images/s")
    if _close(value, truth):
        return _say(True, f"{truth:,.0f} img/s at best: compare it with the measured rate in notebook 10 to see how "
                          "far from the machine's limit each recipe is.")
    if _close(value, 3 * truth):
        return _say(False, "that counts the forward pass only; backward costs about twice the forward.")
    return _say(False, f"{value:,.4g} is not it. Hint: 1e12 / (3 * flops_per_image(FastNet())).")


# ---------------------------------------------------------------------------------- 11 beyond data parallel
def check_zero3_state_mib(answer) -> Feedback:
    """11-1: MiB of parameters + gradients + AdamW state per rank for ResMLP(1024, 4) under FSDP2 on 4 ranks."""
    value = _number(answer, "MiB")
    n = 34_389_002  # ResMLP(width=1024, blocks=4): mnist_helpers.lessons.l11_beyond_dp.n_params(1024, 4)
    truth = 16 * n / 4 / 2**20
    if value is None:
        return _not_a_number(answer, "MiB")
    if _close(value, truth):
        return _say(True, f"{truth:,.1f} MiB: 4 bytes each for the weight, its gradient and AdamW's two moments, "
                          "16 bytes per parameter, and FSDP2 shards all four across the 4 ranks. DDP would hold "
                          f"{16 * n / 2**20:,.0f} MiB on every rank.")
    if _close(value, 16 * n / 2**20):
        return _say(False, "that is what DDP keeps on every rank. FSDP2 shards parameters, gradients and optimizer "
                           "state: each rank holds a quarter.")
    if _close(value, (8 * n + 8 * n / 4) / 2**20):
        return _say(False, "that is ZeRO-1: only the optimizer state sharded. FSDP2 (ZeRO-3) shards the weights and "
                           "gradients too.")
    if _close(value, 12 * n / 4 / 2**20) or _close(value, 8 * n / 4 / 2**20):
        return _say(False, "count again per parameter: the weight, its gradient, and AdamW's exp_avg and "
                           "exp_avg_sq, 4 bytes each.")
    return _say(False, f"{value:,.4g} is not it. Hint: 34,389,002 parameters x 16 bytes / 4 ranks / 2**20.")


def check_colwise_local_shape(answer) -> Feedback:
    """11-2: the local weight shape on each rank of nn.Linear(1024, 4096) under ColwiseParallel on 4 ranks."""
    if answer is ... or answer is None:
        return _say(False, "Replace the `...` with a pair such as `(rows, cols)`.")
    try:
        shape = tuple(int(v) for v in answer)
    except (TypeError, ValueError):
        return _say(False, f"expected a pair of ints (rows, cols), got {answer!r}. Replace the `...` with a tuple.")
    if shape == (1024, 1024):
        return _say(True, "(1024, 1024): nn.Linear stores its weight as (out_features, in_features) = (4096, 1024); "
                          "ColwiseParallel shards the output features, dim 0 (Shard(0)), so each rank computes 1,024 "
                          "of the 4,096 outputs from the full input.")
    if shape == (4096, 256):
        return _say(False, "that splits the input features (dim 1, Shard(1)): that is RowwiseParallel. Colwise "
                           "splits the outputs.")
    if shape == (4096, 1024):
        return _say(False, "that is the whole weight; with 4 ranks each holds a quarter of it.")
    if shape in ((256, 4096), (1024, 4096)):
        return _say(False, "nn.Linear's weight is (out_features, in_features), not (in, out): start from "
                           "(4096, 1024).")
    return _say(False, f"{shape} is not it. Hint: weight (out_features, in_features); Colwise shards dim 0 over 4 ranks.")


# ----------------------------------------------------------------------------------------------- the source
@dataclass(frozen=True)
class Exercise:
    id: str          # "NN-k": notebook NN, k-th exercise
    title: str
    prompt: str      # markdown
    starter: str     # code with `...` placeholders; runs without error as given
    solution: str    # code; passes its check
    check_name: str  # the check_... function in this module

    @property
    def notebook(self) -> str:
        return self.id.split("-")[0]

    @property
    def check(self) -> Callable:
        return globals()[self.check_name]


def _ex(id, title, prompt, check, starter_body, solution_body, extra_import=""):
    """Starter and solution share one import line and one check call, so they cannot drift apart."""
    names = check + extra_import
    box = ", answer_box" if "answer_box(" in starter_body else ""
    starter = (f"from mnist_helpers.exercises import {names}{box}\n\n" + starter_body.strip("\n")
               + f"\nif answer is not ...:  # runs once you have filled in your answer\n    {check}(answer)")
    solution = f"from mnist_helpers.exercises import {names}\n\n" + solution_body.strip("\n") + f"\nassert {check}(answer)"
    return Exercise(id, title, prompt.strip("\n"), starter, solution, check)


EXERCISES: list[Exercise] = [
    _ex("00-1", "The global batch size",
        "Four processes each train with `batch_size=32` (one micro-batch per step). "
        "How many images does **one optimizer step** see? Or type it in the box and press *Check*.",
        "check_global_batch_size", "answer = ...  # an int, e.g. world_size * batch_size\nanswer_box(\"00-1\")",
        "answer = 4 * 32  # batch_size is per process"),
    _ex("00-2", "Steps per epoch",
        "One process, 60,000 training images, `batch_size=128`, `drop_last=False`: how many optimizer steps make one "
        "epoch? Compute it with Python (`math` is your friend).",
        "check_steps_per_epoch", "import math\n\nanswer = ...  # steps in one epoch",
        "import math\n\nanswer = math.ceil(60_000 / 128)"),
    _ex("01-1", "Threads per process",
        "A machine has 8 usable cores and you launch 4 processes with torchrun. What should `torch.set_num_threads()` "
        "(or `OMP_NUM_THREADS`) be in each process so that no core is shared and none is idle?",
        "check_threads_per_process", "answer = ...  # threads per process",
        "cores, processes = 8, 4\nanswer = cores // processes"),
    _ex("01-2", "The article's num_workers rule",
        "The article suggests `num_workers` of *a quarter to a half of the CPU cores*. Give the range for a 16-core "
        "machine as a pair `(low, high)`.",
        "check_num_workers_range", "answer = ...  # (low, high)",
        "cores = 16\nanswer = (cores // 4, cores // 2)"),
    _ex("02-1", "Images per second",
        "An epoch over 60,000 images took 12.5 s of training. What throughput (images/s) does the training loop of "
        "section 1 print on its `epoch N:` line?",
        "check_images_per_s", "answer = ...  # images per second", "answer = 60_000 / 12.5"),
    _ex("02-2", "Accuracy from a confusion matrix",
        "`CONFUSION` (in `mnist_helpers.exercises`) is a 3-class confusion matrix: rows are the true class, columns "
        "the predicted one. Compute the accuracy as a fraction with code, not by hand.",
        "check_accuracy_from_confusion", "print(CONFUSION)\nanswer = ...  # a fraction between 0 and 1",
        "correct = sum(CONFUSION[i][i] for i in range(len(CONFUSION)))\n"
        "answer = correct / sum(sum(row) for row in CONFUSION)", extra_import=", CONFUSION"),
    _ex("03-1", "Pick num_workers from a measured table",
        "`LOADER_TABLE` maps `num_workers` to a measured loader throughput (img/s). Each worker is a process with its "
        "own memory, so pick the **smallest** `num_workers` within 5% of the fastest. Compute it from the table.",
        "check_pick_num_workers", "print(LOADER_TABLE)\nanswer = ...  # a num_workers from the table",
        "best = max(LOADER_TABLE.values())\n"
        "answer = min(n for n, rate in LOADER_TABLE.items() if rate >= 0.95 * best)", extra_import=", LOADER_TABLE"),
    _ex("03-2", "The last batch",
        "Evaluating 10,000 test images with `batch_size=128` and `drop_last=False`: how many images are in the last "
        "batch?",
        "check_last_batch_size", "answer = ...  # images in the last batch", "answer = 10_000 % 128"),
    _ex("04-1", "The linear scaling rule",
        "SGD trains well with `lr=0.1` at a global batch of 256. By the linear scaling rule, what LR goes with a global "
        "batch of 1024?",
        "check_linear_scaled_lr", "answer = ...  # the new learning rate", "answer = 0.1 * 1024 / 256"),
    _ex("04-2", "Square-root scaling for Adam",
        "Adam trains well with `lr=1e-3` at batch 128. With square-root scaling, what LR goes with batch 512?",
        "check_sqrt_scaled_lr", "import math\n\nanswer = ...  # the new learning rate",
        "import math\n\nanswer = 1e-3 * math.sqrt(512 / 128)"),
    _ex("05-1", "Gradient accumulation",
        "You want a global batch of 512, only 64 images fit in memory per micro-batch, and you run 2 processes. "
        "What `grad_accum` (micro-batches per optimizer step) do you need?",
        "check_grad_accum", "answer = ...  # micro-batches per step",
        "global_batch, batch_size, world_size = 512, 64, 2\nanswer = global_batch // (batch_size * world_size)"),
    _ex("05-2", "Persistent memory of Adam",
        "How many MiB do the article's `Net`'s weights, gradients and Adam's two moments take in fp32? Count the "
        "parameters with `mnist_helpers.models.count_parameters`.",
        "check_adam_state_mib",
        "from mnist_helpers.models import Net, count_parameters\n\nanswer = ...  # MiB (2**20 bytes)",
        "from mnist_helpers.models import Net, count_parameters\n\n"
        "answer = count_parameters(Net()) * 4 * 4 / 2**20  # 4 tensors x 4 bytes per parameter"),
    _ex("06-1", "Fix a DDP worker: the same order every epoch",
        "`BUGGY_SAMPLER_WORKER` (print it) is a complete DDP script whose ranks draw the same first batch in every "
        "epoch. Fix its text so that every epoch is shuffled anew; the check launches your script with torchrun on "
        "2 processes and compares each rank's first batches.",
        "check_set_epoch_fix",
        "print(BUGGY_SAMPLER_WORKER)\nanswer = ...  # the fixed script, e.g. BUGGY_SAMPLER_WORKER.replace(old, new)",
        "answer = BUGGY_SAMPLER_WORKER.replace(\"for epoch in range(3):\\n\",\n"
        "                                      \"for epoch in range(3):\\n    sampler.set_epoch(epoch)\\n\")",
        extra_import=", BUGGY_SAMPLER_WORKER"),
    _ex("06-2", "Fix a DDP worker: both processes on GPU 0",
        "`BUGGY_LOCAL_RANK_WORKER` reads its GPU index the article's way, from an argparse `--local_rank`. Under "
        "torchrun both processes pick `cuda:0`. Fix the text (no GPU is needed: the script only names the device); "
        "the check launches it on 2 processes.",
        "check_local_rank_fix",
        "print(BUGGY_LOCAL_RANK_WORKER)\nanswer = ...  # the fixed script",
        "answer = BUGGY_LOCAL_RANK_WORKER.replace(\"import json\\n\", \"import json\\nimport os\\n\").replace(\n"
        "    'device = f\"cuda:{args.local_rank}\"', 'device = f\"cuda:{int(os.environ[\\'LOCAL_RANK\\'])}\"')",
        extra_import=", BUGGY_LOCAL_RANK_WORKER"),
    _ex("06-3", "Predict, then measure: all-reduce calls per step",
        "DDP does not all-reduce each of `Net`'s 8 parameter tensors separately. **Before running anything**, "
        "predict how many all-reduce calls one training step makes with DDP's default `bucket_cap_mb=25`, and with "
        "`bucket_cap_mb=1`. `Net` has 1,199,882 parameters (4.6 MiB of fp32 gradients), 1,179,648 of them in "
        "`fc1.weight`. Answer as a pair; the check then counts the calls on 2 processes with a communication hook.",
        "check_bucket_prediction", "answer = ...  # (calls at 25 MB, calls at 1 MB), e.g. (8, 8)",
        "answer = (1, 2)  # 4.6 MiB fit one 25 MB bucket; at 1 MB fc1.weight closes a bucket, the rest form another"),
    _ex("07-1", "Scaling efficiency",
        "1 process trains at 1,000 img/s; 4 processes (same batch per process) at 3,200 img/s together. "
        "What is the scaling efficiency, as a fraction?",
        "check_scaling_efficiency", "answer = ...  # a fraction", "speedup = 3_200 / 1_000\nanswer = speedup / 4"),
    _ex("07-2", "Ring all-reduce volume",
        "In a ring all-reduce of a 100 MB gradient over 4 ranks, how many MB does each rank send?",
        "check_ring_allreduce_mb", "answer = ...  # MB sent per rank", "N, size = 4, 100\nanswer = 2 * (N - 1) / N * size"),
    _ex("07-3", "Add snapshot and resume to a DDP script",
        "`FT_STARTER` is a DDP script (06's, with a learning-rate schedule) that saves nothing and never resumes. The "
        "cell copies it to `work/ft_exercise.py`; open that file and fill in its TODOs: `save_snapshot()` (rank 0, "
        "atomically: a temporary file, then `os.replace`), `load_snapshot()` (with `map_location`), the resume before "
        "training, and in the resumed epoch the skip of the batches already trained and the RNG states. The check "
        "launches it on 2 processes, once uninterrupted and once with rank 1 killed (`kill -9`) after the first "
        "snapshot under `--max-restarts`, and compares the final weights. (It takes about a minute.)",
        "check_snapshot_resume",
        "import shutil\nfrom pathlib import Path\n\n# your copy in the notebook's work/ folder: edit it; re-running this cell keeps it\n"
        "if Path(\"work\").is_dir() and not Path(\"work/ft_exercise.py\").exists():\n"
        "    shutil.copy(FT_STARTER, \"work/ft_exercise.py\")\n"
        "answer = ...  # \"work/ft_exercise.py\" once you have filled in its TODOs",
        "import difflib\nfrom pathlib import Path\n\n# what the solution writes into the starter\n"
        "print(\"\".join(difflib.unified_diff(Path(FT_STARTER).read_text().splitlines(True),\n"
        "                                   Path(FT_SOLUTION).read_text().splitlines(True), \"ft_starter.py\", "
        "\"ft_solution.py\")))\nanswer = FT_SOLUTION",
        extra_import=", FT_SOLUTION, FT_STARTER"),
    _ex("08-1", "Address already in use",
        "Your torchrun job fails with `Address already in use` on port 29500. Get a port that is free right now with "
        "`mnist_helpers.ports.free_port()`; the check binds it to prove it.",
        "check_free_port", "from mnist_helpers.ports import free_port\n\nanswer = ...  # a free port",
        "from mnist_helpers.ports import free_port\n\nanswer = free_port()"),
    _ex("08-2", "A running total without the graph",
        "Fix the loop so that `total` holds the sum of the losses **without** keeping every step's autograd graph "
        "alive (the classic slow memory leak).",
        "check_detached_total",
        "import torch\n\nmodel, X, y = torch.nn.Linear(4, 3), torch.randn(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])\n"
        "total = 0.0\nfor _ in range(3):\n    loss = torch.nn.functional.cross_entropy(model(X), y)\n"
        "    total += loss  # fix this line\nanswer = ...  # set answer = total once fixed",
        "import torch\n\nmodel, X, y = torch.nn.Linear(4, 3), torch.randn(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])\n"
        "total = 0.0\nfor _ in range(3):\n    loss = torch.nn.functional.cross_entropy(model(X), y)\n"
        "    total += loss.item()\nanswer = total"),
    _ex("09-1", "Reading a profile",
        "`STEP_PROFILE_MS` holds the milliseconds one training step spends in each phase. What fraction of the "
        "step is spent waiting for data?",
        "check_data_wait_share", "print(STEP_PROFILE_MS)\nanswer = ...  # a fraction",
        "answer = STEP_PROFILE_MS[\"data\"] / sum(STEP_PROFILE_MS.values())", extra_import=", STEP_PROFILE_MS"),
    _ex("09-2", "The article's tuning priority",
        "Put the four levers in the order the article says to tune them: `\"distribution\"`, `\"lr_and_optimizer\"`, "
        "`\"batch_size_and_workers\"`, `\"amp_and_accumulation\"`.",
        "check_tuning_priority", "answer = ...  # a list of the four names, the first to tune first",
        "answer = [\"batch_size_and_workers\", \"lr_and_optimizer\", \"amp_and_accumulation\", \"distribution\"]"),
    _ex("10-1", "Time to accuracy",
        "`EVAL_LOG` lists `(step, training seconds, test accuracy)` at each evaluation. Compute the time to 99% test "
        "accuracy.",
        "check_time_to_accuracy", "print(EVAL_LOG)\nanswer = ...  # seconds",
        "answer = next(seconds for step, seconds, acc in EVAL_LOG if acc >= 0.99)", extra_import=", EVAL_LOG"),
    _ex("10-2", "How far from the limit?",
        "A training image costs about 3x the forward FLOPs (`mnist_helpers.models.flops_per_image`): backward does "
        "about twice the forward's work, the approximation of Kaplan et al. 2020, \"Scaling Laws for Neural Language "
        "Models\" (2N FLOPs per token forward, 6N to train). At a peak of 1 TFLOP/s, what is the most images/s "
        "`FastNet` could train at?",
        "check_flops_bound",
        "from mnist_helpers.models import FastNet, flops_per_image\n\nanswer = ...  # images per second at best",
        "from mnist_helpers.models import FastNet, flops_per_image\n\nanswer = 1e12 / (3 * flops_per_image(FastNet()))"),
    _ex("11-1", "Sharded state per rank",
        "`ResMLP(width=1024, blocks=4)` has 34,389,002 parameters. Trained with AdamW in fp32 under FSDP2 (ZeRO-3) on 4 "
        "ranks, how many MiB of parameters + gradients + optimizer state does **each rank** hold?",
        "check_zero3_state_mib", "n_params, world_size = 34_389_002, 4\nanswer = ...  # MiB per rank (2**20 bytes)",
        "n_params, world_size = 34_389_002, 4\nanswer = n_params * (4 + 4 + 4 + 4) / world_size / 2**20"),
    _ex("11-2", "What ColwiseParallel keeps",
        "`nn.Linear(1024, 4096)` is parallelised with `ColwiseParallel` on a 4-rank mesh. What is the shape of the "
        "weight each rank holds locally (`weight.to_local().shape`)? Remember how `nn.Linear` stores its weight.",
        "check_colwise_local_shape", "answer = ...  # (rows, cols)",
        "out_features, in_features, ranks = 4096, 1024, 4\nanswer = (out_features // ranks, in_features)"),
]

BY_ID = {e.id: e for e in EXERCISES}


def for_notebook(nn: str) -> list[Exercise]:
    """The exercises of notebook ``nn`` (an id of ``mnist_helpers.series``: "00" .. "11"), in order."""
    return [e for e in EXERCISES if e.notebook == nn]


def answer_box(exercise_id: str, interactive: bool | None = None):
    """A text box and a Check button for one exercise in JupyterLab; returns None and shows nothing extra
    elsewhere (a plain-Python run, or ipywidgets missing). The typed text is read with ``ast.literal_eval``."""
    import ast

    ex = BY_ID.get(exercise_id)
    if ex is None:
        raise ValueError(f"unknown exercise {exercise_id!r}; known: {', '.join(BY_ID)}")
    from mnist_helpers.live import widgets
    w = widgets(interactive, "set `answer` in the cell instead")
    if w is None:
        return None
    from IPython.display import display
    box = w.Text(placeholder="your answer, e.g. 42", description=f"{exercise_id}:")
    button = w.Button(description="Check", button_style="primary")
    out = w.Output()

    def run(_):
        out.clear_output()
        with out:
            try:
                value = ast.literal_eval(box.value.strip())
            except (ValueError, SyntaxError):
                print(f"✘ could not read {box.value!r} as a Python value; type a number, a string in quotes, or a list.")
                return
            ex.check(value)

    button.on_click(run)
    display(w.HBox([box, button]), out)
    return None
