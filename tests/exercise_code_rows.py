"""The rows of tests/course/test_exercise_branches.py for the exercises whose learner writes code (issue 48): 02-3 (an
evaluation function), 03-3 (a faster loader), 04-3 (the warm-up schedule), 05-3 (the accumulation loop), 06-1 (a
single-device script turned into DDP) and 08-3 (a hang fixed). Each answer is a function or a script such as a learner
writes, right or with a typical mistake, one row per `return` of the check at least.

The checks of 06-1 and 08-3 launch the learner's script; here their launch is replaced (``patch``) by what the script's
processes would have reported, so every row is fast. tests/course/test_exercise_code_launch.py launches the real scripts.
The same holds for 03-3's measurement (``_loader_speedup``): tests/course/test_exercises.py times the real thing.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from mnist_helpers.course import exercises as E
from test_exercise_branches import Row, solution_answer  # noqa: F401 - imported by that module after its Row exists


# ------------------------------------------------------------------------------------------------ 02-3
def _evaluate(eval_mode=True, no_grad=True, skip_last=False, scale=1.0, batch_mean=False, count=False, extra=0):
    """An ``evaluate(model, loader)`` as a learner writes it, right or with one typical mistake."""
    def evaluate(model, loader):
        if eval_mode:
            model.eval()
        correct = total = 0
        accs = []
        with torch.no_grad() if no_grad else contextlib.nullcontext():
            for X, y in loader:
                if skip_last and len(y) < 128:
                    break
                c = (model(X).argmax(1) == y).sum().item()
                correct, total = correct + c, total + len(y)
                accs.append(c / len(y))
        if batch_mean:
            return sum(accs) / len(accs)
        return correct if count else correct / (total + extra) * scale
    return evaluate


def _raises(*args):
    raise RuntimeError("boom")


ROWS_02_3 = [
    Row(solution_answer("02-3"), True, "Counting images (not averaging", name="the solution"),
    Row(_evaluate(), True, "Counting images (not averaging", name="right"),
    Row(0.7, False, "expected your function `evaluate` itself", shows=("got float",)),
    Row(_raises, False, "evaluate(model, loader) raised", shows=("RuntimeError: boom",), name="raises"),
    Row(lambda m, l: "high", False, "return the accuracy as a number between 0 and 1", name="a string"),
    Row(lambda m, l: 0.5, False, "evaluate never called the model", name="no model call"),
    Row(_evaluate(eval_mode=False), False, "the model ran in training mode", name="no eval()"),
    Row(_evaluate(no_grad=False), False, "the forward passes ran with autograd on", name="no no_grad"),
    Row(_evaluate(skip_last=True), False, "score every batch, the small last one too", name="last batch skipped"),
    Row(_evaluate(scale=100), False, "is a percentage; return a fraction", name="percent"),
    Row(_evaluate(batch_mean=True), False, "is the mean of the 3 batches' accuracies", name="mean of batches"),
    Row(_evaluate(count=True), False, "is the number of correct predictions", name="count"),
    Row(_evaluate(extra=1), False, "Hint: sum of", name="off by one image"),
]


# ------------------------------------------------------------------------------------------------ 03-3
class _Batches:
    """A loader over a MnistLike dataset in the solution's manner, with knobs for the typical mistakes."""

    def __init__(self, dataset, batch_size, shuffle=True, same_order=False, normalize=True, drop_tail=False):
        self.X, self.y, self.batch_size = dataset.data, dataset.targets, batch_size
        self.shuffle, self.same_order, self.normalize, self.drop_tail = shuffle, same_order, normalize, drop_tail

    def __iter__(self):
        g = torch.Generator().manual_seed(0) if self.same_order else None
        order = torch.randperm(len(self.X), generator=g) if self.shuffle else torch.arange(len(self.X))
        if self.drop_tail:
            order = order[:-self.batch_size]
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            X = self.X[idx].float()
            yield (X.div(255).sub(0.1307).div(0.3081) if self.normalize else X).unsqueeze(1), self.y[idx]


def _fast(**kw):
    return lambda dataset, batch_size: _Batches(dataset, batch_size, **kw)


FAST_ENOUGH = {"_loader_speedup": lambda make, ds, bs: (12.0, 0.12, 0.01)}
TOO_SLOW = {"_loader_speedup": lambda make, ds, bs: (1.1, 0.12, 0.11)}

ROWS_03_3 = [
    Row(solution_answer("03-3"), True, "One index and one normalisation per batch", shows=("12.0x",),
        patch=FAST_ENOUGH, name="the solution, measured 12x"),
    Row(lambda d, b: DataLoader(d, batch_size=b, shuffle=True), False, "worker processes only share that work out",
        shows=("1.1x", "the target is 3x"), patch=TOO_SLOW, name="the baseline, measured 1.1x"),
    Row(solution_answer("03-3"), False, "worker processes only share that work out", patch=TOO_SLOW,
        name="the solution on a machine where it measured 1.1x"),
    Row(128, False, "expected your function `make_loader` itself", shows=("got int",)),
    Row(_raises, False, "make_loader(dataset, 128) raised", shows=("RuntimeError: boom",), name="raises"),
    Row(lambda d, b: [torch.zeros(3)], False, "your loader does not deliver (X, y) batches", shows=("not a pair",),
        name="tensors, not pairs"),
    Row(_fast(normalize=False), False, "your loader does not deliver (X, y) batches",
        shows=("normalised as its transform does",), name="not normalised"),
    Row(lambda d, b: _Batches(d, 100), False, "every batch but the last should hold", name="batch of 100"),
    Row(_fast(drop_tail=True), False, "every image once per epoch (drop_last=False)", name="last batch dropped"),
    Row(_fast(shuffle=False), False, "the images come in the dataset's order", name="not shuffled"),
    Row(_fast(same_order=True), False, "two epochs came in the same order", name="one order for all epochs"),
]


# ------------------------------------------------------------------------------------------------ 04-3
def _lr(scale="linear", start="base", ramp_offset=0, zero_div=False):
    def lr_at(step, base_lr, base_batch, global_batch, warmup_steps):
        k = global_batch / base_batch
        target = base_lr * {"linear": k, "none": 1, "sqrt": k ** 0.5, "double": 2 * k}[scale]
        if zero_div:
            return base_lr + (target - base_lr) * min(step / warmup_steps, 1)
        if start == "none" or step >= warmup_steps:
            return target
        first = base_lr if start == "base" else 0.0
        return first + (target - first) * (step + ramp_offset) / warmup_steps
    return lr_at


ROWS_04_3 = [
    Row(solution_answer("04-3"), True, "reached gradually", name="the solution"),
    Row(_lr(), True, "reached gradually", name="right"),
    Row(0.4, False, "expected your function `lr_at` itself", shows=("got float",)),
    Row(_raises, False, "0.1, 256, 1024, 100) raised", shows=("RuntimeError: boom",), name="raises"),
    Row(lambda *a: None, False, "return the learning rate as a number", name="returns None"),
    Row(_lr(scale="none"), False, "after the warm-up your LR is the base LR", name="not scaled"),
    Row(_lr(scale="sqrt"), False, "square-root scaling; the linear rule", name="sqrt"),
    Row(_lr(scale="double"), False, "the linear rule gives", shows=("0.8",), name="8x"),
    Row(_lr(start="none"), False, "no warm-up", name="no warm-up"),
    Row(_lr(start="zero"), False, "ramp up from the base LR", name="from 0"),
    Row(_lr(ramp_offset=1), False, "a straight line from base_lr at step 0", shows=("at step 0",),
        name="off by one"),
    Row(_lr(zero_div=True), False, "with warmup_steps=0 there is no ramp", shows=("ZeroDivisionError",),
        name="divides by warmup_steps=0"),
]


# ------------------------------------------------------------------------------------------------ 05-3
def _accumulate(weight="share", zero_inside=False, whole=False, backward=True, scale=1.0):
    def accumulate(model, X, y, micro_batch):
        if whole:
            F.cross_entropy(model(X), y).backward()
            return
        pieces = list(zip(X.split(micro_batch), y.split(micro_batch)))
        for xb, yb in pieces:
            if zero_inside:
                model.zero_grad()
            w = {"share": len(xb) / len(X), "count": 1 / len(pieces), "none": 1.0}[weight]
            loss = F.cross_entropy(model(xb), yb) * w * scale
            if backward:
                loss.backward()
    return accumulate


ROWS_05_3 = [
    Row(solution_answer("05-3"), True, "weighting each micro-batch's mean loss", name="the solution"),
    Row(_accumulate(), True, "weighting each micro-batch's mean loss", name="right"),
    Row("accumulate", False, "expected your function `accumulate` itself", shows=("got str",)),
    Row(_raises, False, "raised", shows=("RuntimeError: boom",), name="raises"),
    Row(_accumulate(backward=False), False, "the parameters hold no gradient", name="no backward"),
    Row(_accumulate(whole=True), False, "a forward pass took", shows=("96 images at once",), name="one big batch"),
    Row(_accumulate(weight="none"), False, "x the big batch's", shows=("3x",), name="losses not divided"),
    Row(_accumulate(zero_inside=True), False, "only the last micro-batch's gradient", name="zero_grad inside"),
    Row(_accumulate(weight="count"), False, "right for equal micro-batches", shows=("leave 4 in the last",),
        name="divided by the number of micro-batches"),
    Row(_accumulate(scale=0.5), False, "differs from the big batch's by", name="half the gradient"),
]


# ------------------------------------------------------------------------------------------------ 06-1
N, N_TEST = E.DDP_CHECK_ARGS["subset"], E.DDP_CHECK_ARGS["test_images"]
_ORDER = [list(torch.randperm(N, generator=torch.Generator().manual_seed(e))) for e in (0, 1)]
_HALVES = [[[int(i) for i in order[r::2]] for order in _ORDER] for r in (0, 1)]  # rank -> epoch -> images


def _facts(seen=_HALVES, digests=("d1", "d1"), counts=(N_TEST, N_TEST), correct=(80, 80)):
    return [{"rank": r, "seen": seen[r], "digest": digests[r], "count": counts[r], "correct": correct[r]}
            for r in (0, 1)]


def _ddp(facts=None, error=None):
    return {"_run_ddp_exercise": lambda text: (facts, error)}


NOT_INIT = "ValueError: Default process group has not been initialized, please make sure to call init_process_group."
SHUFFLE = "ValueError: sampler option is mutually exclusive with shuffle"
ROWS_06_1 = [
    Row(E.DDP_SOLUTION, True, "That is the whole of DDP", shows=(f"{N_TEST} test images right",),
        patch=_ddp(_facts()), name="the solution"),
    Row(42, False, "expected the path of your script (\"work/ddp_exercise.py\")", shows=("got int",)),
    Row(E.DDP_STARTER, False, "your script failed under torchrun with 2 processes", shows=("Hint: call dist.init",),
        patch=_ddp(error=NOT_INIT), name="no process group"),
    Row(E.DDP_STARTER, False, "your script failed under torchrun with 2 processes", shows=("Hint: drop shuffle=True",),
        patch=_ddp(error=SHUFFLE), name="sampler and shuffle=True"),
    Row(E.DDP_STARTER, False, "your script failed under torchrun with 2 processes", shows=("SyntaxError",),
        patch=_ddp(error="SyntaxError: invalid syntax"), name="a syntax error"),
    Row(E.DDP_STARTER, False, "wrote a report with 2 epochs", patch=_ddp([]), name="no report"),
    Row(E.DDP_STARTER, False, "did you pass the sampler to the DataLoader", shows=("rank 1 saw the same images",),
        patch=_ddp(_facts(seen=[_HALVES[0], _HALVES[0]])), name="the same shard"),
    Row(E.DDP_STARTER, False, "of the same images in epoch 0",
        patch=_ddp(_facts(seen=[_HALVES[0], [_HALVES[0][0][:10] + _HALVES[1][0][10:], _HALVES[1][1]]])),
        name="overlapping shards"),
    Row(E.DDP_STARTER, False, "were trained on by no rank", shows=("10 of the",),
        patch=_ddp(_facts(seen=[_HALVES[0], [_HALVES[1][0][:-10], _HALVES[1][1]]])), name="images left out"),
    Row(E.DDP_STARTER, False, "call sampler.set_epoch(epoch)",
        patch=_ddp(_facts(seen=[[h[0], h[0]] for h in _HALVES])), name="no set_epoch"),
    Row(E.DDP_STARTER, False, "wrap the model in DDP(...)", patch=_ddp(_facts(digests=("d1", "d2"))),
        name="no DDP"),
    Row(E.DDP_STARTER, False, "each rank counted only its own test images",
        patch=_ddp(_facts(counts=(51, 50), correct=(40, 41))), name="counts not summed"),
    Row(E.DDP_STARTER, False, "A DistributedSampler pads", patch=_ddp(_facts(counts=(N_TEST + 1, N_TEST + 1))),
        name="padded test set"),
    Row(E.DDP_STARTER, False, "every rank should report all", patch=_ddp(_facts(counts=(100, 100))),
        name="one image short"),
]


# ------------------------------------------------------------------------------------------------ 08-3
def _hang(facts=None, error=None):
    return {"_run_hang_exercise": lambda text: (facts, error)}


def _losses(logged, losses=(1.2, 1.0)):
    return [{"rank": r, "loss": losses[r], "logged": logged if r == 0 else losses[r]} for r in (0, 1)]


TIMED_OUT = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
             "8000ms for recv operation to complete")
ROWS_08_3 = [
    Row(E.HANG_SOLUTION, True, "the all_reduce is called by every rank", shows=("1.1000",),
        patch=_hang(_losses(1.1)), name="the solution"),
    Row(None, False, "work/hang_exercise.py", shows=("got NoneType",)),
    Row(E.HANG_STARTER, False, "it still hangs", shows=("Timed out waiting 8000ms",),
        patch=_hang(error=TIMED_OUT), name="the starter"),
    Row(E.HANG_STARTER, False, "it still hangs", patch=_hang(error="timed out after 90 s"),
        name="the launch timed out"),
    Row(E.HANG_STARTER, False, "your script failed under torchrun", shows=("NameError",),
        patch=_hang(error="NameError: name 'rank' is not defined"), name="a crash"),
    Row(E.HANG_STARTER, False, "block as the starter has it", patch=_hang([]), name="no report"),
    Row(E.HANG_STARTER, False, "rank 0 logs its own loss", patch=_hang(_losses(1.2)), name="all_reduce removed"),
    Row(E.HANG_STARTER, False, "the sum of the 2 ranks' losses", patch=_hang(_losses(2.2)), name="not divided"),
    Row(E.HANG_STARTER, False, "the mean of the ranks' losses is", patch=_hang(_losses(0.3)), name="something else"),
]

CODE_ROWS = {"02-3": ROWS_02_3, "03-3": ROWS_03_3, "04-3": ROWS_04_3, "05-3": ROWS_05_3, "06-1": ROWS_06_1,
             "08-3": ROWS_08_3}
