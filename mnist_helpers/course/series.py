"""The series registry: one row per notebook, the one place that lists them.

Each row names the notebook (its two-digit id and slug: ``notebooks/NN_slug.ipynb``), its lesson module
(``mnist_helpers/lessons/nNN/``), whether it is on the core path (00 to 09, in order) or an appendix, what a
learner learns there, and its measured runtimes (the quick profile, the full profile on a 2-core CPU, one GPU), each
naming the machine it was measured on (the README's legend: **EPYC**, **Xeon**). ``scripts/make_tables.py``
(`make tables`) writes the README's notebook table and the instructor guide's runtime table from it; tests check
that every notebook, lesson, exercise, claim and reference file belongs to a registered notebook.
Adding a notebook: docs/MAINTAINING.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

NOT_MEASURED = "not measured yet"


@dataclass(frozen=True)
class Notebook:
    nn: str           # "00" .. : the order, the prefix of its claims ("NN.slug") and exercises ("NN-k")
    slug: str         # notebooks/<nn>_<slug>.ipynb, results/<nn>_<slug>.json
    title: str        # a few words, for the instructor guide
    lesson: str       # mnist_helpers/lessons/<lesson>/: nNN, the notebook's lesson package
    core: bool        # on the core path (True) or an appendix to open when needed
    learn: str        # what a learner writes and sees there (the README's table)
    quick: str        # measured runtime in the quick profile, with its machine where not the README's default
    full: str         # measured runtime in the full profile on a 2-core CPU, with its machine
    gpu: str = NOT_MEASURED  # measured runtime on one GPU, naming the GPU

    @property
    def name(self) -> str:
        """``NN_slug``: the notebook's file name without .ipynb, its result file's name."""
        return f"{self.nn}_{self.slug}"

    @property
    def path(self) -> Path:
        return Path(__file__).resolve().parents[2] / "notebooks" / f"{self.name}.ipynb"

    @property
    def module(self) -> str:
        return f"mnist_helpers.lessons.{self.lesson}.lesson"


NOTEBOOKS: tuple[Notebook, ...] = (
    Notebook(
        "00", "setup_and_data", 'setup and data', "n00", core=True,
        learn=('environment check, offline verified MNIST, the quick profile, a 1- and 2-process torchrun launch '
               'from a cell'),
        quick='22-46 s',
        full=('39-57 s (quiet, EPYC)'),
        gpu='not measured yet'),
    Notebook(
        "01", "resource_inspection", 'resource inspection', "n01", core=True,
        learn=('the readings you type (`os.cpu_count()`, psutil, `torch.get_num_threads()`, '
               "`torch.cuda.mem_get_info`) and the article's shell commands (`nvidia-smi`/`lscpu`/`free -h`); the 2x"
               " claim tested with thread settings users end up with (torchrun's `OMP_NUM_THREADS=1`, torch's "
               "default, 2x the cores) with the load recorded per timing; a training step's measured memory; "
               '`recommend_config()` with a reason per setting'),
        quick='18-38 s',
        full=('79-103 s (quiet, EPYC)'),
        gpu='not measured yet'),
    Notebook(
        "02", "single_device_baseline", 'single-device baseline', "n02", core=True,
        learn=("the article's 5.1 script written out (`DataLoader(num_workers=4, pin_memory=True)`, `Net`, Adam, the"
               ' loop with `loss.backward()`/`optimizer.step()`), each deviation named; the same through `fit()`, '
               'shown to give the same weights; live curves, confusion matrix, misclassified digits, the experiment '
               'log'),
        quick='40-61 s',
        full=("4.3-6.6 min (quiet, EPYC; the article's 5 epochs with its 4-worker loader)"),
        gpu='not measured yet'),
    Notebook(
        "03", "dataloader_tuning", 'DataLoader tuning', "n03", core=True,
        learn=('the `DataLoader(...)` call and in-memory batches written in cells; `num_workers`, `pin_memory`, '
               '`prefetch_factor`, `persistent_workers` swept with interleaved repeats; the data-wait fraction; '
               'per-worker USS/PSS (fork vs spawn); what in-memory buys (per-sample work, not disk reads); '
               '`drop_last`; a widget to re-run the sweep'),
        quick='25-55 s',
        full=('73-148 s (quiet, EPYC; 148 s with the drop_last test on 60,000 images)'),
        gpu='not measured yet'),
    Notebook(
        "04", "batch_size_and_lr", 'batch size and LR', "n04", core=True,
        learn=('the LR rules (fixed, linear, sqrt), the warm-up and one training run written out (`#@save`); a '
               'reduced live sweep beside the full one (`scripts/bench_batch_scaling.py`: doublings 128 to 4096 on '
               "all 60,000 images, 10 epochs, a one-epoch warm-up, seeds appended); batch 8's step noise apart from "
               'its accuracy'),
        quick='7-13 s',
        full=("24-50 s (quiet, EPYC; 50 s AVX2-only; the reduced sweep, beside the full one's reference); the full sweep, "
              "`scripts/bench_batch_scaling.py` (3 seeds, 2 at a time): 5.8 min (EPYC, others' CPU share 16%)"),
        gpu='not measured yet'),
    Notebook(
        "05", "mixed_precision_and_memory", 'mixed precision and memory', "n05", core=True,
        learn=('`torch.amp` autocast + `GradScaler` (bf16; fp16, underflow and skipped steps), gradient accumulation'
               ' and DDP `no_sync` written out; `channels_last`; peak memory on CPU and GPU split into persistent '
               'and transient; the CUDA caching allocator; the loss kept as a tensor, in a training loop and in an '
               'eval loop; the same precision comparison on an H200 (the kept `scripts/device_check.sh` run)'),
        quick='29-86 s',
        full=('2.5 min (quiet, Xeon); 58-101 s (quiet, EPYC)'),
        gpu='not measured yet'),
    Notebook(
        "06", "ddp_fundamentals", 'DDP fundamentals', "n06", core=True,
        learn=('you write `train_single.py`, turn it into `train_ddp.py` in a cell (`init_process_group`, '
               '`DistributedSampler`, `DDP(...)`, `set_epoch`, exact evaluation, a rank-0 checkpoint; every change marked; '
               "a world of one under plain python) and launch it with torchrun from the next cell, then edit and relaunch it; all-reduce by hand vs DDP's hooks; a "
               'fork launcher as on Kaggle/Colab (spawn from a file on macOS), the CUDA-before-fork error and the call that '
               'caused it (`is_available()` included); the article\'s other DDP details: the appendix, 12'),
        quick='34-64 s (EPYC with AVX-512, 2026-12-07, other jobs beside it: load average 2-9)',
        full=('4.0 min (EPYC with AVX-512, 2026-12-07, not quiet: load average 2.5-6.7)'),
        gpu='not measured yet'),
    Notebook(
        "07", "scaling_and_multinode", 'scaling and multi-node', "n07", core=True,
        learn=("the article's 2-vs-1 comparison in its own configuration (1x128 vs 2x64, its DataLoader) and weak "
               'scaling apart; the share of a step spent communicating; AllReduce at N=2-4 against the ring model '
               '(per rank flat, total linear); DDP bucket size and compression hooks; DDP memory and '
               '`gradient_as_bucket_view`; two torchrun agents at a c10d rendezvous; you extend your `train_ddp.py` into '
               '`train_ft.py` (atomic rank-0 snapshot, resume with `map_location` at the sampler position), kill a rank '
               'under `--max-restarts` and match the uninterrupted digest; the series\' `ft_train` beside it; '
               "a scheduler's stop that loses no step (`--stop-file`), restart success rates, elastic "
               'membership; Slurm sbatch, Kubeflow TrainJob and PyTorchJob'),
        quick='115-247 s',
        full=('9.6-13.7 min (EPYC; the longest with tests beside it)'),
        gpu='not measured yet'),
    Notebook(
        "08", "troubleshooting", 'troubleshooting', "n08", core=True,
        learn=('`python -m mnist_helpers.course.doctor`; 15 problems reproduced for real (port in use, gloo interface and '
               'debug variables: DETAIL vs INFO, unused parameters, collective hang, evaluating on rank 0 through '
               "the DDP wrapper, torchrun's `OMP_NUM_THREADS=1`, out of memory and a batch-size finder, `set_epoch`,"
               ' padding, download race, CUDA fork, `mp.spawn` and `__main__`, loader starvation and `/dev/shm`, '
               '`--local_rank`), diagnosed and fixed'),
        quick='2.0-4.1 min',
        full=('125-191 s (quiet, 2-core EPYC); 3.6 min (quiet, Xeon)'),
        gpu='not measured yet'),
    Notebook(
        "09", "profiling_and_autotune", 'profiling and autotune', "n09", core=True,
        learn=('`torch.profiler` written out (schedule, `record_function`, `prof.step()`; trace, top operators, data'
               ' / compute / communication, a 2-process profile); `torch.utils.benchmark.Timer` comparisons with '
               "median and IQR; `autotune()` under a time budget with its search loop shown; the article's tuning "
               'priority measured as time to 97% (its baseline and each lever alone, 3 seeds interleaved); the '
               'experience library'),
        quick='102-148 s',
        full=('5.7-9.1 min (quiet, 2-core EPYC); 17.3 min (quiet, Xeon)'),
        gpu='not measured yet'),
    Notebook(
        "10", "speedrun", 'speedrun', "n10", core=False,
        learn=("the field's speedrun protocol: schedules fixed in advance, the test set scored once at the end, the "
               'mean final accuracy over seeds, training time only (compilation and evaluation apart); the '
               'first-crossing reading of the same runs beside it, and why it is optimistic; the chain from the '
               "article's recipe to the fastest (in-memory tensors, OneCycle, a smaller net, pooling before "
               'BatchNorm, a strided first layer, batch 64, test-time shifts, bf16 + `channels_last`, '
               "`torch.compile`, CUDA graphs), each step's resource level; the recipe in one `hyp` cell and the "
               "99.5% ladder (wider, longer, shifted images); which of bf16, `channels_last` and `torch.compile` "
               "pays on *your* CPU, measured and chosen (`speedrun.choose_settings`); FLOPs per image against this "
               "machine's measured peak; the 10-seed benchmark `scripts/bench_speedrun.py` with the article's "
               'recipe in the same run, and the committed references'),
        quick='125 s (EPYC, with other jobs loading the machine)',
        full=('8.0 min (quiet, EPYC with AVX-512, 2026-12-07; `make full NB=10`); the 10-seed benchmark '
              '`scripts/bench_speedrun.py`: 24 min (quiet, EPYC), 21 of them the article\'s recipe (10 x 5 epochs)'),
        gpu='not measured yet'),
    Notebook(
        "11", "beyond_data_parallel", 'beyond data parallel (ZeRO, FSDP2, checkpointing, DCP, TP)', "n11", core=False,
        learn=("beyond data parallel on a CPU (gloo): where each rank's memory goes (parameters, gradients, AdamW "
               'state, activations) measured next to an estimate you write, with a widget; activation '
               "checkpointing's memory/time trade-off; ZeRO-1 (`ZeroRedundancyOptimizer`) and FSDP2 (`fully_shard`, "
               'ZeRO-2-like and ZeRO-3) vs DDP at 1, 2 and 4 ranks, equal to one process; DCP checkpoints saved by 2'
               ' ranks, loaded into 1 and 4; tensor parallel with DTensor and the 2-D mesh; '
               '`torch.compile(DDP(model))`; pipelining under a timeout'),
        quick='36-80 s',
        full=('3.3-5.4 min (quiet, EPYC; 5.4 min AVX2-only)'),
        gpu='not measured yet'),
    Notebook(
        "12", "ddp_in_depth", 'DDP in depth (the appendix to 06)', "n12", core=False,
        learn=("the article's other DDP details, each run: its `--local_rank` argument under torchrun and what "
               'torchrun sets instead; `DistributedSampler` and `set_epoch` over all 60,000 images with 2 and 3 '
               'processes; seeding (DDP equalises the weights, one seed repeats the augmentation); SyncBatchNorm vs '
               'BatchNorm against one process; validation three ways, counted and timed; what `init_process_group` '
               "needs, NCCL vs gloo; DP vs DDP (2+ GPUs); the series' DDP worker started with `mp.spawn` and torchrun;"
               " the article's 5.2 script as written; `mp.spawn` of a notebook function"),
        quick='66-102 s (EPYC with AVX-512, 2026-12-07, other jobs beside it: load average 2-6)',
        full=('3.5 min (EPYC with AVX-512, 2026-12-07, not quiet: load average 6.7-9.3)'),
        gpu='not measured yet'),
)
BY_ID = {nb.nn: nb for nb in NOTEBOOKS}
BY_NAME = {nb.name: nb for nb in NOTEBOOKS}


def notebook(nn: str) -> Notebook:
    """The registered notebook ``nn`` ("00", "07" ...); a clear error for an unknown id."""
    try:
        return BY_ID[nn]
    except KeyError:
        raise KeyError(f"no notebook {nn!r} in mnist_helpers.course.series.NOTEBOOKS; registered: {', '.join(BY_ID)}") from None
