"""Exercises for the end of every notebook, with checks that give immediate, specific feedback (issue 11).

Every exercise is defined once, here: its prompt (markdown), the learner's starter cell (``...`` placeholders; the
check only runs once an answer is filled in, so an untouched notebook still runs top to bottom), and the solution
cell. ``scripts/build_exercises.py`` writes the starter cells into ``notebooks/NN_*.ipynb`` (cells marked with the
metadata key ``exercise``) and the solutions into ``notebooks/solutions/NN_solutions.ipynb`` from this one source,
and ``tests/course/test_exercises.py`` runs every solution through its check.

    from mnist_helpers.course.exercises import check_global_batch_size
    check_global_batch_size(4 * 32)      # prints what is right or wrong and why, returns a Feedback

A ``check_...`` function never raises on a wrong answer (a learner should read a hint, not a traceback): it
prints the feedback and returns a ``Feedback`` that is truthy only when the answer is right. ``answer_box(id)``
shows a text box and a Check button in JupyterLab (ipywidgets) and only the prompt's one-line question elsewhere.
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mnist_helpers.course.starters import starter_of


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

def _call(fn, *args):
    """(what ``fn(*args)`` returned, None) or (None, "ExceptionType: message"): a learner's function never crashes
    the check."""
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 - any error of the learner's code becomes feedback
        return None, f"{type(e).__name__}: {e}"


def _evaluation_case():
    """A probe model (it records, per forward, whether it was in training mode and autograd was on, and the batch
    size), a loader of 300 images in batches of 128 (the last one 44), the true accuracy, and the accuracy a mean of
    the three batch accuracies gives (the last batch is all wrong, so the two differ)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 10), nn.Dropout(0.5))
            self.calls = []

        def forward(self, x):
            self.calls.append((self.training, torch.is_grad_enabled(), len(x)))
            return self.net(x)

    g = torch.Generator().manual_seed(0)
    model, X = Probe(), torch.randn(300, 1, 28, 28, generator=g)
    with torch.no_grad():
        pred = model.eval().net(X).argmax(1)
    right = torch.rand(300, generator=g) < 0.8
    right[256:] = False  # the last batch: every image wrong
    y = torch.where(right, pred, (pred + 1) % 10)
    model.train()
    loader = DataLoader(TensorDataset(X, y), batch_size=128)
    per_batch = [right[i:i + 128].float().mean().item() for i in range(0, 300, 128)]
    return model, loader, right.sum().item() / 300, sum(per_batch) / len(per_batch), int(right.sum())


def check_evaluate_fn(answer) -> Feedback:
    """02-3: the learner's ``evaluate(model, loader)``, run on a probe model and a 300-image loader."""
    if not callable(answer):
        return _say(False, f"expected your function `evaluate` itself (answer = evaluate), got "
                           f"{type(answer).__name__}.")
    model, loader, truth, batch_mean, correct = _evaluation_case()
    got, error = _call(answer, model, loader)
    if error is not None:
        return _say(False, f"evaluate(model, loader) raised {error}")
    value = _number(got, "the accuracy")
    if value is None:
        return _say(False, f"evaluate returned {got!r} ({type(got).__name__}); return the accuracy as a number "
                           "between 0 and 1 (`correct / total`).")
    if not model.calls:
        return _say(False, "evaluate never called the model: run model(X) on every batch of the loader.")
    if any(training for training, _, _ in model.calls):
        return _say(False, "the model ran in training mode: call model.eval() first, or dropout (and BatchNorm's "
                           "batch statistics) change the predictions you score.")
    if any(grad for _, grad, _ in model.calls):
        return _say(False, "the forward passes ran with autograd on: wrap the loop in `with torch.no_grad():` (or "
                           "torch.inference_mode()), or every batch keeps a graph for a backward that never comes.")
    scored = sum(n for _, _, n in model.calls)
    if scored != 300:
        return _say(False, f"the model saw {scored} images, the loader holds 300 (batches of 128, 128 and 44): "
                           "score every batch, the small last one too.")
    if math.isclose(value, truth, abs_tol=1e-6):
        return _say(True, f"{value:.4f} = {correct} correct / 300 images, in eval mode without autograd. Counting "
                          "images (not averaging the batches' accuracies) keeps the small last batch from weighing "
                          "as much as a full one.")
    if math.isclose(value, truth * 100, abs_tol=1e-4):
        return _say(False, f"{value:g} is a percentage; return a fraction between 0 and 1.")
    if math.isclose(value, batch_mean, abs_tol=1e-6):
        return _say(False, f"{value:.4f} is the mean of the 3 batches' accuracies, but the last batch holds 44 "
                           "images, not 128: add up the correct predictions and the images over all batches, then "
                           "divide once.")
    if math.isclose(value, correct, abs_tol=1e-6):
        return _say(False, f"{value:g} is the number of correct predictions; divide by the number of images.")
    return _say(False, f"evaluate returned {value:.4f}, the accuracy is {truth:.4f}. Hint: sum of "
                       "(model(X).argmax(1) == y) over the batches / number of images.")



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

LOADER_TARGET = 3.0  # 03-3: the learner's loader must deliver this many times the baseline's images/s


class MnistLike:
    """03-3's dataset: as torchvision's MNIST, uint8 images in ``.data`` and labels in ``.targets``, and a
    ``__getitem__`` that turns one image into a PIL image and applies ``ToTensor`` and the article's ``Normalize``.
    Its ``n`` images are random pixels, and its label is the image's index, so that the check can tell which images
    a batch holds."""

    def __init__(self, n: int = 2_048):
        import torch
        from torchvision import transforms

        self.data = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
        self.targets = torch.arange(n)
        self.transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        from PIL import Image

        return self.transform(Image.fromarray(self.data[i].numpy(), mode="L")), int(self.targets[i])

    def normalized(self):
        """Every image as the transform makes it, (n, 1, 28, 28) float32: what each batch must hold."""
        return self.data.float().div(255).sub(0.1307).div(0.3081).unsqueeze(1)


def _epoch_labels(loader, expected, epoch: int) -> tuple[list | None, list[int], str | None]:
    """(labels in the order delivered, batch sizes, None) for epoch ``epoch`` of ``loader`` (its ``set_epoch``
    called first, if it has one), or (None, [], why not). ``expected``: every image, normalised."""
    import torch

    labels, sizes = [], []
    try:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        for batch in loader:
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
                return None, [], f"a batch is a {type(batch).__name__}, not a pair (X, y)"
            X, y = batch
            if tuple(X.shape[1:]) != (1, 28, 28) or len(X) != len(y):
                return None, [], f"a batch has X of shape {tuple(X.shape)} and {len(y)} labels"
            y = torch.as_tensor(y)
            if not torch.allclose(X.float(), expected[y], atol=1e-5):
                return None, [], ("a batch's images are not the dataset's, normalised as its transform does "
                                  "((pixels / 255 - 0.1307) / 0.3081), for its labels")
            labels += y.tolist()
            sizes.append(len(y))
    except Exception as e:  # noqa: BLE001 - the learner's loader
        return None, [], f"iterating it raised {type(e).__name__}: {e}"
    return labels, sizes, None


def _loader_speedup(make_loader, dataset, batch_size: int, rounds: int = 3) -> tuple[float, float, float]:
    """(median of the rounds' speedups, baseline seconds, yours seconds) of one epoch each: the baseline
    ``DataLoader(dataset, batch_size, shuffle=True)`` and the learner's loader, timed in alternation in this process
    (each round: one epoch of each, in turn), so that both meet the same load on a busy machine."""
    import statistics
    import time

    import torch
    from torch.utils.data import DataLoader

    def epoch(loader) -> float:
        t = time.perf_counter()
        for X, y in loader:  # noqa: B007 - only the delivery is timed
            pass
        return time.perf_counter() - t

    baseline, yours = DataLoader(dataset, batch_size=batch_size, shuffle=True), make_loader(dataset, batch_size)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # both in one thread: on a busy machine torch's thread pool stalls small batched ops
    try:
        epoch(baseline), epoch(yours)  # warm-up: first-touch costs, lazy imports
        pairs = [(epoch(baseline), epoch(yours)) for _ in range(rounds)]
    finally:
        torch.set_num_threads(threads)
    return (statistics.median(b / y for b, y in pairs), statistics.median(b for b, _ in pairs),
            statistics.median(y for _, y in pairs))


def check_fast_loader(answer) -> Feedback:
    """03-3: ``make_loader(dataset, batch_size)`` for a ``MnistLike`` dataset that delivers its images normalised,
    every image once per epoch, shuffled anew, in batches of ``batch_size``, at >= LOADER_TARGET x the images/s of
    ``DataLoader(dataset, batch_size, shuffle=True)``, both measured here and now."""
    if not callable(answer):
        return _say(False, f"expected your function `make_loader` itself (answer = make_loader), got "
                           f"{type(answer).__name__}.")
    dataset, batch_size = MnistLike(), 128
    n, expected = len(dataset), dataset.normalized()
    loader, error = _call(answer, dataset, batch_size)
    if error is not None:
        return _say(False, f"make_loader(dataset, 128) raised {error}")
    first, sizes, why = _epoch_labels(loader, expected, 0)
    if why is None:
        second, _, why = _epoch_labels(loader, expected, 1)
    if why is not None:
        return _say(False, f"your loader does not deliver (X, y) batches of the dataset: {why}.")
    if any(s > batch_size for s in sizes) or any(s != batch_size for s in sizes[:-1]):
        return _say(False, f"batches of {sorted(set(sizes))} images: every batch but the last should hold "
                           "batch_size = 128.")
    if sorted(first) != list(range(n)):
        missing = n - len(set(first))
        return _say(False, f"one epoch delivered {len(first):,} labels for {n:,} images ({missing:,} never): every "
                           "image once per epoch (drop_last=False).")
    if first == sorted(first):
        return _say(False, "the images come in the dataset's order: shuffle them (a torch.randperm of the "
                           "indices, sliced into batches).")
    if first == second:
        return _say(False, "two epochs came in the same order (the check calls set_epoch(epoch) first if your "
                           "loader has one): draw a new permutation for every epoch.")
    speedup, base_s, yours_s = _loader_speedup(answer, dataset, batch_size)
    rates = (f"{n / base_s:,.0f} img/s for DataLoader(dataset, batch_size=128, shuffle=True), {n / yours_s:,.0f} "
             f"img/s for yours ({speedup:.1f}x, the median of 3 alternating rounds on this machine)")
    if speedup < LOADER_TARGET:
        return _say(False, f"{rates}; the target is {LOADER_TARGET:g}x. This dataset, like torchvision's MNIST, makes "
                           "each image a PIL image and applies ToTensor and Normalize one image at a time; worker "
                           "processes only share that work out over the cores. Build each batch at once from "
                           "dataset.data and dataset.targets with one index (section 1's alternative).")
    return _say(True, f"{rates}: every image once per epoch, a new order each epoch. One index and one "
                      "normalisation per batch replace 128 calls of __getitem__ (PIL, ToTensor, Normalize) and a "
                      "torch.stack.")



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

WARMUP_CASE = dict(base_lr=0.1, base_batch=256, global_batch=1024, warmup_steps=100)  # 04-3


def _lr_expected(step, base_lr, base_batch, global_batch, warmup_steps) -> float:
    target = base_lr * global_batch / base_batch
    if step >= warmup_steps:
        return target
    return base_lr + (target - base_lr) * step / warmup_steps


def check_warmup_lr(answer) -> Feedback:
    """04-3: ``lr_at(step, base_lr, base_batch, global_batch, warmup_steps)``: the linear scaling rule reached by a
    linear warm-up from ``base_lr`` (Goyal et al. 2017; 04's ``scaled_lr`` and ``warmup_factor``), run on cases."""
    if not callable(answer):
        return _say(False, f"expected your function `lr_at` itself (answer = lr_at), got {type(answer).__name__}.")
    c = WARMUP_CASE
    args = (c["base_lr"], c["base_batch"], c["global_batch"], c["warmup_steps"])
    target = _lr_expected(10**6, *args)
    got = {}
    for step in (0, 1, 50, 99, 100, 101, 1000):
        value, error = _call(answer, step, *args)
        if error is not None:
            return _say(False, f"lr_at({step}, 0.1, 256, 1024, 100) raised {error}")
        if _number(value, "the LR") is None:
            return _say(False, f"lr_at({step}, 0.1, 256, 1024, 100) returned {value!r}; return the learning rate "
                               "as a number.")
        got[step] = _number(value, "the LR")
    after = got[1000]
    if not math.isclose(after, target, rel_tol=1e-9):
        if math.isclose(after, c["base_lr"], rel_tol=1e-9):
            return _say(False, f"after the warm-up your LR is the base LR {after:g}: with 4x the batch (1024 vs "
                               "256) the linear rule takes 4x the LR.")
        if math.isclose(after, c["base_lr"] * 2, rel_tol=1e-9):
            return _say(False, f"after the warm-up your LR is {after:g}, square-root scaling; the linear rule "
                               "multiplies by the batch ratio, 1024 / 256.")
        return _say(False, f"after the warm-up (step 1000) your LR is {after:g}; the linear rule gives "
                           f"0.1 x 1024 / 256 = {target:g}.")
    if math.isclose(got[0], target, rel_tol=1e-9):
        return _say(False, f"at step 0 your LR is already {target:g}: no warm-up. Start at the base LR and ramp "
                           "up to the scaled one over warmup_steps steps.")
    if math.isclose(got[0], 0.0, abs_tol=1e-12):
        return _say(False, "at step 0 your LR is 0: Goyal et al. (and notebook 04's warmup_factor) ramp up from "
                           "the base LR, the one that already suits base_batch, not from 0.")
    wrong = [s for s in (0, 1, 50, 99, 100, 101) if not math.isclose(got[s], _lr_expected(s, *args), rel_tol=1e-9)]
    if wrong:
        s = wrong[0]
        return _say(False, f"at step {s} your LR is {got[s]:g}, expected {_lr_expected(s, *args):g}: a straight "
                           "line from base_lr at step 0 to the scaled LR at step warmup_steps, then flat.")
    for case in ((0, 0.05, 128, 128, 10), (5, 0.05, 128, 512, 0)):
        value, error = _call(answer, *case)
        if error is not None or _number(value, "the LR") is None or not math.isclose(
                _number(value, "the LR"), _lr_expected(*case), rel_tol=1e-9):
            return _say(False, f"lr_at{case} gave {error or value!r}, expected {_lr_expected(*case):g}: with "
                               "warmup_steps=0 there is no ramp, and at the base batch the LR stays the base LR.")
    return _say(True, f"0.1 at step 0, {got[50]:g} half-way, {target:g} from step 100 on: k = 4x the batch, 4x the "
                      "LR, reached gradually so that the first large steps do not blow up an untrained model.")



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

def _accumulation_case(n: int, micro_batch: int):
    """A small float64 model whose forward records each batch's size, a batch (X, y) of ``n`` images, and the
    big-batch gradient (mean cross-entropy over all ``n``), the gradient with each micro-batch's mean loss divided
    by the number of micro-batches, and the last micro-batch's gradient alone, each flattened."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.ReLU(), nn.Linear(16, 10)).double()
            self.sizes = []

        def forward(self, x):
            self.sizes.append(len(x))
            return self.net(x)

    g = torch.Generator().manual_seed(n)
    torch.manual_seed(0)
    model = Probe()
    X, y = torch.randn(n, 1, 28, 28, generator=g, dtype=torch.float64), torch.randint(0, 10, (n,), generator=g)

    def grad_of(losses) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        sum(losses).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    chunks = list(zip(X.split(micro_batch), y.split(micro_batch)))
    big = grad_of([F.cross_entropy(model.net(X), y)])
    per_count = grad_of([F.cross_entropy(model.net(a), b) / len(chunks) for a, b in chunks])
    last = grad_of([F.cross_entropy(model.net(chunks[-1][0]), chunks[-1][1])])
    model.zero_grad(set_to_none=True)
    return model, X, y, {"big": big, "per_count": per_count, "last": last, "k": len(chunks)}


def check_accumulation_fn(answer) -> Feedback:
    """05-3: ``accumulate(model, X, y, micro_batch)``: backward over micro-batches of at most ``micro_batch`` images
    so that ``.grad`` holds the gradient of the mean cross-entropy over all of X; compared with the big batch's."""
    import torch

    if not callable(answer):
        return _say(False, f"expected your function `accumulate` itself (answer = accumulate), got "
                           f"{type(answer).__name__}.")
    for n, micro_batch in ((96, 32), (100, 32)):
        model, X, y, ref = _accumulation_case(n, micro_batch)
        _, error = _call(answer, model, X, y, micro_batch)
        if error is not None:
            return _say(False, f"accumulate(model, X, y, {micro_batch}) raised {error}")
        if any(p.grad is None for p in model.parameters()):
            return _say(False, "after accumulate the parameters hold no gradient: call loss.backward() for every "
                               "micro-batch (and no zero_grad at the end).")
        if max(model.sizes, default=0) > micro_batch:
            return _say(False, f"a forward pass took {max(model.sizes)} images at once; the point is to never run "
                               f"more than micro_batch = {micro_batch} (X.split(micro_batch) gives the pieces).")
        got = torch.cat([p.grad.flatten() for p in model.parameters()])
        near = functools.partial(torch.allclose, rtol=1e-6, atol=1e-10)
        if near(got, ref["big"]):
            continue
        k = ref["k"]
        if near(got, k * ref["big"]) or near(got, k * ref["per_count"]):
            return _say(False, f"your gradient is {k}x the big batch's: each backward adds its micro-batch's "
                               f"gradient to .grad, so divide each micro-batch's loss by the number of "
                               f"micro-batches ({k}) before backward().")
        if near(got, ref["last"]) or near(got, ref["last"] / k):
            return _say(False, "only the last micro-batch's gradient is left in .grad: did you call zero_grad() "
                               "inside the loop? Gradients must add up over the micro-batches.")
        if near(got, ref["per_count"]):
            return _say(False, f"right for equal micro-batches, but {n} images in micro-batches of {micro_batch} "
                               f"leave {n % micro_batch} in the last: weight each micro-batch's mean loss by its "
                               "share of the images, len(xb) / len(X), instead of 1 / number of micro-batches.")
        rel = float((got - ref["big"]).norm() / ref["big"].norm())
        return _say(False, f"with {n} images in micro-batches of {micro_batch} your gradient differs from the big "
                           f"batch's by {rel:.1%} (relative norm). Hint: for each micro-batch (xb, yb): "
                           "(F.cross_entropy(model(xb), yb) * len(xb) / len(X)).backward().")
    return _say(True, "your gradients equal the big batch's (to float64 rounding) for 96 images in 3 micro-batches "
                      "and for 100 images in 4 uneven ones: weighting each micro-batch's mean loss by its share of "
                      "the images makes the sum the big batch's mean. Memory holds one micro-batch's activations.")



# ---------------------------------------------------------------------------------------- 06 DDP fundamentals
# Each exercise that makes the learner write a script has one real file, its solution (mnist_helpers/workers/exercises/:
# *_SOLUTION, a path); the starter the learner copies into the notebook's work/ folder and completes (*_STARTER, its
# text) is read out of the solution's `# exercise:` regions (mnist_helpers.course.starters).
_EXERCISE_SCRIPTS = Path(__file__).resolve().parents[1] / "workers" / "exercises"
# 07-3: a DDP script without snapshot and resume
FT_SOLUTION = str(_EXERCISE_SCRIPTS / "ft_solution.py")
FT_STARTER = starter_of(FT_SOLUTION)


# 06-1 and 08-3: each writes its facts per process into --report (a REPORT block the learner leaves alone); the check
# launches it with torchrun on 2 CPU processes (gloo) and reads them.
DDP_SOLUTION, HANG_SOLUTION = str(_EXERCISE_SCRIPTS / "ddp_solution.py"), str(_EXERCISE_SCRIPTS / "hang_solution.py")
DDP_STARTER, HANG_STARTER = starter_of(DDP_SOLUTION), starter_of(HANG_SOLUTION)
# 12-1: a short DDP worker with the article's --local_rank bug, copied and fixed the same way; its rank 0 writes the
# device every process picked to --out
LOCAL_RANK_SOLUTION = str(_EXERCISE_SCRIPTS / "local_rank_solution.py")
LOCAL_RANK_STARTER = starter_of(LOCAL_RANK_SOLUTION)
# 06-2: the measurement behind the prediction, DDP's all-reduce calls per step for Net counted by a communication hook
BUCKET_COUNTER = str(_EXERCISE_SCRIPTS / "bucket_counter.py")
DDP_CHECK_ARGS = {"epochs": 2, "subset": 250, "test_images": 101, "batch_size": 32}  # 06-1: tiny, odd test count


def _launch_reporting(text: str, args: list, timeout: float = 180) -> tuple[list | None, str | None]:
    """Launch a learner's script (its text) with torchrun on 2 CPU processes with ``--report DIR``; (each process's
    facts, sorted by rank, None) or (None, the failing rank's error, or "timed out ..." after ``timeout`` s)."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mnist_exercise_") as tmp:
        report = Path(tmp) / "report"
        _, error = _launch_in(tmp, text, [*args, "--report", report], timeout=timeout, name="exercise.py")
        if error is not None:
            return None, error
        facts = [json.loads(p.read_text()) for p in sorted(report.glob("rank*.json"))]
    return sorted(facts, key=lambda f: f.get("rank", 0)), None


def _run_ddp_exercise(text: str) -> tuple[list | None, str | None]:
    a = DDP_CHECK_ARGS
    return _launch_reporting(text, ["--epochs", a["epochs"], "--subset", a["subset"], "--test-images",
                                    a["test_images"], "--batch-size", a["batch_size"], "--device", "cpu"])


def check_ddp_script(answer) -> Feedback:
    """06-1: ``DDP_STARTER`` (a single-device script, read out of ``ddp_solution.py``) turned into a DDP script;
    launched on 2 processes: disjoint shards that cover the training images, a new order each epoch, identical final
    weights, every test image counted once."""
    text = _script_text(answer)
    if text is None:
        return _say(False, f"expected the path of your script (\"work/ddp_exercise.py\"), got {type(answer).__name__}.")
    facts, error = _run_ddp_exercise(text)
    if error is not None:
        hint = ""
        if "process group has not been initialized" in error:
            hint = "\nHint: call dist.init_process_group(...) before the DistributedSampler and DDP need it."
        elif "mutually exclusive with shuffle" in error:
            hint = "\nHint: drop shuffle=True from the DataLoader: the DistributedSampler shuffles."
        return _say(False, f"your script failed under torchrun with 2 processes:\n{error}{hint}")
    if len(facts) != 2 or any(len(f.get("seen", [])) != DDP_CHECK_ARGS["epochs"] for f in facts):
        return _say(False, f"the script ran but {len(facts)} of its 2 processes wrote a report with 2 epochs: keep "
                           "the REPORT block (and the seen list) as the starter has them.")
    n, n_test = DDP_CHECK_ARGS["subset"], DDP_CHECK_ARGS["test_images"]
    shard0, shard1 = (set(f["seen"][0]) for f in facts)
    if shard0 == shard1:
        return _say(False, f"rank 1 saw the same images as rank 0 ({len(shard0)} each, in epoch 0): did you pass "
                           "the sampler to the DataLoader (DataLoader(..., sampler=DistributedSampler(train_set)))?")
    if shard0 & shard1:
        return _say(False, f"rank 0 and rank 1 both trained on {len(shard0 & shard1)} of the same images in epoch 0: "
                           "give every rank's DistributedSampler the same seed (it splits one shuffled order "
                           "between the ranks) and let it read rank and world size from the process group.")
    if len(shard0 | shard1) < n:
        return _say(False, f"{n - len(shard0 | shard1)} of the {n} training images were trained on by no rank in "
                           "epoch 0: keep drop_last=False, and every batch of each rank's shard.")
    if facts[0]["seen"][0] == facts[0]["seen"][1]:
        return _say(False, "rank 0 drew the same order in both epochs: call sampler.set_epoch(epoch) at the start "
                           "of every epoch (the sampler shuffles with seed + epoch).")
    if facts[0]["digest"] != facts[1]["digest"]:
        return _say(False, f"each rank trained on its own shard, but they ended with different weights "
                           f"({facts[0]['digest']} and {facts[1]['digest']}): wrap the model in DDP(...), so that "
                           "backward() averages the gradients of the ranks and every replica takes the same step.")
    counts = [f["count"] for f in facts]
    if sum(counts) == n_test and counts[0] != n_test:
        return _say(False, f"each rank counted only its own test images ({counts[0]} and {counts[1]} of {n_test}): "
                           "sum correct and count over the ranks with dist.all_reduce before printing the accuracy.")
    if any(c > n_test for c in counts):
        return _say(False, f"{max(counts)} test images counted for {n_test}: some twice. A DistributedSampler pads "
                           "the test set to a multiple of the world size; split it exactly (X[rank::world_size]) "
                           "and all_reduce the counts.")
    if any(c != n_test for c in counts) or facts[0]["correct"] != facts[1]["correct"]:
        return _say(False, f"the ranks report {counts} test images and {[f['correct'] for f in facts]} correct; "
                           f"every rank should report all {n_test}, counted once over the ranks.")
    return _say(True, f"launched on 2 processes: rank 0 trained on {len(shard0)} images and rank 1 on the other "
                      f"{len(shard1)}, in a new order each epoch; both ended with weights {facts[0]['digest']}; "
                      f"{facts[0]['correct']} of {n_test} test images right, each counted once. That is the whole "
                      "of DDP: a process group, a shard per rank, averaged gradients, and exact totals.")


def _launch_in(folder, text: str, args=(), *, nproc: int = 2, timeout: float = 180, name: str = "worker.py",
               max_restarts: int = 0) -> tuple[dict | None, str | None]:
    """Write a learner's script (its text) into ``folder`` as ``name`` and run it under torchrun on ``nproc`` CPU
    processes, restarting the group up to ``max_restarts`` times (``launch.LaunchOptions``): (its JSON, None) or
    (None, the failing rank's error, or "timed out ...")."""
    from mnist_helpers.launch import LaunchError, LaunchOptions, torchrun

    script = Path(folder) / name
    script.write_text(text)
    try:
        return torchrun(str(script), args, nproc=nproc, device="cpu", echo=False, timeout=timeout, provision=False,
                        threads_per_proc=1, options=LaunchOptions(max_restarts=max_restarts)), None
    except LaunchError as e:
        return None, e.root_cause or str(e)


def _launch_script(text: str, nproc: int = 2):
    """Run a worker's text under torchrun on ``nproc`` CPU processes; (its JSON, None) or (None, the error)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mnist_exercise_") as tmp:
        return _launch_in(tmp, text, nproc=nproc)


def _script_text(answer) -> str | None:
    """The learner's script: its text, or the path of a file holding it."""
    from pathlib import Path

    if not isinstance(answer, (str, Path)):
        return None
    text = str(answer)
    if "\n" not in text and text.endswith(".py") and Path(text).is_file():
        return Path(text).read_text()
    return text


def check_bucket_prediction(answer) -> Feedback:
    """06-2: predict DDP's all-reduce calls per step for Net at bucket_cap_mb 25 and 1, then measure them (the
    ``bucket_counter.py`` worker, launched on 2 processes)."""
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in answer)):
        return _say(False, f"expected a pair of whole numbers (calls at 25 MB, calls at 1 MB), got {answer!r}.")
    got, error = _launch_script(Path(BUCKET_COUNTER).read_text())
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

    from mnist_helpers.launch import kill_rank_when

    args = ["--epochs", 2, "--subset", 512, "--test-images", 500, "--batch-size", 32, "--snapshot-every", 3,
            "--device", "cpu"]
    with tempfile.TemporaryDirectory(prefix="mnist_exercise_") as tmp:
        ref_snap, killed_snap, name = Path(tmp) / "ref.pt", Path(tmp) / "killed.pt", "ft_exercise.py"
        ref, error = _launch_in(tmp, text, [*args, "--snapshot", ref_snap], timeout=240, name=name)
        if error is not None:
            return None, error
        if not ref_snap.is_file():
            return {"ref": ref, "snapshot": None}, None
        snapshot = _snapshot_contents(ref_snap)
        thread, kill = kill_rank_when(killed_snap, name, rank=1, timeout=120)
        killed, error = _launch_in(tmp, text, [*args, "--snapshot", killed_snap], timeout=240, name=name,
                                   max_restarts=1)
        if error is not None:
            return None, error
        thread.join(timeout=10)
    return {"ref": ref, "killed": killed, "kill": kill, "snapshot": snapshot}, None


def check_snapshot_resume(answer) -> Feedback:
    """07-3: snapshot and resume written into ``FT_STARTER`` (read out of ``ft_solution.py``); launched, killed,
    resumed, compared."""
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

HANG_TIMEOUT = 8  # 08-3: seconds a collective may wait in the learner's script (its --timeout) before it fails


def _run_hang_exercise(text: str) -> tuple[list | None, str | None]:
    # the script's own --timeout turns a hang into an error after HANG_TIMEOUT s; the launch's timeout is the guard
    # for a script whose process group ignores it
    return _launch_reporting(text, ["--steps", 5, "--timeout", HANG_TIMEOUT], timeout=90)


def check_hang_fix(answer) -> Feedback:
    """08-3: ``HANG_STARTER`` (read out of ``hang_solution.py``; rank 0 alone calls the log line's all_reduce) fixed;
    launched on 2 processes under a short timeout: it must finish, and rank 0 must log the loss averaged over the
    ranks."""
    text = _script_text(answer)
    if text is None:
        return _say(False, f"expected the path of your script (\"work/hang_exercise.py\"), got {type(answer).__name__}.")
    facts, error = _run_hang_exercise(text)
    if error is not None and "timed out" in error.lower():
        return _say(False, f"it still hangs: a rank waited {HANG_TIMEOUT} s in a collective that the other rank "
                           "never called. Every rank must call every collective, in the same order; only the print "
                           f"belongs under `if rank == 0`.\n{error.strip().splitlines()[-1][:300]}")
    if error is not None:
        return _say(False, f"your script failed under torchrun with 2 processes:\n{error}")
    if len(facts) != 2:
        return _say(False, f"the script finished but {len(facts)} of its 2 processes wrote a report: keep the REPORT "
                           "block as the starter has it.")
    losses, logged = [f["loss"] for f in facts], facts[0]["logged"]
    mean = sum(losses) / 2
    if math.isclose(logged, mean, rel_tol=1e-5):
        return _say(True, f"both ranks finished, and rank 0 logs {logged:.4f}, the mean of the ranks' losses "
                          f"({losses[0]:.4f}, {losses[1]:.4f}): the all_reduce is called by every rank, the print by "
                          "rank 0 only.")
    if math.isclose(logged, losses[0], rel_tol=1e-5):
        return _say(False, f"it no longer hangs, but rank 0 logs its own loss ({logged:.4f}), not the mean over the "
                           f"ranks ({mean:.4f}): keep the all_reduce, and call it on every rank.")
    if math.isclose(logged, 2 * mean, rel_tol=1e-5):
        return _say(False, f"it finishes, but rank 0 logs {logged:.4f}, the sum of the 2 ranks' losses: divide by "
                           "world_size after the all_reduce.")
    return _say(False, f"it finishes, but rank 0 logs {logged:.4f}; the mean of the ranks' losses is {mean:.4f}.")



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
FINAL_ACCS = [0.9912, 0.9897, 0.9905, 0.9921, 0.9894, 0.9908, 0.9899, 0.9915, 0.9859, 0.9903]  # 10-1: ten seeds


def check_protocol_mean(answer) -> Feedback:
    """10-1: the protocol's reading of ``FINAL_ACCS`` (ten seeds of one fixed schedule): their mean."""
    value = _number(answer, "an accuracy")
    truth = statistics.fmean(FINAL_ACCS)
    if value is None:
        return _not_a_number(answer, "an accuracy")
    if value > 1:
        return _say(False, f"{value:g} looks like a percentage; give the accuracy as a fraction (0.99 for 99%).")
    if _close(value, truth, rel=1e-4):
        under = sum(a < 0.99 for a in FINAL_ACCS)
        return _say(True, f"{truth:.4f}: the mean reaches 99.0%, so the recipe does under the protocol, although "
                          f"{under} of the {len(FINAL_ACCS)} seeds ended under it. The best seed, or a curve's first "
                          "point over the line, would have claimed more.")
    if _close(value, max(FINAL_ACCS), rel=1e-4):
        return _say(False, "that is the best seed: reading the best run (or a curve's first peak) is what makes "
                           "first-crossing numbers optimistic. The protocol takes the mean of all seeds.")
    if _close(value, sum(a >= 0.99 for a in FINAL_ACCS) / len(FINAL_ACCS), rel=1e-4):
        return _say(False, "that is the share of seeds at or above 99.0%; the protocol judges the mean final accuracy.")
    if _close(value, statistics.median(FINAL_ACCS), rel=1e-4):
        return _say(False, "that is the median; the protocol (airbench's) reports the mean.")
    return _say(False, f"{value:g} is not it. Hint: statistics.fmean(FINAL_ACCS).")


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
    n = 34_389_002  # ResMLP(width=1024, blocks=4): mnist_helpers.lessons.n11.lesson.n_params(1024, 4)
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


# ------------------------------------------------------------------------------------------ 12 DDP in depth
def check_local_rank_fix(answer) -> Feedback:
    """12-1: ``LOCAL_RANK_STARTER`` (read out of ``local_rank_solution.py``: a worker that reads the article's
    ``--local_rank``) fixed to read torchrun's LOCAL_RANK; launched on 2 processes, it must name one GPU per process."""
    text = _script_text(answer)
    if text is None:
        return _say(False, f"expected the path of your fixed script (\"work/local_rank_exercise.py\") or its text, "
                           f"got {type(answer).__name__}.")
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


RNG_SEEDS, RNG_RANKS = (0, 1234), 4  # 12-2: the seeds and ranks the check asks the learner's function for


def check_rank_generator(answer) -> Feedback:
    """12-2: ``rank_generator(seed, rank)``: a ``torch.Generator`` for one rank's data-side randomness (augmentation,
    dropout masks drawn from it): its own stream on every rank, the same stream again for the same seed and rank,
    another for another seed, and torch's global generator left alone. Each stream is 16 images' (dx, dy) shifts."""
    import torch

    if not callable(answer):
        return _say(False, f"expected your function `rank_generator` itself (answer = rank_generator), got "
                           f"{type(answer).__name__}.")
    streams = {}
    for seed in RNG_SEEDS:
        for rank in range(RNG_RANKS):
            for attempt in (0, 1):
                state = torch.get_rng_state()
                g, error = _call(answer, seed, rank)
                if error is not None:
                    return _say(False, f"rank_generator({seed}, {rank}) raised {error}")
                if not isinstance(g, torch.Generator):
                    return _say(False, f"rank_generator({seed}, {rank}) returned {type(g).__name__}: return a "
                                       "torch.Generator, seeded: torch.Generator().manual_seed(...).")
                if g is torch.default_generator or not torch.equal(state, torch.get_rng_state()):
                    torch.set_rng_state(state)
                    return _say(False, "you used torch's global generator (torch.manual_seed reseeds it and returns "
                                       "it): reseeding it per rank resets every other random draw of the process, the "
                                       "model's initialisation and dropout included. Make one of its own: "
                                       "torch.Generator().manual_seed(...).")
                streams[seed, rank, attempt] = torch.randint(-2, 3, (16, 2), generator=g)
    for seed in RNG_SEEDS:
        for rank in range(RNG_RANKS):
            if not torch.equal(streams[seed, rank, 0], streams[seed, rank, 1]):
                return _say(False, f"two calls with seed {seed} and rank {rank} gave different shifts: a rerun would "
                                   "not be reproducible. Seed the generator from seed and rank only "
                                   "(torch.Generator().manual_seed(...)), nothing random or time-dependent.")
    for seed in RNG_SEEDS:
        first = streams[seed, 0, 0]
        if all(torch.equal(first, streams[seed, rank, 0]) for rank in range(RNG_RANKS)):
            return _say(False, f"with seed {seed} every rank draws the same shifts: that is the article's one seed "
                               "everywhere, and each rank's k-th image gets the same augmentation. Give each rank its "
                               "own stream: add the rank to the seed.")
        for a in range(RNG_RANKS):
            for b in range(a + 1, RNG_RANKS):
                if torch.equal(streams[seed, a, 0], streams[seed, b, 0]):
                    return _say(False, f"ranks {a} and {b} draw the same shifts with seed {seed}: every rank needs "
                                       "a seed of its own, e.g. seed + rank.")
    if all(torch.equal(streams[RNG_SEEDS[0], r, 0], streams[RNG_SEEDS[1], r, 0]) for r in range(RNG_RANKS)):
        return _say(False, f"the seed changes nothing: every rank draws the same shifts with seed {RNG_SEEDS[0]} and "
                           f"seed {RNG_SEEDS[1]}, so a run's seed cannot choose its data-side randomness. Use both: "
                           "manual_seed(seed + rank).")
    return _say(True, "each rank draws its own shifts, the same ones again for the same seed and rank (a rerun is "
                      "reproducible) and others for another seed, with torch's global generator untouched. DDP makes "
                      "the weights equal whatever the seeds (it broadcasts rank 0's when it wraps the model), so "
                      "seed + rank for the data side costs nothing.")


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
    starter = (f"from mnist_helpers.course.exercises import {names}{box}\n\n" + starter_body.strip("\n")
               + f"\nif answer is not ...:  # runs once you have filled in your answer\n    {check}(answer)")
    solution = f"from mnist_helpers.course.exercises import {names}\n\n" + solution_body.strip("\n") + f"\nassert {check}(answer)"
    return Exercise(id, title, prompt.strip("\n"), starter, solution, check)


def _copy_starter_cell(const: str, work_name: str, when: str) -> str:
    """An exercise cell that writes the starter script ``const`` (its text) into the notebook's work/ folder once
    (re-running keeps the learner's edits) and waits for its path as the answer."""
    return ("from pathlib import Path\n\n"
            "# your copy in the notebook's work/ folder: edit it; re-running this cell keeps it\n"
            f"if Path(\"work\").is_dir() and not Path(\"work/{work_name}\").exists():\n"
            f"    Path(\"work/{work_name}\").write_text({const})\n"
            f"answer = ...  # \"work/{work_name}\" {when}")


def _diff_solution_cell(stem: str) -> str:
    """A solution cell that shows what ``{STEM}_SOLUTION`` writes into the starter, then answers with it."""
    return ("from mnist_helpers.course.starters import solution_diff\n\n"
            f"print(solution_diff({stem}_SOLUTION))  # what the solution writes into the starter\n"
            f"answer = {stem}_SOLUTION")


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
        "`CONFUSION` (in `mnist_helpers.course.exercises`) is a 3-class confusion matrix: rows are the true class, columns "
        "the predicted one. Compute the accuracy as a fraction with code, not by hand.",
        "check_accuracy_from_confusion", "print(CONFUSION)\nanswer = ...  # a fraction between 0 and 1",
        "correct = sum(CONFUSION[i][i] for i in range(len(CONFUSION)))\n"
        "answer = correct / sum(sum(row) for row in CONFUSION)", extra_import=", CONFUSION"),
    _ex("02-3", "Write the evaluation",
        "Write `evaluate(model, loader)`: the fraction of the loader's images that `model` classifies right, as the "
        "article's `test()` of section 1 counts them. The check runs it on a model with dropout and a loader of 300 "
        "images in batches of 128 (the last one holds 44), and says what it saw: the model's mode, autograd, the "
        "images scored, the value.",
        "check_evaluate_fn",
        "import torch\n\n\ndef evaluate(model, loader):\n"
        "    \"\"\"The fraction of the loader's images that model classifies right.\"\"\"\n"
        "    ...  # your code\n\n\nanswer = ...  # evaluate, once written",
        "import torch\n\n\ndef evaluate(model, loader):\n"
        "    \"\"\"The fraction of the loader's images that model classifies right.\"\"\"\n"
        "    model.eval()  # dropout off, BatchNorm on its running statistics\n"
        "    correct = total = 0\n    with torch.no_grad():  # no graph for a backward that never comes\n"
        "        for X, y in loader:\n            correct += (model(X).argmax(1) == y).sum().item()\n"
        "            total += len(y)  # count images: the last batch is smaller\n"
        "    return correct / total\n\n\nanswer = evaluate"),
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
    _ex("03-3", "A loader that beats the article's",
        "`make_loader(dataset, batch_size)` below returns the article's loader over `dataset`, which works like "
        "torchvision's `MNIST`: uint8 images in `dataset.data`, labels in `dataset.targets`, and a `__getitem__` "
        "that runs PIL, `ToTensor` and `Normalize` on one image. Change it so that it delivers the same thing "
        "(batches `(X, y)` of `batch_size` normalised images, every image once per epoch, a new order each epoch) "
        "at least 3x as fast. The check measures your loader against `DataLoader(dataset, batch_size=128, "
        "shuffle=True)` on this machine, in alternating rounds, and judges the ratio.",
        "check_fast_loader",
        "from torch.utils.data import DataLoader\n\n\n"
        "def make_loader(dataset, batch_size):\n"
        "    return DataLoader(dataset, batch_size=batch_size, shuffle=True)  # the baseline: make it 3x as fast\n\n\n"
        "answer = ...  # make_loader, once changed",
        "import torch\n\n\n"
        "class Batches:\n"
        "    \"\"\"Section 1's alternative: a batch is one index into the uint8 images and one normalisation.\"\"\"\n\n"
        "    def __init__(self, X_uint8, y, batch_size):\n"
        "        self.X, self.y, self.batch_size = X_uint8, y, batch_size\n\n"
        "    def __iter__(self):\n"
        "        order = torch.randperm(len(self.X))  # a new order every epoch\n"
        "        for start in range(0, len(order), self.batch_size):\n"
        "            idx = order[start:start + self.batch_size]\n"
        "            yield self.X[idx].float().div_(255).sub_(0.1307).div_(0.3081).unsqueeze(1), self.y[idx]\n\n\n"
        "def make_loader(dataset, batch_size):\n"
        "    return Batches(dataset.data, dataset.targets, batch_size)\n\n\n"
        "answer = make_loader"),
    _ex("04-1", "The linear scaling rule",
        "SGD trains well with `lr=0.1` at a global batch of 256. By the linear scaling rule, what LR goes with a global "
        "batch of 1024?",
        "check_linear_scaled_lr", "answer = ...  # the new learning rate", "answer = 0.1 * 1024 / 256"),
    _ex("04-2", "Square-root scaling for Adam",
        "Adam trains well with `lr=1e-3` at batch 128. With square-root scaling, what LR goes with batch 512?",
        "check_sqrt_scaled_lr", "import math\n\nanswer = ...  # the new learning rate",
        "import math\n\nanswer = 1e-3 * math.sqrt(512 / 128)"),
    _ex("04-3", "Write the warm-up schedule",
        "Write `lr_at(step, base_lr, base_batch, global_batch, warmup_steps)`: the learning rate at optimizer step "
        "`step` (0 is the first) under the linear scaling rule, reached by a linear warm-up: `base_lr` at step 0, "
        "rising in a straight line to `base_lr x global_batch / base_batch` at step `warmup_steps`, flat after "
        "(Goyal et al. 2017; this notebook's `scaled_lr` and `warmup_factor`). The check runs it on cases.",
        "check_warmup_lr",
        "def lr_at(step, base_lr, base_batch, global_batch, warmup_steps):\n"
        "    ...  # your code\n\n\nanswer = ...  # lr_at, once written",
        "def lr_at(step, base_lr, base_batch, global_batch, warmup_steps):\n"
        "    target = base_lr * global_batch / base_batch  # the linear scaling rule\n"
        "    if step >= warmup_steps:\n        return target\n"
        "    return base_lr + (target - base_lr) * step / warmup_steps  # a straight line from base_lr\n\n\n"
        "answer = lr_at"),
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
    _ex("05-3", "Write the accumulation loop",
        "Write `accumulate(model, X, y, micro_batch)`: forward and backward over pieces of at most `micro_batch` "
        "images of `(X, y)`, so that afterwards each parameter's `.grad` holds the gradient of "
        "`F.cross_entropy(model(X), y)`, the mean over *all* of X (the gradients start at zero; no optimizer step). "
        "The check compares your gradients with the big batch's, for an even and an uneven split.",
        "check_accumulation_fn",
        "import torch.nn.functional as F\n\n\ndef accumulate(model, X, y, micro_batch):\n"
        "    ...  # your code\n\n\nanswer = ...  # accumulate, once written",
        "import torch.nn.functional as F\n\n\ndef accumulate(model, X, y, micro_batch):\n"
        "    for xb, yb in zip(X.split(micro_batch), y.split(micro_batch)):\n"
        "        loss = F.cross_entropy(model(xb), yb) * len(xb) / len(X)  # this micro-batch's share of the mean\n"
        "        loss.backward()  # adds its gradient to .grad\n\n\nanswer = accumulate"),
    _ex("06-1", "Turn a single-device script into a DDP script",
        "`DDP_STARTER` is a single-device training script like section 1's. The cell copies it to "
        "`work/ddp_exercise.py`; turn that copy into a DDP script that torchrun launches on several processes (try "
        "it without looking at section 2): the process group, a `DistributedSampler` under the `DataLoader`, "
        "`DDP(...)`, `set_epoch`, an evaluation that counts every test image once, one rank printing. Leave its "
        "REPORT block as it is. The check launches your script on 2 processes and compares what each trained on, "
        "its final weights and its test count (about half a minute).",
        "check_ddp_script",
        _copy_starter_cell("DDP_STARTER", "ddp_exercise.py", "once it is a DDP script"),
        _diff_solution_cell("DDP"),
        extra_import=", DDP_SOLUTION, DDP_STARTER"),
    _ex("06-2", "Predict, then measure: all-reduce calls per step",
        "DDP does not all-reduce each of `Net`'s 8 parameter tensors separately. **Before running anything**, "
        "predict how many all-reduce calls one training step makes with DDP's default `bucket_cap_mb=25`, and with "
        "`bucket_cap_mb=1`. `Net` has 1,199,882 parameters (4.6 MiB of fp32 gradients), 1,179,648 of them in "
        "`fc1.weight`. Answer as a pair; the check then launches `BUCKET_COUNTER` "
        "(`mnist_helpers/workers/exercises/bucket_counter.py`) on 2 processes, which counts the calls with a "
        "communication hook.",
        "check_bucket_prediction", "answer = ...  # (calls at 25 MB, calls at 1 MB), e.g. (8, 8)",
        "from pathlib import Path\n\n"
        "print(Path(BUCKET_COUNTER).read_text())  # the measurement: a communication hook counts DDP's calls\n"
        "answer = (1, 2)  # 4.6 MiB fit one 25 MB bucket; at 1 MB fc1.weight closes a bucket, the rest form another",
        extra_import=", BUCKET_COUNTER"),
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
        _copy_starter_cell("FT_STARTER", "ft_exercise.py", "once you have filled in its TODOs"),
        _diff_solution_cell("FT"),
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
    _ex("08-3", "Fix a hang",
        "`HANG_STARTER` trains a small DDP model and logs its final loss averaged over the ranks, but it never "
        "ends: one collective is called by rank 0 alone (section 4). The cell copies it to `work/hang_exercise.py`; "
        "fix it there. The check launches it on 2 processes with `--timeout 8` (its process group's timeout, so that "
        "a hang becomes an error after 8 s) and checks that both ranks finish and that rank 0 logs the mean of the "
        "ranks' losses.",
        "check_hang_fix",
        _copy_starter_cell("HANG_STARTER", "hang_exercise.py", "once fixed"),
        _diff_solution_cell("HANG"),
        extra_import=", HANG_SOLUTION, HANG_STARTER"),
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
    _ex("10-1", "Does the recipe reach 99.0%?",
        "`FINAL_ACCS` holds the final test accuracy of ten seeds of one recipe, each trained for the same fixed "
        "schedule and scored once at the end. Under the field's protocol, what accuracy does the recipe reach? "
        "Answer it as a fraction (0.99 for 99%).",
        "check_protocol_mean", "print(FINAL_ACCS)\nanswer = ...  # the recipe's accuracy under the protocol",
        "import statistics\n\nanswer = statistics.fmean(FINAL_ACCS)", extra_import=", FINAL_ACCS"),
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
    _ex("12-1", "Fix a DDP worker: both processes on GPU 0",
        "`LOCAL_RANK_STARTER` is a short DDP worker that reads its GPU index the article's way, from an argparse "
        "`--local_rank`; under torchrun both of its processes pick `cuda:0` (section 1). The cell copies it to "
        "`work/local_rank_exercise.py`; fix it there (no GPU is needed: the script only names the device). The check "
        "launches it on 2 processes and reads the device each one picked.",
        "check_local_rank_fix",
        _copy_starter_cell("LOCAL_RANK_STARTER", "local_rank_exercise.py", "once fixed"),
        _diff_solution_cell("LOCAL_RANK"),
        extra_import=", LOCAL_RANK_SOLUTION, LOCAL_RANK_STARTER"),
    _ex("12-2", "Seed each rank's augmentation",
        "Section 3 showed that one seed on every rank gives every rank the same random shifts. Write "
        "`rank_generator(seed, rank)`: a `torch.Generator` for one rank's data-side randomness (augmentation, dropout "
        "masks drawn from it) that gives every rank its own stream, the same stream again for the same seed and rank "
        "(a rerun is reproducible) and another one for another seed, without touching torch's global generator. The "
        "check draws 16 images' shifts from it for 4 ranks and 2 seeds.",
        "check_rank_generator",
        "import torch\n\n\ndef rank_generator(seed, rank):\n"
        "    \"\"\"A generator for this rank's augmentation: its own stream, reproducible from the run's seed.\"\"\"\n"
        "    ...  # your code\n\n\nanswer = ...  # rank_generator, once written",
        "import torch\n\n\ndef rank_generator(seed, rank):\n"
        "    \"\"\"A generator for this rank's augmentation: its own stream, reproducible from the run's seed.\"\"\"\n"
        "    return torch.Generator().manual_seed(seed + rank)  # a stream per rank; the global generator untouched\n\n\n"
        "answer = rank_generator"),
]

BY_ID = {e.id: e for e in EXERCISES}


def for_notebook(nn: str) -> list[Exercise]:
    """The exercises of notebook ``nn`` (an id of ``mnist_helpers.course.series``: "00" .. "12"), in order."""
    return [e for e in EXERCISES if e.notebook == nn]


def answer_box(exercise_id: str, interactive: bool | None = None):
    """A text box and a Check button for one exercise in JupyterLab; returns None and shows nothing extra
    elsewhere (a plain-Python run, or ipywidgets missing). The typed text is read with ``ast.literal_eval``."""
    import ast

    ex = BY_ID.get(exercise_id)
    if ex is None:
        raise ValueError(f"unknown exercise {exercise_id!r}; known: {', '.join(BY_ID)}")
    from mnist_helpers.course.live import widgets
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
